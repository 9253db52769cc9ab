"""A guest clock 400 s fast keeps its VM on the bridge (issue 46, finding 7a).

A VM whose `time.time` and `datetime.now` both run 400 s ahead dates every document 400 s
in the future; what no VM sets is right: the attestation (IMDS signs it) and the time
Service Bus enqueued the message. On 75de079 ingest judged `observed_at` by the app's
clock alone (5 minutes at most ahead): every document of that VM was refused, and its
events never reached the lifecycle. Now a relay's time is never later than when Service
Bus enqueued its message (functions.pipeline.guest_time): the same message always gets
the same time, so a redelivered older document is still stale, and a date far beyond the
enqueue time (a clock set wrong, not drifting) is still refused, saying so.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from functions.pipeline.guest_time import ENQUEUED_PROPERTY, enqueued_of
from local.host import LocalHost
from tests.functions.conftest import clock, envelope, event, make_pipeline, store  # noqa: F401
from tests.security.conftest import Fleet, Vm

AHEAD = timedelta(seconds=400)


def own_document(fleet: Fleet, vm: str) -> list[dict]:
    return [e for e in fleet.imds_events(vm) if vm in e.get("Resources", [])]


def fast(vm: Vm, events: list[dict], real: datetime) -> str:
    """What the VM's relay sends for what it observed at `real` (Azure's time), dated by
    its clock 400 s ahead."""
    return vm.message(events, observed_at=(real + AHEAD).isoformat())


def test_a_vm_whose_clock_is_400_s_fast_is_processed_and_its_events_end(fleet: Fleet):
    victim = fleet.vms["victim"]
    now = datetime.now(UTC)
    first = fleet.deliver(fast(victim, [], now), enqueued_at=now)
    assert first.outcome == "processed", first.reason
    event_id = fleet.sim.add_event("Reboot", resources=["victim"])
    now = datetime.now(UTC)
    seen = fleet.deliver(fast(victim, own_document(fleet, "victim"), now), enqueued_at=now)
    assert seen.outcome == "processed", seen.reason
    assert fleet.publisher.transitions(event_id)[:2] == ["scheduled", "decided"]
    # Its time is Azure's, never ahead of it: its later documents cannot look stale.
    row = fleet.store.get_vm("victim")
    assert row.last_observed_at is not None and row.last_observed_at <= now
    # Its event ends when its document no longer lists it.
    now = datetime.now(UTC)
    gone = fleet.deliver(fast(victim, [], now), enqueued_at=now)
    assert gone.outcome == "processed", gone.reason
    assert fleet.store.get_event(event_id).ended
    assert fleet.publisher.transitions(event_id)[-1] in ("cancelled", "completed")
    assert fleet.rejected() == []


def test_a_redelivered_older_document_of_a_fast_vm_is_still_stale(fleet: Fleet):
    victim = fleet.vms["victim"]
    event_id = fleet.sim.add_event("Reboot", resources=["victim"])
    start = datetime.now(UTC) - timedelta(seconds=60)
    older = fast(victim, own_document(fleet, "victim"), start)
    assert fleet.deliver(older, enqueued_at=start + timedelta(seconds=1)).outcome == "processed"
    newer = fast(victim, [], start + timedelta(seconds=30))
    assert fleet.deliver(newer, enqueued_at=start + timedelta(seconds=31)).outcome == "processed"
    assert fleet.store.get_event(event_id).ended
    # Service Bus redelivers the older message: the same EnqueuedTimeUtc.
    again = fleet.deliver(older, enqueued_at=start + timedelta(seconds=1))
    assert again.outcome == "stale"
    # A copy of it scheduled for later (functions.triggers.later) is enqueued after the
    # newer one, and carries the original's time: stale too, nothing reopened.
    copy = enqueued_of(
        {ENQUEUED_PROPERTY: (start + timedelta(seconds=1)).isoformat()}, datetime.now(UTC)
    )
    assert fleet.deliver(older, enqueued_at=copy).outcome == "stale"
    assert fleet.store.get_vm("victim").event_ids == []
    assert fleet.store.get_event(event_id).ended


def test_a_date_far_beyond_its_enqueue_time_is_refused_saying_so(fleet: Fleet):
    victim, mate = fleet.vms["victim"], fleet.vms["attacker"]
    now = datetime.now(UTC)
    wrong = victim.message([], observed_at=(now + timedelta(hours=2)).isoformat())
    result = fleet.deliver(wrong, enqueued_at=now)
    assert result.outcome == "rejected"
    assert "after Service Bus enqueued it" in result.reason
    assert "the VM's clock is wrong" in result.reason
    assert fleet.store.get_vm("victim") is None  # nothing of it kept
    # Its set-mate, whose clock is right, is judged by its own messages only.
    event_id = fleet.sim.add_event("Reboot", resources=["attacker"])
    body = mate.message(own_document(fleet, "attacker"))
    mine = fleet.deliver(body, enqueued_at=datetime.now(UTC))
    assert mine.outcome == "processed", mine.reason
    assert fleet.publisher.transitions(event_id)[:2] == ["scheduled", "decided"]


@pytest.mark.azurite
def test_the_local_host_dates_a_fast_vms_file_by_when_it_found_it(store, clock, tmp_path):  # noqa: F811
    """The local host's stand-in for EnqueuedTimeUtc: when it first found the file."""
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    ahead = clock.now() + AHEAD
    body = envelope("vm1", 1, [event("EV-F", resources=("vm1",))], observed_at=ahead)
    (inbox / "0001.json").write_text(body)
    pipeline, pub = make_pipeline(store, clock)
    host = LocalHost(
        inbox, pipeline.settings, store, pub, clock=clock, admission=pipeline.admission
    )
    try:
        report = host.run_once()
    finally:
        host.close()
    assert report.processed == 1, report.results
    assert pub.transitions("EV-F")[:2] == ["scheduled", "decided"]
