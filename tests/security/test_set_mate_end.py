"""A set-mate that lists a victim's event and then drops it no longer ends it for the
victim (issue 31, "An end that cannot be undone").

Every VM of an availability set sees its set-mates' events in its own IMDS. A hostile VM
can list the victim's EventId first (naming itself too, so ingest takes it as its own
report) and drop it a second later: no reporter lists it, so the event ends (cancelled)
fleet-wide. On 8f0b6c2 the victim's genuine report then counted as "late" and was never
decided, drained or approved, and Azure started it at NotBefore. An end the reporters made
is now theirs alone: the victim's first report reopens the event for itself.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from functions.model.policy import Policy, Rule
from functions.pipeline.ingest import ingest_message
from functions.store.state import Store
from tests.functions.conftest import FakeClock, Relay, envelope, event, make_pipeline

pytestmark = pytest.mark.azurite

APPROVE_ALL = Policy(rules=(Rule(name="all", action="approve"),))


@pytest.fixture
def store(azurite: str) -> Store:
    return Store.from_connection_string(azurite, "t" + uuid.uuid4().hex[:12]).ensure_tables()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def relay() -> Iterator[Relay]:
    server = Relay()
    yield server
    server.close()


def test_a_set_mate_that_lists_and_drops_the_victims_event_does_not_end_it(store, clock, relay):
    pipeline, pub = make_pipeline(store, clock, APPROVE_ALL)
    genuine = event("EV-V", resources=("victim",), source="User")
    forged = event("EV-V", resources=("victim", "mate"), source="User")
    mate = {"availability_set": "as1"}
    # The set-mate lists the victim's event first, naming itself too, then drops it.
    ingest_message(envelope("mate", 1, [forged], **mate), pipeline)
    ingest_message(envelope("mate", 2, [], **mate), pipeline)
    assert pub.transitions("EV-V")[-1] == "cancelled"
    # The victim's own, genuine report: not "late", the event is on again for it.
    victim = {"availability_set": "as1", "callback_url": relay.url}
    result = ingest_message(envelope("victim", 1, [genuine], **victim), pipeline)
    assert result.outcome == "processed"
    record = store.get_event("EV-V", reporters=True)
    assert not record.ended and record.reopened == 1
    assert record.reporters == {"victim": "Scheduled"}
    # It is approved through the victim's own relay, which checks its own IMDS.
    assert relay.starts() == ["EV-V"]
    assert record.approval == "approved" and record.approved_by == "victim"
    # Its real end is announced again, with a MessageId of its own.
    ingest_message(envelope("victim", 2, [], **victim), pipeline)
    ended = [n for n in pub.published if n.event and n.event.event_id == "EV-V"]
    ends = [n.message_id() for n in ended if n.transition.value in ("cancelled", "completed")]
    assert len(ends) == 2 and len(set(ends)) == 2
    assert store.get_event("EV-V").ended


def test_a_vm_that_reported_before_does_not_reopen_an_ended_event(store, clock, relay):
    """Only a VM new to the event reopens it; one that listed it before and lists it again
    (a reordered document) is a past reporter, as before."""
    pipeline, pub = make_pipeline(store, clock)
    ingest_message(envelope("vm1", 1, [event("EV-R")]), pipeline)
    ingest_message(envelope("vm1", 2, []), pipeline)
    ingest_message(envelope("vm1", 3, [event("EV-R")]), pipeline)
    record = store.get_event("EV-R")
    assert record.ended == "cancelled" and record.reopened == 0
    assert pub.transitions("EV-R").count("cancelled") == 1
