"""One VM's made-up event cannot squat its set's capacity slot (issue 27).

The policy lets one impactful event of an availability set be approved at a time. The
attacker reports a User Redeploy its IMDS never showed, its relay (compromised) answers
"approved", and it keeps listing the event with NotBefore moved later, so the event never
ends. The victim's genuine User Redeploy waits for the slot; once the attacker's slot is
past the NotBefore it was taken for (plus its duration and a grace), it is released
whatever the attacker says, and the victim's event is approved through its own relay.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import pytest

from functions.pipeline import slot_rules
from functions.pipeline.watchdog import run_watchdog
from tests.security.conftest import Fleet
from tests.security.test_one_vm import Listener, _replace_callback, own_document


class Ahead:
    """The app's clock, some minutes on (the relays' stay real)."""

    def __init__(self, minutes: float) -> None:
        self.offset = timedelta(minutes=minutes)

    def now(self) -> datetime:
        return datetime.now(UTC) + self.offset

    def sleep(self, seconds: float) -> None:
        pass


def made_up(not_before: datetime) -> dict:
    return {
        "EventId": "MADE-UP-REDEPLOY",
        "EventType": "Redeploy",
        "EventStatus": "Scheduled",
        "ResourceType": "VirtualMachine",
        "Resources": ["attacker"],
        "NotBefore": format_datetime(not_before, usegmt=True),
        "EventSource": "User",
        "DurationInSeconds": -1,
    }


def test_a_made_up_event_listed_for_ever_does_not_keep_the_victims_slot(
    fleet: Fleet, monkeypatch: pytest.MonkeyPatch
):
    # An approved event holds its slot only until Azure would have started it (issue 37:
    # never by a lapse the VM's NotBefore sets).
    monkeypatch.setattr(slot_rules, "APPROVED_START_GRACE", timedelta(minutes=2))
    fake_ok = json.dumps({"results": {"MADE-UP-REDEPLOY": "approved"}, "imds_status": 200})
    liar = _replace_callback(fleet, "attacker", lambda: Listener(200, fake_ok.encode()))
    try:
        attacker, victim = fleet.vms["attacker"], fleet.vms["victim"]
        fleet.deliver(victim.message([]))
        soon = datetime.now(UTC) + timedelta(minutes=1)
        fleet.deliver(attacker.message([made_up(soon)]))
        assert fleet.store.get_event("MADE-UP-REDEPLOY").approval == "approved"  # the lie
        event_id = fleet.sim.add_event("Redeploy", resources=["victim"], source="User")
        fleet.deliver(victim.message(own_document(fleet, "victim")))
        record = fleet.store.get_event(event_id)
        assert record.approval == "pending" and record.approval_reason == "capacity", record

        # Three minutes on: the attacker still lists its event, NotBefore moved later.
        fleet.pipeline.clock = Ahead(minutes=3)
        later = datetime.now(UTC) + timedelta(minutes=10)
        fleet.deliver(attacker.message([made_up(later)]))
        assert not fleet.store.get_event("MADE-UP-REDEPLOY").ended
        report = run_watchdog(fleet.pipeline)

        approved = [a for a in report.approvals if a.event_id == event_id]
        assert approved and approved[0].outcome == "approved", report.approvals
        assert fleet.store.get_event(event_id).approved_by == "victim"
        assert fleet.sim.describe_event(event_id)["EventStatus"] == "Started"
    finally:
        liar.close()


def test_a_slot_is_kept_while_its_event_is_within_its_time(fleet: Fleet):
    """Legitimate: the holder's slot is not released before NotBefore + duration + grace
    (the default grace, 30 min): the second event waits."""
    fleet.deliver(fleet.vms["victim"].message([]))
    first = fleet.sim.add_event("Redeploy", resources=["attacker"], source="User")
    fleet.deliver(fleet.vms["attacker"].message(own_document(fleet, "attacker")))
    assert fleet.store.get_event(first).approval == "approved"
    second = fleet.sim.add_event("Redeploy", resources=["victim"], source="User")
    fleet.deliver(fleet.vms["victim"].message(own_document(fleet, "victim")))
    fleet.pipeline.clock = Ahead(minutes=3)
    run_watchdog(fleet.pipeline)
    assert fleet.store.get_event(second).approval == "pending"


def test_a_made_up_event_approved_by_its_own_relay_holds_the_slot_five_minutes_at_most(
    fleet: Fleet,
):
    """Issue 32: the attacker's own relay "approves" its made-up event, which then never
    starts. On 8f0b6c2 the slot stayed its until NotBefore + duration + 30 min (here an
    hour and a half). Now an approved event still Scheduled APPROVED_START_GRACE (5 min)
    after its approval is flagged (`overdue`, saying why) and its slot goes back."""
    fake_ok = json.dumps({"results": {"MADE-UP-REDEPLOY": "approved"}, "imds_status": 200})
    liar = _replace_callback(fleet, "attacker", lambda: Listener(200, fake_ok.encode()))
    try:
        attacker, victim = fleet.vms["attacker"], fleet.vms["victim"]
        fleet.deliver(victim.message([]))
        fleet.deliver(attacker.message([made_up(datetime.now(UTC) + timedelta(hours=1))]))
        assert fleet.store.get_event("MADE-UP-REDEPLOY").approval == "approved"  # the lie
        event_id = fleet.sim.add_event("Redeploy", resources=["victim"], source="User")
        fleet.deliver(victim.message(own_document(fleet, "victim")))
        assert fleet.store.get_event(event_id).approval_reason == "capacity"

        fleet.pipeline.clock = Ahead(minutes=6)
        report = run_watchdog(fleet.pipeline)
        assert "MADE-UP-REDEPLOY" in report.overdue
        flagged = [
            n
            for n in fleet.publisher.published
            if n.transition.value == "overdue" and n.event.event_id == "MADE-UP-REDEPLOY"
        ]
        assert "still listed as Scheduled" in flagged[0].detail
        # The victim's event is approved in this sweep or, if swept first, the next.
        approvals = report.approvals + run_watchdog(fleet.pipeline).approvals
        approved = [a for a in approvals if a.event_id == event_id]
        assert approved and approved[0].outcome == "approved", approvals
    finally:
        liar.close()
