"""Posts outlive a channel outage (issue 40): a post still failing on its last Service Bus
delivery is kept in the deliveries table (Azurite), not dead-lettered, and sent once the
channel is back, while it still matters, saying how late it is. Real local receivers; the
stand-in topic delivers as Service Bus does, with the Bicep's maxDeliveryCount."""

from __future__ import annotations

import re
import uuid
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
import requests

from functions.model.event import Notification, Transition
from functions.notify import dispatch, kept
from functions.notify.delivery import RetryPolicy, Transport
from functions.notify.settings import ChannelSettings
from functions.store.deliveries import DeliveryLedger, KeptPost
from local.bus import LocalQueue
from local.subscription import Subscription as LocalSubscription
from tests.functions.conftest import FakeClock
from tests.notify.factory import decision, event, note
from tests.notify.fakebus import Message, Topic
from tests.notify.receiver import Answer, Receiver, running

ROOT = Path(__file__).resolve().parents[2]
KEY = "0123456789abcdef0123456789abcdef"


@pytest.fixture
def ledger(azurite: str) -> DeliveryLedger:
    return DeliveryLedger.from_connection_string(
        azurite, "k" + uuid.uuid4().hex[:12]
    ).ensure_table()


def bicep_default(path: Path) -> int:
    found = re.search(r"^param maxDeliveryCount int = (\d+)$", path.read_text(), re.M)
    assert found, f"{path} has no maxDeliveryCount default"
    return int(found.group(1))


def test_every_delivery_count_is_azures() -> None:
    """The app keeps a post on the delivery Service Bus would dead-letter it after, and the
    demo's stand-in subscription gives as many (2cd3d60's gave 3, so a 4-minute channel
    outage dead-lettered a post in the demo, not on Azure)."""
    deployed = bicep_default(ROOT / "infra" / "main.bicep")
    assert deployed == bicep_default(ROOT / "infra" / "modules" / "servicebus.bicep")
    assert kept.MAX_DELIVERY_COUNT == deployed == 10
    local = LocalSubscription("teams", lambda note: None)
    assert local.max_delivery_count == deployed
    # The demo's `terminate` subscription (local/drain_worker.py) and the work queue.
    assert LocalQueue("terminate").max_delivery_count == deployed


def transport(clock: FakeClock) -> Transport:
    policy = RetryPolicy(attempts=2, backoff_seconds=0.001, max_wait_seconds=0.01)
    return Transport(requests.Session(), policy, sleep=clock.sleep, clock=clock.now)


def pump(topic: Topic, settings: ChannelSettings, sender: Transport, ledger: DeliveryLedger):
    for name, subscription in topic.subscriptions.items():

        def handle(message: Message, channel: str = name) -> None:
            dispatch.deliver(
                channel,
                message.body,
                settings=settings,
                transport=sender,
                ledger=ledger,
                delivery_count=message.delivery_count,
            )

        subscription.pump(handle)


def publish(topic: Topic, *notes: Notification) -> None:
    for one in notes:
        topic.send(one.message_id(), one.to_json().encode())


