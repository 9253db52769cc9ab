"""Issue 37: a VM whose approved event never starts is flagged, and is not asked to approve
again (its events take no slot) for UNSTARTED_FOR.

Azure starts an approved event within moments. A VM that says "approved" to events it made
up (its relay is the attacker's) would otherwise take its set's slot again and again: each
lapse, a new EventId (up to 50 an hour).

Issue 46: the flag is set from the VM's own view only (a set-mate that keeps listing a
shared event the victim approved cannot get the victim flagged), and the flagged VM's own
documents cannot clear it (it listed a made-up Started and was believed again)."""

from __future__ import annotations

from datetime import timedelta

from functions.model.policy import Policy, Rule
from functions.pipeline import relay_phase
from functions.pipeline.ingest import ingest_message
from functions.pipeline.watchdog import run_watchdog
from tests.functions.conftest import (  # noqa: F401  (fixtures)
    T0,
    clock,
    envelope,
    event,
    make_pipeline,
    new_relay,
    relay,
    store,
    write_liveness,
)

APPROVE = Policy(rules=(Rule(name="all", action="approve"),))


def test_a_vm_whose_approved_event_never_starts_is_not_asked_again(store, clock, relay):  # noqa: F811
    pipeline, pub = make_pipeline(store, clock, APPROVE)
    where = {"callback_url": relay.url, "availability_set": "as1"}
    first = event("MADE-1", "Redeploy", resources=("liar",), not_before=T0 + timedelta(hours=2))
    ingest_message(envelope("liar", 1, [first], **where), pipeline)
    assert relay.starts() == ["MADE-1"]  # its relay says "approved"; nothing starts
    clock.advance(6 * 60)
    write_liveness(store, "liar", clock.now())
    run_watchdog(pipeline)  # approved 6 min ago, still Scheduled: overdue, flagged
    assert pub.transitions("MADE-1")[-1] == "overdue"
    assert store.get_vm("liar").unstarted == "MADE-1"
    second = event("MADE-2", "Redeploy", resources=("liar",), not_before=T0 + timedelta(hours=2))
    ingest_message(envelope("liar", 2, [first, second], **where), pipeline)
    assert relay.starts() == ["MADE-1"]  # not asked again
    assert store.get_event("MADE-2").approval == "pending"
    # It lists one of its events as Started: its own word, which clears nothing (issue 46).
    started = {**first, "EventStatus": "Started", "NotBefore": ""}
    ingest_message(envelope("liar", 3, [started, second], **where), pipeline)
    assert store.get_vm("liar").unstarted == "MADE-1"
    clock.advance(60)
    write_liveness(store, "liar", clock.now())
    run_watchdog(pipeline)
    assert "MADE-2" not in relay.starts()  # before: asked again, and its slot taken again
    # The flag lapses after UNSTARTED_FOR.
    third = event("MADE-3", "Redeploy", resources=("liar",), not_before=T0 + timedelta(days=2))
    clock.advance(relay_phase.UNSTARTED_FOR.total_seconds())
    write_liveness(store, "liar", clock.now())
    ingest_message(envelope("liar", 4, [third], observed_at=clock.now(), **where), pipeline)
    assert relay.starts()[-1] == "MADE-3"


def test_a_set_mate_listing_a_shared_event_cannot_get_the_approver_flagged(store, clock, relay):  # noqa: F811
    """A 5 s Freeze of victim and mate, approved through the victim's relay: over before
    the victim's next poll, so its own document never lists it Started and then no longer
    lists it. The mate keeps listing it as Scheduled. The victim is not flagged."""
    pipeline, pub = make_pipeline(store, clock, APPROVE)
    where = {"callback_url": relay.url, "availability_set": "as1"}
    freeze = event("SHARED", "Freeze", resources=("victim", "mate"), duration=5)
    ingest_message(envelope("victim", 1, [freeze], observed_at=clock.now(), **where), pipeline)
    assert relay.starts() == ["SHARED"] and relay.targets == ["victim"]
    ingest_message(envelope("mate", 1, [freeze], observed_at=clock.now(), **where), pipeline)
    clock.advance(10)
    ingest_message(envelope("victim", 2, [], observed_at=clock.now(), **where), pipeline)
    for seq in range(2, 5):  # the mate keeps listing it as Scheduled
        clock.advance(120)
        ingest_message(envelope("mate", seq, [freeze], observed_at=clock.now(), **where), pipeline)
        write_liveness(store, "victim", clock.now())
        run_watchdog(pipeline)
    assert "overdue" in pub.transitions("SHARED")  # the event row's status is the mate's word
    assert store.get_vm("victim").unstarted is None  # before: "SHARED", never asked again
    mine = event("MINE", "Redeploy", resources=("victim",), not_before=T0 + timedelta(hours=2))
    ingest_message(envelope("victim", 3, [mine], observed_at=clock.now(), **where), pipeline)
    assert relay.starts()[-1] == "MINE"
