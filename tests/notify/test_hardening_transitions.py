"""The transitions hardening added (undrained, undrain_failed, policy_valid, a decision
made again) on every channel: Teams card text, PagerDuty action, webhook body."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import requests

from functions.model.event import Notification, Transition
from functions.notify import dispatch, pagerduty, teams
from functions.notify.delivery import RetryPolicy, Transport
from functions.notify.settings import ChannelSettings
from tests.notify.factory import NOW, decision, event, note
from tests.notify.receiver import Answer, Receiver, running


@pytest.fixture
def channels() -> Iterator[tuple[ChannelSettings, Receiver, Receiver, Receiver]]:
    with running(Answer(202)) as t, running(Answer(202)) as pd, running(Answer(204)) as hook:
        yield (
            ChannelSettings(
                teams_webhook_url=f"{t.url}/wf",
                pagerduty_routing_key="R0UT1NGKEY0123456789012345678901",
                pagerduty_events_url=f"{pd.url}/v2/enqueue",
                webhook_url=f"{hook.url}/bridge",
                webhook_secret="webhook-secret-0123456789",
            ),
            t,
            pd,
            hook,
        )


def send_all(settings: ChannelSettings, *notes: Notification) -> None:
    sender = Transport(requests.Session(), RetryPolicy(attempts=1))
    for item in notes:
        for channel in dispatch.CHANNELS:
            dispatch.deliver(channel, item.to_json(), settings=settings, transport=sender)


def terminate(**fields: object) -> Notification:
    snapshot = event("EV-T", event_type="Terminate", resources=("web_3",))
    return note(fields.pop("transition"), snapshot, decision(action="drain"), **fields)


def test_undrain_outcomes_on_every_channel(channels) -> None:
    settings, t, pd, hook = channels
    ok = terminate(transition=Transition.UNDRAINED, detail="undrain hook answered 204")
    failed = terminate(
        transition=Transition.UNDRAIN_FAILED,
        detail="undrain:http: undrain hook refused: HTTP 400 — put the instance back by hand",
    )
    send_all(settings, ok, failed)
    cards = [b["attachments"][0]["content"]["body"][0] for b in t.bodies()]
    assert cards[0]["text"] == (
        "Scale-in: instance deleted over or cancelled after its drain: undrained, back in "
        "service: 1 VM in scale set web"
    )
    assert cards[0]["color"] == "Default"
    assert "undraining failed" in cards[1]["text"] and cards[1]["color"] == "Attention"
    actions = [(b["event_action"], b["dedup_key"]) for b in pd.bodies()]
    # No resolve for `undrained`: EV-T was never paged (issue 38).
    assert actions == [("trigger", "event:EV-T")]
    assert pd.bodies()[0]["payload"]["severity"] == "error"
    assert "by hand" in pd.bodies()[0]["payload"]["summary"]
    assert [b["data"]["transition"] for b in hook.bodies()] == ["undrained", "undrain_failed"]


def test_policy_valid_resolves_the_fleet_incident(channels) -> None:
    settings, t, pd, hook = channels
    broken = Notification(
        transition=Transition.POLICY_INVALID,
        occurred_at=NOW,
        detail="the policy does not validate",
        occurrence="20261121T100000",
        page=True,
    )
    fixed = Notification(
        transition=Transition.POLICY_VALID,
        occurred_at=NOW,
        detail="the policy validates again",
        occurrence="20261121T100000",
        page=False,
    )
    send_all(settings, broken, fixed)
    assert [(b["event_action"], b["dedup_key"]) for b in pd.bodies()] == [
        ("trigger", "policy_invalid:fleet"),
        ("resolve", "policy_invalid:fleet"),
    ]
    titles = [b["attachments"][0]["content"]["body"][0]["text"] for b in t.bodies()]
    assert titles[1] == "Approval policy is valid again: events are decided and approved"
    assert [(b["data"]["transition"], b["id"]) for b in hook.bodies()] == [
        ("policy_invalid", "fleet:policy_invalid:20261121T100000"),
        ("policy_valid", "fleet:policy_valid:20261121T100000"),
    ]


@pytest.mark.parametrize(("page", "action"), [(False, "resolve"), (True, "trigger")])
def test_a_redecided_event_resolves_its_fail_closed_page_unless_it_pages_anew(page, action):
    again = note(
        Transition.DECIDED, event("EV-R"), decision(page=page), occurrence="redecided-20261121T1001"
    )
    again = again.model_copy(update={"page": page})
    assert pagerduty.action_for(again) == action
    first = note(Transition.DECIDED, event("EV-R"), decision(page=False)).model_copy(
        update={"page": False}
    )
    assert pagerduty.action_for(first) is None  # a first decision that does not page: silent
    assert teams.wants(again)