def test_a_post_outliving_its_deliveries_is_kept_and_sent_late_when_teams_is_back(
    ledger: DeliveryLedger,
) -> None:
    clock = FakeClock()
    sender = transport(clock)
    started = note(Transition.STARTED, event("EV-K"), decision(), occurred_at=clock.now())
    with running(Answer(503)) as teams:
        settings = ChannelSettings(teams_webhook_url=f"{teams.url}/wf")
        topic = Topic({"teams": kept.MAX_DELIVERY_COUNT})
        publish(topic, started)
        pump(topic, settings, sender, ledger)
        subscription = topic.subscriptions["teams"]
        # On 2cd3d60: dead-lettered after its 10th delivery, never posted.
        assert subscription.dead_letters == []
        assert [m.delivery_count for m in subscription.completed] == [kept.MAX_DELIVERY_COUNT]
        row = ledger.get(started.message_id(), "teams")
        assert row is not None and row.status == "kept" and "HTTP 503" in row.detail
        (post,) = ledger.kept("teams")
        # Still down two minutes later: still kept.
        clock.advance(120)
        report = dispatch.resend_kept("teams", settings=settings, transport=sender, ledger=ledger)
        assert report.sent == [] and report.waiting == 1
        tried = len(teams.requests)
        # Back two hours after it happened: sent once, saying how late.
        teams.default = Answer(202)
        clock.advance(7080)
        report = dispatch.resend_kept("teams", settings=settings, transport=sender, ledger=ledger)
        again = dispatch.resend_kept("teams", settings=settings, transport=sender, ledger=ledger)
        assert len(teams.requests) == tried + 1
    assert report.sent == [started.message_id()] and again.sent == []
    card = teams.requests[-1].json()["attachments"][0]["content"]
    late = card["body"][1]
    assert late["text"].startswith("Late: sent 2 h after it happened: the channel could not")
    assert "HTTP 503" in late["text"] and late["color"] == "Warning"
    row = ledger.get(started.message_id(), "teams")
    assert row is not None and row.status == "posted" and row.detail.startswith("sent 2 h")
    assert ledger.kept("teams") == []
    assert post.message_id == started.message_id()


@pytest.mark.parametrize(
    ("transition", "hours", "sent"),
    [
        (Transition.APPROVED, 0.5, True),
        (Transition.APPROVED, 24, False),  # an `approved` a day later tells nobody anything
        (Transition.STARTED, 23, True),  # a `started` after the end is still worth a line
        (Transition.COMPLETED, 25, False),
        (Transition.UNDRAIN_FAILED, 20, True),  # someone must still put the VM back
    ],
)
def test_a_kept_post_is_sent_while_it_still_matters(
    ledger: DeliveryLedger, transition: Transition, hours: float, sent: bool
) -> None:
    clock = FakeClock()
    sender = transport(clock)
    late = note(transition, event("EV-F"), decision(), occurred_at=clock.now())
    with running(Answer(503)) as hook:
        settings = ChannelSettings(
            webhook_url=f"{hook.url}/bridge", webhook_secret="webhook-secret-0123456789"
        )
        topic = Topic({"webhook": kept.MAX_DELIVERY_COUNT})
        publish(topic, late)
        pump(topic, settings, sender, ledger)
        assert len(ledger.kept("webhook")) == 1
        hook.default = Answer(204)
        clock.advance(hours * 3600)
        before = len(hook.requests)
        report = dispatch.resend_kept("webhook", settings=settings, transport=sender, ledger=ledger)
        posted = hook.requests[before:]
    assert (len(posted) == 1) is sent
    row = ledger.get(late.message_id(), "webhook")
    assert row is not None and ledger.kept("webhook") == []
    if sent:
        data = posted[0].json()["data"]
        assert data["late"].startswith("sent ") and data["transition"] == transition.value
        assert row.status == "posted"
    else:
        assert report.dropped and row.status == "rejected"
        assert "past what a" in row.detail and "is worth" in row.detail


def pagerduty_settings(receiver: Receiver) -> ChannelSettings:
    return ChannelSettings(
        pagerduty_routing_key=KEY, pagerduty_events_url=f"{receiver.url}/v2/enqueue"
    )


