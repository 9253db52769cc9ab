"""The whole fan-out: a topic (duplicate detection, one copy per subscription, redelivery,
DLQ) feeding each channel's handler, with real local receivers for Teams, PagerDuty and a
webhook. Fleet-wide "once" comes from MessageId = EventId:transition."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta

import azure.functions as func
import pytest
import requests

from functions.model.event import Notification, Transition
from functions.notify import dispatch
from functions.notify.delivery import RetryPolicy, Transport
from functions.notify.settings import ChannelSettings, channel_settings
from functions.pipeline.relay_recovery import recovery_note
from functions.store.deliveries import DeliveryLedger
from functions.triggers import notify as blueprint
from local.slack_receiver import SlackReceiver
from tests.notify.factory import NOW, decision, event, note
from tests.notify.fakebus import Message, Topic
from tests.notify.receiver import Answer, Receiver, running

MAX_DELIVERY = 5


@dataclass
class Fleet:
    teams: Receiver
    pagerduty: Receiver
    webhook: Receiver
    slack: SlackReceiver
    settings: ChannelSettings
    topic: Topic
    transport: Transport
    ledger: DeliveryLedger

    def publish(self, *notes: Notification) -> None:
        for item in notes:
            self.topic.send(item.message_id(), item.to_json().encode())

    def pump(self) -> None:
        for name, subscription in self.topic.subscriptions.items():

            def handle(message: Message, channel: str = name) -> None:
                dispatch.deliver(
                    channel,
                    message.body,
                    settings=self.settings,
                    transport=self.transport,
                    ledger=self.ledger,
                    message_id=message.message_id,
                )

            subscription.pump(handle)

    def actions(self) -> list[tuple[str, str]]:
        return [(body["event_action"], body["dedup_key"]) for body in self.pagerduty.bodies()]

    def card_titles(self) -> list[str]:
        return [
            re.sub(r"\\(.)", r"\1", body["attachments"][0]["content"]["body"][0]["text"])
            for body in self.teams.bodies()
        ]


@pytest.fixture
def ledger(azurite: str) -> DeliveryLedger:
    prefix = "d" + uuid.uuid4().hex[:12]
    return DeliveryLedger.from_connection_string(azurite, prefix).ensure_table()


@pytest.fixture
def fleet(ledger: DeliveryLedger) -> Iterator[Fleet]:
    with (
        running(Answer(202, {"status": "accepted"})) as teams,
        running(Answer(202, {"status": "success", "message": "Event processed"})) as pd,
        running(Answer(204)) as hook,
        SlackReceiver() as slack,
    ):
        settings = ChannelSettings(
            teams_webhook_url=f"{teams.url}/workflows/abc",
            pagerduty_routing_key="R0UT1NGKEY0123456789012345678901",
            pagerduty_events_url=f"{pd.url}/v2/enqueue",
            webhook_url=f"{hook.url}/bridge",
            webhook_secret="webhook-secret-0123456789",
            slack_webhook_url=slack.url,
        )
        yield Fleet(
            teams,
            pd,
            hook,
            slack,  # type: ignore[arg-type]
            settings,
            Topic({name: MAX_DELIVERY for name in dispatch.CHANNELS}),
            Transport(
                session=requests.Session(),
                policy=RetryPolicy(attempts=3, backoff_seconds=0.001, max_wait_seconds=0.01),
                sleep=lambda _seconds: None,
            ),
            ledger,
        )


def lifecycle(event_id: str, page: bool, end: Transition) -> list[Notification]:
    snapshot = event(event_id)
    choice = decision(page=page)
    return [
        note(Transition.SCHEDULED, snapshot),
        note(Transition.DECIDED, snapshot, choice),
        note(Transition.APPROVED, snapshot, choice),
        note(Transition.STARTED, snapshot, choice),
        note(end, snapshot, choice),
    ]


def test_one_card_and_one_page_per_event_fleet_wide(fleet: Fleet) -> None:
    paged = lifecycle("EV-A", page=True, end=Transition.COMPLETED)
    quiet = lifecycle("EV-B", page=False, end=Transition.CANCELLED)
    # Three VMs report each event; ingest (or a redelivered ingest) republishes each transition.
    for _vm in range(3):
        fleet.publish(*paged, *quiet)
    fleet.pump()

    titles = fleet.card_titles()
    assert titles.count("Reboot scheduled: 2 VMs in scale set web") == 2  # one full card each
    assert len(titles) == 8  # + approved, started, completed/cancelled follow-ups per event
    assert sum("approved" in title for title in titles) == 2
    assert sum("cancelled" in title for title in titles) == 1
    # EV-B never paged: PagerDuty gets no resolve for it (issue 38).
    assert fleet.actions() == [("trigger", "event:EV-A"), ("resolve", "event:EV-A")]
    assert len(fleet.webhook.requests) == 10  # every transition, once
    # Slack by Teams' rules: the same eight posts, each once, in Block Kit.
    slack_headers = [r.body["blocks"][0]["text"]["text"] for r in fleet.slack.received]
    assert sorted(slack_headers) == sorted(titles)
    assert all(r.status == 200 for r in fleet.slack.received)
    assert len(fleet.topic.dropped) == 20
    for subscription in fleet.topic.subscriptions.values():
        assert subscription.dead_letters == []


def test_a_flaky_receiver_gets_each_message_once(fleet: Fleet) -> None:
    # Five failures outlast one invocation's three attempts: Service Bus redelivers once.
    fleet.pagerduty.script = [
        Answer(429, {"status": "throttle"}, {"Retry-After": "1"}),
        Answer(500),
        Answer(503),
        Answer(429, {"status": "throttle"}),
        Answer(502),
    ]
    fleet.teams.script = [Answer(500), Answer(429)]
    fleet.publish(*lifecycle("EV-C", page=True, end=Transition.COMPLETED))
    fleet.pump()

    accepted = [
        body
        for body, record in zip(fleet.pagerduty.bodies(), fleet.pagerduty.requests, strict=True)
    ][5:]
    assert [(b["event_action"], b["dedup_key"]) for b in accepted] == [
        ("trigger", "event:EV-C"),
        ("resolve", "event:EV-C"),
    ]
    trigger = fleet.topic.subscriptions["pagerduty"].completed[1]
    assert trigger.delivery_count == 2
    assert len(fleet.card_titles()) == 2 + 4  # two failed posts, then one card per transition
    assert fleet.topic.subscriptions["teams"].completed[1].delivery_count == 1
    for subscription in fleet.topic.subscriptions.values():
        assert subscription.dead_letters == []


def test_a_pagerduty_400_is_recorded_at_once_and_others_carry_on(
    fleet: Fleet, caplog: pytest.LogCaptureFixture
) -> None:
    reason = "Length of 'routing_key' is incorrect (should be 32 characters)"
    error = {"status": "invalid event", "message": "Event object is invalid", "errors": [reason]}
    fleet.pagerduty.default = Answer(400, error)
    fleet.publish(*lifecycle("EV-D", page=True, end=Transition.COMPLETED))
    fleet.pump()

    pd = fleet.topic.subscriptions["pagerduty"]
    # Completed on the first delivery, not retried until maxDeliveryCount: asked once each.
    assert pd.dead_letters == []
    assert [
        (m.message_id, m.delivery_count)
        for m in pd.completed
        if m.message_id in ("event:EV-D:decided", "event:EV-D:completed")
    ] == [("event:EV-D:decided", 1), ("event:EV-D:completed", 1)]
    assert len(fleet.pagerduty.requests) == 2
    for message_id in ("event:EV-D:decided", "event:EV-D:completed"):
        row = fleet.ledger.get(message_id, "pagerduty")
        assert row.status == "rejected" and reason in row.detail
        assert row.detail.startswith("HTTP 400")
    assert "Length of 'routing_key' is incorrect" in caplog.text
    # The other channels posted as usual, and say so in the same table.
    assert len(fleet.card_titles()) == 4
    assert len(fleet.webhook.requests) == 5
    assert fleet.ledger.rows("event:EV-D:decided").keys() == {
        "teams",
        "pagerduty",
        "webhook",
        "slack",
    }
    assert fleet.ledger.get("event:EV-D:decided", "teams").status == "posted"
    # A redelivery of the rejected message (say, replayed by hand) does not ask again.
    fleet.topic.seen.clear()
    fleet.publish(lifecycle("EV-D", page=True, end=Transition.COMPLETED)[1])
    fleet.pump()
    assert len(fleet.pagerduty.requests) == 2 and len(fleet.card_titles()) == 4


def test_a_broken_message_is_recorded_everywhere_and_completed(fleet: Fleet) -> None:
    fleet.topic.send("junk:1", b'{"transition": "exploded"}')
    fleet.pump()
    for subscription in fleet.topic.subscriptions.values():
        assert subscription.dead_letters == []
        assert [m.message_id for m in subscription.completed] == ["junk:1"]
    rows = fleet.ledger.rows("junk:1")
    assert rows.keys() == set(dispatch.CHANNELS)
    assert all(r.status == "rejected" and "not a notification" in r.detail for r in rows.values())
    assert not fleet.teams.requests and not fleet.pagerduty.requests


def test_rules_can_keep_an_event_off_a_channel(fleet: Fleet) -> None:
    snapshot = event("EV-E")
    fleet.publish(note(Transition.DECIDED, snapshot, decision(channels=("webhook",))))
    fleet.pump()
    assert not fleet.teams.requests and not fleet.pagerduty.requests
    assert len(fleet.webhook.requests) == 1


def test_a_channel_without_settings_is_off(fleet: Fleet, caplog: pytest.LogCaptureFixture) -> None:
    fleet.settings = ChannelSettings(webhook_url="https://hooks.example/x")  # no secret
    fleet.publish(*lifecycle("EV-F", page=True, end=Transition.COMPLETED))
    fleet.pump()
    assert not fleet.teams.requests and not fleet.pagerduty.requests
    assert not fleet.webhook.requests
    assert "refusing to send unsigned" in caplog.text or "webhook" in dispatch._off_logged
    for subscription in fleet.topic.subscriptions.values():
        assert len(subscription.completed) == 5
    # Unset (Teams, PagerDuty) is off on purpose: nothing recorded. Half-set (a webhook URL
    # without its secret) is a mistake: each message it drops is recorded with the reason.
    rows = fleet.ledger.rows("event:EV-F:decided")
    assert rows.keys() == {"webhook"}
    assert rows["webhook"].status == "rejected"
    assert "WEBHOOK_SECRET is not" in rows["webhook"].detail


def test_the_azure_handlers_read_app_settings(
    fleet: Fleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TEAMS_WEBHOOK_URL", f"{fleet.teams.url}/wf")
    monkeypatch.setenv("PAGERDUTY_ROUTING_KEY", "R0UT1NGKEY0123456789012345678901")
    monkeypatch.setenv("PAGERDUTY_EVENTS_URL", f"{fleet.pagerduty.url}/v2/enqueue")
    monkeypatch.delenv("WEBHOOK_URL", raising=False)
    monkeypatch.setattr(blueprint, "ledger", lambda: fleet.ledger)
    channel_settings.cache_clear()
    try:
        item = note(Transition.DECIDED, event("EV-G"), decision())
        msg = func.ServiceBusMessage(body=item.to_json().encode())
        blueprint.notify_teams(msg)
        blueprint.notify_pagerduty(msg)
        blueprint.notify_webhook(msg)
    finally:
        channel_settings.cache_clear()
    assert fleet.teams.requests[0].path == "/wf"
    assert fleet.actions() == [("trigger", "event:EV-G")]
    assert not fleet.webhook.requests
    assert fleet.ledger.get("event:EV-G:decided", "teams").status == "posted"
    blueprint.notify_teams(msg)  # a redelivery: recorded as posted, not posted again
    assert len(fleet.teams.requests) == 1
    app = func.FunctionApp()
    app.register_functions(blueprint.bp)
    triggers = {fn.get_function_name(): fn.get_trigger() for fn in app.get_functions()}
    kept_timer = triggers.pop("notify_kept")  # sends posts kept through an outage
    assert kept_timer.schedule == blueprint.KEPT_SCHEDULE == "0 */2 * * * *"
    assert set(triggers) == {"notify_teams", "notify_pagerduty", "notify_webhook", "notify_slack"}
    for name, trigger in triggers.items():
        assert trigger.topic_name == "%NOTIFICATIONS_TOPIC%"
        assert trigger.subscription_name == name.removeprefix("notify_")
        assert trigger.connection == "ServiceBusConnection"


def test_with_the_announcers_own_notifications(fleet: Fleet) -> None:
    """Notifications as the announcer builds them (with its `page` flag per transition)."""
    from functions.model.policy import Policy
    from functions.pipeline.announce import build
    from functions.store.records import EventRecord

    snapshot = event("EV-P", event_type="Preempt")
    record = EventRecord(
        event_id="EV-P",
        event_type="Preempt",
        event_status="Scheduled",
        resources=list(snapshot.resources),
        not_before=snapshot.not_before,
        scale_sets=["web"],
        first_seen=snapshot.first_seen,
        reporters={"web_0": "Scheduled", "web_1": "Scheduled"},
        decision=decision(action="hold", rule="preempt", page=True, severity="critical"),
    )
    flow = [
        Transition.SCHEDULED,
        Transition.DECIDED,
        Transition.APPROVAL_FAILED,
        Transition.STARTED,
        Transition.COMPLETED,
    ]
    for _vm in range(2):
        fleet.publish(*(build(record, t, snapshot.first_seen, Policy()) for t in flow))
    fleet.pump()
    assert fleet.actions() == [
        ("trigger", "event:EV-P"),
        ("trigger", "event:EV-P"),
        ("resolve", "event:EV-P"),
    ]
    assert [b["payload"]["class"] for b in fleet.pagerduty.bodies()[:2]] == ["Preempt"] * 2
    titles = fleet.card_titles()
    assert titles[0] == "Spot eviction scheduled: 2 VMs in scale set web"
    assert len(titles) == 4  # decided card, approval failed, started, completed


def test_a_relay_silent_then_heard_again_pages_then_resolves(fleet: Fleet) -> None:
    last_seen = NOW - timedelta(minutes=11)
    silent = note(Transition.RELAY_SILENT, None, vm="web_3", occurrence="20261121T094900")
    silent = silent.model_copy(update={"page": True})
    recovered = recovery_note("web_3", last_seen.isoformat(), NOW + timedelta(minutes=2))
    for _republish in range(2):  # the watchdog republishing a claim left behind
        fleet.publish(silent, recovered)
    fleet.pump()

    assert recovered.message_id() == "vm:web_3:relay_recovered:20261121T094900"
    assert fleet.actions() == [("trigger", "relay-silent:web_3"), ("resolve", "relay-silent:web_3")]
    assert fleet.card_titles() == [
        "Relay on web_3 stopped reporting",
        "Relay on web_3 is reporting again",
    ]
    bodies = [b["data"] for b in fleet.webhook.bodies()]  # CloudEvents: the transition is data
    assert [(b["transition"], b["vm"], b["event"]) for b in bodies] == [
        ("relay_silent", "web_3", None),
        ("relay_recovered", "web_3", None),
    ]
    assert bodies[1]["page"] is False and "13 min of silence" in bodies[1]["detail"]
