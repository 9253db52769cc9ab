"""The decider says when an event's slots are given back (`Due.give_back`), so the
reconcile reads no slot row for an event that never took one (issue 46: paths from
reconcile_key; the check was capacity.release_slots' own, in the middle of its effects).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from functions.model.event import Decision
from functions.model.policy import Policy, PolicyLoad, Rule
from functions.pipeline.due import conditions, due
from functions.store import claims
from functions.store.records import EventRecord

NOT_BEFORE = datetime(2026, 11, 21, 10, 15, tzinfo=UTC)
NOW = NOT_BEFORE + timedelta(minutes=20)
POLICY = PolicyLoad(policy=Policy(rules=(Rule(name="all", action="approve"),)))


def ended(action: str, *, counted: bool = False) -> EventRecord:
    """An event that ended, every announcement of it done: it closes now."""
    record = EventRecord(
        event_id="EV-END",
        event_type="Reboot",
        event_status="Scheduled",
        resources=["vm1"],
        not_before=NOT_BEFORE,
        first_seen=NOT_BEFORE - timedelta(minutes=15),
        reporters={"vm1": ""},
        decision=Decision(action=action, rule="all"),
        ended="completed",
        ended_at=NOW - timedelta(minutes=1),
        budget_counted=counted,
    )
    record.announced = {t.value: claims.DONE for t in conditions(record, NOW)}
    return record


def test_an_event_that_may_hold_slots_gives_them_back_as_it_closes() -> None:
    for action in ("approve", "drain"):
        plan = due(ended(action), POLICY, NOW)
        assert plan.close and plan.give_back, action


def test_an_event_that_never_took_a_slot_closes_without_giving_any_back() -> None:
    plan = due(ended("hold"), POLICY, NOW)
    assert plan.close and not plan.give_back


def test_an_event_counted_in_its_budgets_gives_them_back_whatever_it_decided() -> None:
    plan = due(ended("hold", counted=True), POLICY, NOW)
    assert plan.close and plan.give_back
