"""ARM's acknowledge takes no dedupe key: a repeat of one that landed while its answer was
lost is refused. The approver must then ask Azure (Resource Graph) rather than announce a
failure for an event its own earlier call approved (functions.pipeline.approve_arm).

Against the simulator's ARM and Resource Graph (a real local HTTP server); the lost answer
is a real request that reaches the server, whose answer the session then drops."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest
import requests

from functions.approvers import arm as arm_approver
from functions.approvers import azure_events
from functions.approvers.arm import ArmAnswer
from functions.model.event import Transition
from functions.pipeline.announce import mark_done
from functions.pipeline.approve import approve_event
from functions.pipeline.approve_arm import LANDED
from functions.pipeline.lifecycle import approval_lease
from functions.store import claims
from tests.agentless.queues import deliver
from tests.agentless.test_arm_approver import (
    acknowledges,
    agentless,
    arm,
    grid,
    owner,
    user_event,
    with_compute,
)
from tests.functions.conftest import T0, envelope

__all__ = ["arm"]  # the fixture, used by name


class LoseFirstAnswer:
    """The session's first acknowledge reaches ARM, then its answer is lost (a dropped
    connection); the row is read as the call leaves, to see what was written before it."""

    def __init__(self, session: requests.Session, store: Any, event_id: str) -> None:
        self.send, self.store, self.event_id = session.send, store, event_id
        self.lost = 0
        self.sent_at_first_call: datetime | None = None
        session.send = self  # type: ignore[method-assign]

    def __call__(self, request: requests.PreparedRequest, **kwargs: Any) -> requests.Response:
        response = self.send(request, **kwargs)
        if str(request.url).split("?")[0].endswith("/acknowledge") and not self.lost:
            self.lost += 1
            self.sent_at_first_call = self.store.get_event(self.event_id).arm_sent_at
            raise requests.ConnectionError("connection reset after the request was sent")
        return response


def test_a_repeat_refused_after_a_lost_answer_is_the_approval_it_was(store, clock, arm):
    pipeline, pub = agentless(store, clock, arm)
    lose = LoseFirstAnswer(pipeline.session, store, "EV-LOST")
    grid(pipeline, user_event(arm.sim, "EV-LOST", ["web_1"]))
    assert lose.lost == 1 and lose.sent_at_first_call is not None  # intent before the call
    assert [c.status for c in acknowledges(arm)] == [200, 409]
    assert arm.sim.describe_event("EV-LOST")["EventStatus"] == "Started"
    record = store.get_event("EV-LOST")
    assert record.approval == "approved" and record.approved_by == "arm"
    assert record.approval_reason.startswith("acknowledged through ARM on /subscriptions")
    outcomes = [a.outcome for a in record.approval_attempts]
    assert outcomes[0].startswith("ARM unreachable")
    assert outcomes[1].startswith(f"{LANDED} (Azure reports it Started): ARM refused 409")
    assert pub.transitions("EV-LOST") == ["scheduled", "decided", "approved"]


def test_a_repeat_refused_while_azure_still_reports_scheduled_is_never_approved(
    store, clock, arm, monkeypatch
):
    """ARM refuses, Resource Graph (which may lag ARM) still shows the event waiting: the
    approver asks again until its stop, and never calls it approved on a guess."""
    pipeline, _pub = agentless(store, clock, arm)
    answers = iter(
        [ArmAnswer(verdict="retry", text="ARM unreachable: ConnectionError")]
        + [ArmAnswer(verdict="refused", status=409, code="Conflict", text="ARM refused 409")] * 99
    )
    monkeypatch.setattr(arm_approver, "acknowledge", lambda *a, **k: next(answers))
    asked: list[str] = []

    def scheduled(event_id: str, **kwargs: Any) -> azure_events.AzureEvent:
        asked.append(event_id)
        owner = "/subscriptions/s/resourceGroups/rg/providers/Microsoft.Compute/virtualMachines/v"
        return azure_events.AzureEvent(
            id=f"{owner}/providers/microsoft.maintenance/scheduledevents/{event_id}",
            event_id=event_id,
            properties={"EventStatus": "Scheduled"},
        )

    monkeypatch.setattr(arm_approver, "lookup", scheduled)
    props = user_event(arm.sim, "EV-LAG", ["web_1"])
    props["NotBefore"] = (T0 + timedelta(minutes=5)).strftime("%a, %d %b %Y %H:%M:%S GMT")
    grid(pipeline, props)
    record = store.get_event("EV-LAG")
    assert record.approval != "approved", record.approval_reason
    assert len(asked) >= 2  # asked again, not once
    assert not any(a.outcome.startswith(LANDED) for a in record.approval_attempts)


class HostDied(BaseException):
    """The Functions host dies (a BaseException: no `except Exception` swallows it)."""


def _died_past_acknowledge(store, clock, arm, relay, event_id: str):
    """A relay-reported event (the relay refuses, ARM takes over) whose host dies once its
    acknowledge reached ARM: the claim held, `arm_sent_at` set, Azure's event Started."""
    pipeline, pub = agentless(store, clock, arm, approvers="relay,arm")
    relay.default = (400, {"error": "refused"})
    send = pipeline.session.send

    def dies_after_acknowledge(request: requests.PreparedRequest, **kwargs: Any) -> Any:
        response = send(request, **kwargs)
        if str(request.url).split("?")[0].endswith("/acknowledge"):
            raise HostDied
        return response

    pipeline.session.send = dies_after_acknowledge  # type: ignore[method-assign]
    props = user_event(arm.sim, event_id, ["web_1"])
    body = envelope("web_1", 1, [props], callback_url=relay.url, scale_set="web")
    body = with_compute(body, f"{owner('virtualMachineScaleSets', 'web')}/virtualMachines/1")
    with pytest.raises(HostDied):
        deliver(body, pipeline)
    assert arm.sim.describe_event(event_id)["EventStatus"] == "Started"
    record = store.get_event(event_id)
    assert record.approval == "in_progress" and record.arm_sent_at is not None
    # Its `scheduled` and `decided` went out before the acknowledge, left to be marked
    # done with the outcome: the takeover's reconcile marks them done (published again,
    # duplicates the topic drops) before an approval may be claimed again (issue 46).
    before = [Transition.SCHEDULED, Transition.DECIDED]
    assert all(claims.is_pending(record.announced[t.value]) for t in before)
    mark_done(store, event_id, before)
    pipeline.session.send = send  # type: ignore[method-assign]
    return pipeline, pub, store.get_event(event_id)


