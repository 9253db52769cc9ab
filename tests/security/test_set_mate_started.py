"""A set-mate's Started decides only for itself (issue 46, "a set-mate marks the victim's
event Started").

Every VM of an availability set sees its set-mates' events. A hostile set-mate reports the
victim's shared event first as Started, naming itself in `Resources`. On 2f59d6a the event
row's `started` was set on that one VM's word and never cleared, so the victim's User
Redeploy was never approved, a person's approval was `skipped`, under a drain policy the
victim's Reboot was never drained, and a false `started` was announced. A VM's Started is
now its own (its reporter row): the decider derives the event's start from Azure's facts
and every reporter's own view, so while the victim's own view says Scheduled (before
NotBefore) the event has not started for it.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from functions.model.policy import Match, Policy, Rule
from functions.pipeline.ingest import ingest_message
from functions.pipeline.watchdog import run_watchdog
from functions.store.records import EventRecord
from functions.store.state import Store
from functions.web.approval import approve_by_hand
from tests.functions.conftest import FakeClock, Relay, envelope, event, make_pipeline

pytestmark = pytest.mark.azurite

APPROVE_ALL = Policy(rules=(Rule(name="all", action="approve"),))
HOLD_ALL = Policy(rules=(Rule(name="all", action="hold"),))
DRAIN_REBOOTS = Policy(
    rules=(Rule(name="drain-reboots", action="drain", match=Match(event_types=("Reboot",))),)
)
SET = {"availability_set": "as1"}
BOTH = ("victim", "mate")


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


def _forged_started(kind: str = "Redeploy", source: str = "User") -> dict:
    """The mate's report: the victim's event, Started (IMDS then blanks NotBefore)."""
    return event("EV-S", kind, status="Started", resources=BOTH, not_before=None, source=source)


def _genuine(kind: str = "Redeploy", source: str = "User") -> dict:
    return event("EV-S", kind, resources=BOTH, source=source)


def test_the_victims_redeploy_is_approved_and_no_started_is_announced(store, clock, relay):
    pipeline, pub = make_pipeline(store, clock, APPROVE_ALL)
    ingest_message(envelope("mate", 1, [_forged_started()], **SET), pipeline)
    victim = {**SET, "callback_url": relay.url}
    ingest_message(envelope("victim", 1, [_genuine()], **victim), pipeline)
    record = store.get_event("EV-S")
    assert not record.started and record.event_status == "Scheduled"
    assert relay.starts() == ["EV-S"]  # through the victim's own relay
    assert record.approval == "approved" and record.approved_by == "victim"
    assert "started" not in pub.transitions("EV-S")
    # A sweep later: still nobody else's Started decides for the victim.
    clock.advance(60)
    run_watchdog(pipeline)
    assert "started" not in pub.transitions("EV-S")


def test_a_persons_approval_is_carried_out(store, clock, relay):
    pipeline, _ = make_pipeline(store, clock, HOLD_ALL)
    ingest_message(envelope("mate", 1, [_forged_started()], **SET), pipeline)
    victim = {**SET, "callback_url": relay.url}
    ingest_message(envelope("victim", 1, [_genuine()], **victim), pipeline)
    result = approve_by_hand(pipeline, "EV-S", "alice")
    assert result.outcome == "approved", result
    assert relay.starts() == ["EV-S"]


def test_the_victims_reboot_is_drained(store, clock):
    pipeline, _ = make_pipeline(store, clock, DRAIN_REBOOTS)
    drained: list[tuple[str, str]] = []

    def drainer(what: str, record: EventRecord) -> str:
        drained.append((what, record.event_id))
        return "held"

    pipeline.drainer = drainer
    forged = _forged_started("Reboot", "Platform")
    ingest_message(envelope("mate", 1, [forged], **SET), pipeline)
    ingest_message(envelope("victim", 1, [_genuine("Reboot", "Platform")], **SET), pipeline)
    run_watchdog(pipeline)  # the sweep's unit of work runs the drain workflow
    assert ("drain", "EV-S") in drained


def test_a_genuine_start_is_announced_once_every_reporter_sees_it(store, clock):
    pipeline, pub = make_pipeline(store, clock, HOLD_ALL)
    ingest_message(envelope("victim", 1, [_genuine()], **SET), pipeline)
    ingest_message(envelope("mate", 1, [_genuine()], **SET), pipeline)
    clock.advance(5)
    ingest_message(envelope("mate", 2, [_forged_started()], **SET), pipeline)
    assert "started" not in pub.transitions("EV-S")  # the victim still sees it Scheduled
    clock.advance(1)
    ingest_message(envelope("victim", 2, [_forged_started()], **SET), pipeline)
    record = store.get_event("EV-S")
    assert record.started and record.started_at is not None
    assert pub.transitions("EV-S").count("started") == 1


def test_at_not_before_a_reporters_started_starts_it(store, clock):
    """Azure starts the event at NotBefore whatever the bridge says: from then on a VM's
    Started is believed, so a silent set-mate that never reports Started holds nothing."""
    pipeline, pub = make_pipeline(store, clock, HOLD_ALL)
    ingest_message(envelope("victim", 1, [_genuine()], **SET), pipeline)
    ingest_message(envelope("mate", 1, [_genuine()], **SET), pipeline)
    clock.advance(16 * 60)  # NotBefore was T0 + 15 min
    ingest_message(envelope("mate", 2, [_forged_started()], **SET), pipeline)
    assert store.get_event("EV-S").started
    assert pub.transitions("EV-S").count("started") == 1
