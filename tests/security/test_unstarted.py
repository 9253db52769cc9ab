"""Issue 37: a VM whose approved event never starts is flagged, and is not asked to approve
again (its events take no slot) until one of its events really starts.

Azure starts an approved event within moments. A VM that says "approved" to events it made
up (its relay is the attacker's) would otherwise take its set's slot again and again: each
lapse, a new EventId (up to 50 an hour)."""

from __future__ import annotations

from datetime import timedelta

from functions.model.policy import Policy, Rule
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
    # One of its events really starts: believed again.
    started = {**first, "EventStatus": "Started", "NotBefore": ""}
    ingest_message(envelope("liar", 3, [started, second], **where), pipeline)
    assert store.get_vm("liar").unstarted is None
    clock.advance(60)
    write_liveness(store, "liar", clock.now())
    run_watchdog(pipeline)
    assert "MADE-2" in relay.starts()
