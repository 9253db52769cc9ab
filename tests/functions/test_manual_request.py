"""A person's approval is recorded, then carried out by the one decider (issue 37, item 1).

The pages and the JSON API write the request on the event row (`asked_by`, `asked_at`) and
reconcile; `due` makes the approval due whatever the decision, its window or the slots say.
So a host that dies between the request and the approval leaves it due: the sweep's next
unit of work approves it, in that person's name, once."""

from __future__ import annotations

import pytest

from functions.model.policy import Policy, Rule
from functions.pipeline.ingest import ingest_message
from functions.pipeline.watchdog import run_watchdog
from functions.web import approval
from functions.web.approval import approve_by_hand
from tests.functions.conftest import T0, envelope, event, make_pipeline

HOLD = Policy(rules=(Rule(name="hold-all", action="hold"),))


class Died(BaseException):
    """The host dies here (a BaseException: nothing in the code under test catches it)."""


def _held(store, clock, relay):
    pipeline, publisher = make_pipeline(store, clock, HOLD)
    ingest_message(envelope("vm1", 1, [event("EV-1")], callback_url=relay.url), pipeline)
    record = store.get_event("EV-1")
    assert record.decision.action == "hold" and relay.starts() == []
    return pipeline, publisher


def _approved(publisher) -> list:
    return [n for n in publisher.published if n.transition.value == "approved"]


def test_a_held_event_approved_by_hand_goes_through_the_decider(store, clock, relay):
    pipeline, publisher = _held(store, clock, relay)
    result = approve_by_hand(pipeline, "EV-1", "alice")
    assert result.outcome == "approved", result
    assert relay.starts() == ["EV-1"]
    record = store.get_event("EV-1")
    assert record.asked_by == "manual:alice" and record.asked_at == clock.now()
    assert record.approval == "approved" and record.approval_attempts[-1].by == "manual:alice"
    assert len(_approved(publisher)) == 1
    # Carried out: a sweep after it asks nothing more of anyone.
    clock.advance(60)
    assert run_watchdog(pipeline).approvals == [] and relay.starts() == ["EV-1"]


def test_a_host_that_dies_after_the_request_leaves_it_due(store, clock, relay, monkeypatch):
    pipeline, publisher = _held(store, clock, relay)

    def dies(*args, **kwargs):
        raise Died

    monkeypatch.setattr(approval, "reconcile_key", dies)
    with pytest.raises(Died):
        approve_by_hand(pipeline, "EV-1", "alice")
    assert relay.starts() == [] and store.get_event("EV-1").asked_by == "manual:alice"
    monkeypatch.undo()
    # The sweep finds it due now (the request made it so) and its unit of work approves
    # it, for the person who asked: a hold-all policy alone never would.
    (result,) = run_watchdog(pipeline).approvals
    assert result.outcome == "approved" and relay.starts() == ["EV-1"]
    record = store.get_event("EV-1")
    assert record.approval_attempts[-1].by == "manual:alice" and len(_approved(publisher)) == 1


def test_a_request_after_not_before_is_skipped_with_the_reason(store, clock, relay):
    pipeline, _ = _held(store, clock, relay)
    clock.advance(16 * 60)  # NotBefore was T0 + 15 min; the VM still lists it
    ingest_message(envelope("vm1", 2, [event("EV-1")], callback_url=relay.url), pipeline)
    result = approve_by_hand(pipeline, "EV-1", "alice")
    assert result.outcome == "skipped" and "NotBefore has passed" in result.detail
    assert relay.starts() == []


def test_a_failed_request_is_not_retried_in_that_persons_name(store, clock, relay):
    """The request is carried out once: an attempt of that person's since it was made is
    recorded, so the decider stops there; a second request tries again."""
    pipeline, _ = _held(store, clock, relay)
    relay.script = [(500, {"error": "IMDS refused"})] * 50
    first = approve_by_hand(pipeline, "EV-1", "alice")
    assert first.outcome in ("failed", "retry_later"), first
    tried = len(relay.requests)
    clock.advance(120)
    assert run_watchdog(pipeline).approvals == [] and len(relay.requests) == tried
    relay.script = []
    clock.advance(30)
    again = approve_by_hand(pipeline, "EV-1", "alice")
    assert again.outcome == "approved" and relay.starts()[-1] == "EV-1"
    assert store.get_event("EV-1").approval_attempts[-1].by == "manual:alice"
    assert store.get_event("EV-1").asked_at > T0