def test_a_takeover_after_the_host_died_past_its_acknowledge_asks_azure_not_arm(
    store, clock, arm, relay
):
    """The watchdog's takeover finds `arm_sent_at` and Azure's event Started: it records
    the approval through ARM and sends no second acknowledge."""
    pipeline, pub, _ = _died_past_acknowledge(store, clock, arm, relay, "EV-DIED")
    clock.advance(approval_lease(pipeline.settings.approval_budget_seconds).total_seconds() + 1)
    result = approve_event("EV-DIED", pipeline, by="watchdog")
    assert result.outcome == "approved" and result.vm == "arm", result.detail
    assert [c.status for c in acknowledges(arm)] == [200]  # none sent again
    record = store.get_event("EV-DIED")
    assert record.approval == "approved" and record.approved_by == "arm"
    assert record.approval_attempts[-1].outcome.startswith(LANDED)
    assert pub.transitions("EV-DIED")[-1] == "approved"


def test_after_not_before_a_started_event_is_not_claimed_as_the_apps_approval(
    store, clock, arm, relay
):
    """Once NotBefore has passed, Azure may have started the event on its own: the
    takeover does not call it the app's approval, and acknowledges nothing."""
    pipeline, pub, record = _died_past_acknowledge(store, clock, arm, relay, "EV-LATE")
    clock.advance((record.not_before - clock.now()).total_seconds() + 1)
    result = approve_event("EV-LATE", pipeline, by="watchdog")
    assert result.outcome != "approved", result.detail
    assert "NotBefore has passed" in result.detail
    assert [c.status for c in acknowledges(arm)] == [200]
    assert "approved" not in pub.transitions("EV-LATE")