def test_a_page_and_its_resolve_kept_together_page_nobody(ledger: DeliveryLedger) -> None:
    """PagerDuty down through a drain failure and the event's end: once back, the kept
    trigger is not sent (nobody is paged for what is over), nor its resolve."""
    clock = FakeClock()
    sender = transport(clock)
    failed = note(Transition.DRAIN_FAILED, event("EV-P"), decision(), occurred_at=clock.now())
    with running(Answer(503)) as pd:
        settings = pagerduty_settings(pd)
        topic = Topic({"pagerduty": kept.MAX_DELIVERY_COUNT})
        publish(topic, failed)
        pump(topic, settings, sender, ledger)
        clock.advance(600)
        over = note(Transition.COMPLETED, event("EV-P"), decision(), occurred_at=clock.now())
        publish(topic, over)
        pump(topic, settings, sender, ledger)
        assert [p.message_id for p in ledger.kept("pagerduty")] == [
            failed.message_id(),
            over.message_id(),
        ]
        pd.default = Answer(202)
        before = len(pd.requests)
        report = dispatch.resend_kept(
            "pagerduty", settings=settings, transport=sender, ledger=ledger
        )
        assert pd.requests[before:] == []
    assert [why for _, why in report.dropped] == [
        "not sent: resolved before PagerDuty was back (no page for what is over)",
        "not sent: its trigger was never sent, so nothing to resolve",
    ]
    assert not ledger.marked(kept.KEPT_MARK + "event:EV-P")


def test_a_resolve_waits_behind_its_kept_trigger(ledger: DeliveryLedger) -> None:
    """The trigger was kept; PagerDuty is back when the resolve comes. Sent at once, the
    resolve would go before its trigger and the kept trigger would then open an incident
    nothing resolves: it is kept behind the trigger instead, and both are dropped."""
    clock = FakeClock()
    sender = transport(clock)
    failed = note(Transition.DRAIN_FAILED, event("EV-R"), decision(), occurred_at=clock.now())
    over = note(Transition.CANCELLED, event("EV-R"), decision(), occurred_at=clock.now())
    with running(Answer(503)) as pd:
        settings = pagerduty_settings(pd)
        topic = Topic({"pagerduty": kept.MAX_DELIVERY_COUNT})
        publish(topic, failed)
        pump(topic, settings, sender, ledger)
        pd.default = Answer(202)
        before = len(pd.requests)
        publish(topic, over)
        pump(topic, settings, sender, ledger)  # first delivery, PagerDuty answering
        assert pd.requests[before:] == []
        row = ledger.get(over.message_id(), "pagerduty")
        assert row is not None and row.status == "kept" and "behind an earlier" in row.detail
        dispatch.resend_kept("pagerduty", settings=settings, transport=sender, ledger=ledger)
        assert pd.requests[before:] == []
    assert ledger.kept("pagerduty") == []


def test_a_resolve_of_a_posted_page_is_sent_late(ledger: DeliveryLedger) -> None:
    clock = FakeClock()
    sender = transport(clock)
    failed = note(Transition.DRAIN_FAILED, event("EV-S"), decision(), occurred_at=clock.now())
    over = note(Transition.COMPLETED, event("EV-S"), decision(), occurred_at=clock.now())
    with running(Answer(202)) as pd:
        settings = pagerduty_settings(pd)
        topic = Topic({"pagerduty": kept.MAX_DELIVERY_COUNT})
        publish(topic, failed)
        pump(topic, settings, sender, ledger)  # paged
        pd.default = Answer(503)
        publish(topic, over)
        pump(topic, settings, sender, ledger)
        assert [p.message_id for p in ledger.kept("pagerduty")] == [over.message_id()]
        pd.default = Answer(202)
        clock.advance(1800)
        report = dispatch.resend_kept(
            "pagerduty", settings=settings, transport=sender, ledger=ledger
        )
        bodies = [r.json() for r in pd.requests if r.json().get("event_action") == "resolve"]
    assert report.sent == [over.message_id()]
    assert [b["dedup_key"] for b in bodies[-1:]] == ["event:EV-S"]


