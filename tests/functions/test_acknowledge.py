"""The app's half of "a document can always come back" (issue 40, contract §11): ingest
deletes the pending rows a document names once it reached the lifecycle, and a document
the relay sends again (its "it is over" one, lost) still ends the event.

The relay's half is tests/relay/test_acks.py; the whole loop, a real relay with its
document dead-lettered by the local host, is tests/e2e/test_document_comes_back.py.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from typing import Any

from azure.data.tables import UpdateMode

from functions.model.envelope import parse_envelope
from functions.pipeline.ingest import ingest_message
from functions.store.acks import acknowledge, pending_row_keys
from tests import identity_harness
from tests.functions.conftest import T0, event, make_pipeline


def envelope(
    vm: str,
    sequence: int,
    events: list[dict[str, Any]] | None,
    *,
    acks: list[int] | None = None,
    resent: int | None = None,
    observed_at: datetime | None = None,
) -> str:
    """A signed relay document (as tests.functions.conftest.envelope) naming its pending
    rows (`acks`) and, sent again, its resend count (contract §11)."""
    at = observed_at or T0 + timedelta(seconds=sequence)
    message: dict[str, Any] = {
        "schema": 1,
        "kind": "document",
        "vm": {"name": vm, "callback_url": None, "scale_set": None, "availability_set": None},
        "relay_version": "test",
        "sequence": sequence,
        "observed_at": at.isoformat(),
        "document": None if events is None else {"DocumentIncarnation": sequence, "Events": events},
    }
    if acks is not None:
        message["acks"] = acks
    if resent is not None:
        message["resent"] = resent
    return identity_harness.signed_envelope(message, at)


def relay_marks(store: Any, vm: str, *sequences: int) -> None:
    """What the relay writes before each document: its pending row (Insert Or Merge)."""
    secret = identity_harness.callback_key(vm).secret
    for sequence in sequences:
        pk, rk = pending_row_keys(secret, sequence)
        entity = {"PartitionKey": pk, "RowKey": rk, "at": 1}
        store.liveness.table.upsert_entity(entity, mode=UpdateMode.MERGE)


def still_pending(store: Any, vm: str, sequence: int) -> bool:
    rk = pending_row_keys(identity_harness.callback_key(vm).secret, sequence)[1]
    return any(row["RowKey"] == rk for row in store.liveness.table.list_entities())


def test_a_lost_end_document_sent_again_ends_the_event(store, clock):
    pipeline, pub = make_pipeline(store, clock)
    started = {**event("EV-F", "Freeze", status="Started", resources=("vm1",)), "NotBefore": ""}
    relay_marks(store, "vm1", 1, 2)
    ingest_message(envelope("vm1", 1, [started], acks=[1]), pipeline)
    assert "started" in pub.transitions("EV-F") and not still_pending(store, "vm1", 1)
    # "It is over" (sequence 2) is dead-lettered: the app never saw it. The row stays, so
    # at its heartbeats the relay sends the same document again.
    assert still_pending(store, "vm1", 2)
    clock.sleep(600)
    again = envelope("vm1", 2, [], acks=[2], resent=1)
    assert ingest_message(again, pipeline).outcome == "processed"
    assert pub.transitions("EV-F")[-1] == "completed"
    assert store.get_event("EV-F").ended == "completed"
    assert not still_pending(store, "vm1", 2)  # and the relay stops sending it


def test_a_redelivery_of_what_was_processed_is_acknowledged_too(store, clock):
    pipeline, _ = make_pipeline(store, clock)
    body = envelope("vm1", 3, [event("EV-1", resources=("vm1",))], acks=[3])
    ingest_message(body, pipeline)
    relay_marks(store, "vm1", 3)  # the relay's row came after the app's delete
    assert ingest_message(body, pipeline).outcome == "stale"
    assert not still_pending(store, "vm1", 3)


def test_a_document_names_the_earlier_rows_and_all_are_deleted(store, clock):
    pipeline, _ = make_pipeline(store, clock)
    relay_marks(store, "vm1", 4, 6)
    ingest_message(envelope("vm1", 6, [], acks=[4, 6]), pipeline)
    assert not still_pending(store, "vm1", 4) and not still_pending(store, "vm1", 6)


def test_over_a_per_vm_bound_it_is_not_acknowledged_and_may_pass_later(store, clock):
    pipeline, _ = make_pipeline(store, clock, max_new_events_per_vm_hour=5)
    six = [event(f"EV-{n}", resources=("vm1",)) for n in range(6)]
    relay_marks(store, "vm1", 1)
    result = ingest_message(envelope("vm1", 1, six, acks=[1]), pipeline)
    assert result.outcome == "rejected" and "MAX_NEW_EVENTS_PER_VM_HOUR" in result.reason
    assert still_pending(store, "vm1", 1)  # the relay sends it again; within the bound, it passes


def test_from_a_clock_ahead_it_is_not_acknowledged_and_passes_when_sent_again(store, clock):
    pipeline, pub = make_pipeline(store, clock)
    relay_marks(store, "vm1", 1)
    ahead = T0 + timedelta(minutes=7)  # a guest clock stepped 7 minutes ahead
    body = envelope("vm1", 1, [event("EV-1", resources=("vm1",))], acks=[1], observed_at=ahead)
    result = ingest_message(body, pipeline)
    assert result.outcome == "rejected" and "ahead of the app's clock" in result.reason
    assert still_pending(store, "vm1", 1)  # kept: the relay sends it again
    clock.sleep(600)  # its next resends: now the time it carries is past
    again = envelope(
        "vm1", 1, [event("EV-1", resources=("vm1",))], acks=[1], resent=2, observed_at=ahead
    )
    assert ingest_message(again, pipeline).outcome == "processed"
    assert pub.transitions("EV-1")[:1] == ["scheduled"] and not still_pending(store, "vm1", 1)


def test_a_message_that_proves_no_identity_deletes_nothing(store, clock):
    pipeline, _ = make_pipeline(store, clock)
    relay_marks(store, "vm1", 1)
    forged = json.loads(envelope("vm1", 1, [], acks=[1]))
    forged["sequence"] = 2  # no longer the message its attestation signed
    forged = json.dumps(forged)
    assert ingest_message(forged, pipeline).outcome == "rejected"
    assert still_pending(store, "vm1", 1)


def test_a_relay_that_asks_for_no_acknowledgement_costs_no_request(store, clock):
    table = store.liveness.table
    plain = parse_envelope(envelope("vm1", 1, []))
    assert plain.acks is None and plain.callback_key is not None
    secret = bytes.fromhex(plain.callback_key.secret)
    assert acknowledge(table, secret, plain.acks or []) == 0
    with_acks = parse_envelope(envelope("vm1", 1, [], acks=[1]))
    assert acknowledge(table, secret, with_acks.acks or []) == 1  # one delete, even of no row
