"""A held event is not `overdue` at its own NotBefore (issue 46, chaos: "a held event pages
at its own NotBefore").

Azure starts an event at NotBefore or after it, and the bridge sees it Started only once a
relay's next document comes in. On 2f59d6a `due.overdue_detail` had no grace after
NotBefore: a chaos run announced `overdue` (a PagerDuty trigger) 0.5 s before Azure
started the event on time. It is overdue from NOT_BEFORE_GRACE after NotBefore on, and
the row is looked at again then.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from functions.model.event import Decision, Transition
from functions.model.policy import Policy, PolicyLoad, Rule
from functions.pipeline.due import NOT_BEFORE_GRACE, due, overdue_detail
from functions.store.records import EventRecord

NOT_BEFORE = datetime(2026, 11, 21, 10, 15, tzinfo=UTC)
HOLD = PolicyLoad(policy=Policy(rules=(Rule(name="all", action="hold"),)))
TICK = timedelta(milliseconds=1)


def held() -> EventRecord:
    return EventRecord(
        event_id="EV-HELD",
        event_type="Reboot",
        event_status="Scheduled",
        resources=["vm1"],
        not_before=NOT_BEFORE,
        first_seen=NOT_BEFORE - timedelta(minutes=15),
        reporters={"vm1": "Scheduled"},
        decision=Decision(action="hold", rule="all"),
    )


def test_an_event_azure_has_not_started_yet_is_not_overdue_within_the_grace() -> None:
    for now in (NOT_BEFORE - TICK, NOT_BEFORE, NOT_BEFORE + timedelta(seconds=0.5)):
        assert overdue_detail(held(), now) == "", now
        assert Transition.OVERDUE not in due(held(), HOLD, now).announce, now
    assert overdue_detail(held(), NOT_BEFORE + NOT_BEFORE_GRACE - TICK) == ""


def test_it_is_overdue_from_the_end_of_the_grace_on() -> None:
    for now in (NOT_BEFORE + NOT_BEFORE_GRACE, NOT_BEFORE + timedelta(hours=1)):
        assert overdue_detail(held(), now).startswith("still Scheduled after NotBefore"), now
        made = due(held(), HOLD, now)
        assert Transition.OVERDUE in made.announce and made.overdue, now


def test_the_row_is_looked_at_again_when_the_grace_ends() -> None:
    """Nothing else may wake a held event after NotBefore: its next look is the grace's end."""
    made = due(held(), HOLD, NOT_BEFORE + timedelta(seconds=0.5))
    assert made.next_at == NOT_BEFORE + NOT_BEFORE_GRACE


def test_the_grace_is_short_of_what_an_operator_calls_late() -> None:
    assert timedelta(seconds=10) <= NOT_BEFORE_GRACE <= timedelta(minutes=2)