def test_a_post_too_large_as_it_stands_is_kept_cut_to_fit(ledger: DeliveryLedger) -> None:
    """Issue 46: a post larger than a kept row was dead-lettered; it is kept, cut to fit."""
    clock = FakeClock()
    sender = transport(clock)
    huge = note(
        Transition.STARTED, event("EV-L"), decision(), occurred_at=clock.now(), detail="x" * 40_000
    )
    with running(Answer(503)) as teams:
        settings = ChannelSettings(teams_webhook_url=f"{teams.url}/wf")
        topic = Topic({"teams": kept.MAX_DELIVERY_COUNT})
        publish(topic, huge)
        pump(topic, settings, sender, ledger)
    assert topic.subscriptions["teams"].dead_letters == []
    (post,) = ledger.kept("teams")
    detail = Notification.from_json(post.body).detail
    assert detail == "x" * (kept.KEPT_TEXT - 1) + "…"


def test_a_post_that_cannot_be_kept_is_dead_lettered_as_before(
    ledger: DeliveryLedger, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = FakeClock()
    sender = transport(clock)
    started = note(Transition.STARTED, event("EV-L"), decision(), occurred_at=clock.now())
    monkeypatch.setattr(ledger, "keep", lambda post: False)  # as a row too large would be
    with running(Answer(503)) as teams:
        settings = ChannelSettings(teams_webhook_url=f"{teams.url}/wf")
        topic = Topic({"teams": kept.MAX_DELIVERY_COUNT})
        publish(topic, started)
        pump(topic, settings, sender, ledger)
    (dead,) = topic.subscriptions["teams"].dead_letters
    assert dead.dead_letter_reason == "MaxDeliveryCountExceeded"
    assert ledger.kept("teams") == []
    assert ledger.get(started.message_id(), "teams") is None  # released: no claim left behind


def test_duration_words() -> None:
    words = kept.duration_words
    assert [words(timedelta(seconds=s)) for s in (45, 720, 7500, 7200, 97_200)] == [
        "45 s",
        "12 min",
        "2 h 5 min",
        "2 h",
        "1 d 3 h",
    ]


class _KeptAfterARead(DeliveryLedger):
    """The deliveries table, where `later` is kept right after the first read of Teams'
    kept posts: its last delivery failing as the channel comes back, during a pass."""

    later: KeptPost | None = None

    def kept(self, channel: str) -> list[KeptPost]:
        posts = super().kept(channel)
        if channel == "teams" and self.later is not None:
            later, self.later = self.later, None
            self.keep(later)
        return posts


def test_the_demos_kept_worker_records_a_post_kept_during_its_pass(azurite: str) -> None:
    """Issue 46: the demo's kept worker (local/kept_worker.py) read the kept posts, then
    resend read them again; a post kept between the two reads was sent, then looked up in
    the first read: a KeyError that ended the worker's thread, so that post was never
    recorded and every later kept post never sent. It records what resend read."""
    from local.kept_worker import KeptWorker
    from local.report import Timeline

    ledger = _KeptAfterARead.from_connection_string(
        azurite, "k" + uuid.uuid4().hex[:12]
    ).ensure_table()
    clock = FakeClock()
    sender = transport(clock)
    decided = note(Transition.DECIDED, event("EV-R"), decision(), occurred_at=clock.now())
    started = note(Transition.STARTED, event("EV-R"), decision(), occurred_at=clock.now())
    kept.keep(ledger, kept.kept_post("teams", decided, "HTTP 503", clock.now()))
    ledger.later = kept.kept_post("teams", started, "HTTP 503", clock.now())
    recorded: list[tuple[str, str, bool]] = []
    demo = cast(Any, SimpleNamespace(timeline=Timeline(stream=None)))
    with running(Answer(202)) as teams:
        settings = ChannelSettings(teams_webhook_url=f"{teams.url}/wf")
        worker = KeptWorker(
            demo,
            ledger,
            settings,
            sender,
            every=3600,
            record=lambda channel, n, posted, error: recorded.append(
                (channel, n.transition.value, posted)
            ),
        )
        worker.channels.append("teams")
        worker.pass_once()  # before: KeyError for `started`, kept during the pass
        worker.pass_once()
        assert worker.unsent() == 0
    assert sorted(recorded) == [("teams", "decided", True), ("teams", "started", True)]
    assert len(teams.requests) == 2
