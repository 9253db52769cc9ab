"""Issue 22, property 4: one malformed or hostile row is skipped and reported, never stops a
sweep or blocks a VM; relays' liveness rows (contract §5) count only when verified."""

from __future__ import annotations

import hashlib
import hmac
import json
from datetime import UTC, datetime, timedelta

import pytest
from azure.data.tables import EdmType, EntityProperty, UpdateMode

from functions.identity.keys import liveness_signature
from functions.pipeline.ingest import ingest_message
from functions.pipeline.watchdog import run_watchdog
from functions.store.events import EVENT_ROW, OPEN_EVENTS
from functions.store.keys import reserved, row_key, vm_partition
from functions.store.liveness import (
    BadHint,
    DictVerifier,
    check_row,
    liveness_partition,
    to_hint,
)
from tests.functions.conftest import (
    T0,
    envelope,
    event,
    liveness_row,
    make_pipeline,
    vm_id_of,
    write_liveness,
)

ATTACKER_KEY = b"k" * 32
ATTACKER_KID = hashlib.sha256(ATTACKER_KEY).hexdigest()[:16]


def _raw_liveness(store, row: dict) -> None:
    store.liveness.table.upsert_entity(row, mode=UpdateMode.REPLACE)


def _relay_silent(pub) -> list[str]:
    return [n.vm for n in pub.published if n.transition == "relay_silent"]


def test_hostile_rows_are_skipped_and_the_sweep_does_its_other_work(store, clock, relay):
    pipeline, pub = make_pipeline(store, clock)
    # A deferred approval: the relay is busy now, the watchdog approves later.
    relay.default = (503, {"error": "busy"})
    held = event("EV-A", source="User", resources=("good",), not_before=T0 + timedelta(hours=1))
    first = ingest_message(envelope("good", 1, [held], callback_url=relay.url), pipeline)
    assert first.approvals[0].outcome == "retry_later"
    # A relay that goes silent, and one whose VM row is garbage.
    for name in ("quiet", "garbled", "victim"):
        ingest_message(envelope(name, 1, []), pipeline)
        write_liveness(store, name, clock.now())
    # Retention: a rejected message 40 days old.
    store.reject(at=T0 - timedelta(days=40), reason="old", body="x")
    clock.advance(11 * 60)
    write_liveness(store, "good", clock.now())
    # (The approver judges a relay fresh by its VM row: a heartbeat through Service Bus.)
    ingest_message(envelope("good", 2, None, kind="heartbeat", observed_at=clock.now()), pipeline)
    relay.default = (200, {"imds_status": 200})

    old = clock.now() - timedelta(hours=1)
    unix = int(old.timestamp())
    stranger = "0badc0de-0000-4000-8000-000000000001"
    hostile = [
        # Not enrolled (shape right, signed by a key of its own): never pages.
        {
            **liveness_row("x", old),
            "PartitionKey": liveness_partition(stranger),
            "RowKey": stranger,
            "key_id": ATTACKER_KID,
            "sig": liveness_signature(ATTACKER_KEY, stranger, unix, "test"),
        },
        # Another VM's row overwritten by a relay that holds another key: never pages.
        {
            **liveness_row("victim", old),
            "key_id": ATTACKER_KID,
            "sig": liveness_signature(ATTACKER_KEY, vm_id_of("victim"), unix, "test"),
        },
        # Wrong types and sizes.
        {**liveness_row("t1", old), "at": "yesterday"},
        {**liveness_row("t2", old), "at": EntityProperty(unix + 7, EdmType.INT64)},  # != seen
        {**liveness_row("t3", old), "relay_version": "v" * 30_000},
        {**liveness_row("t4", old), "sig": "not hex"},
        {**liveness_row("t5", old), "PartitionKey": "lv00", "RowKey": "not-a-vm-id"},
    ]
    for row in hostile:
        _raw_liveness(store, row)
    # The victim's own relay wrote nothing since 11 min ago... but its row is the forged one
    # now: it is not believed either way, so the victim is not paged.
    # A VM row that is not JSON, for a VM whose (genuine) hint is stale.
    store.vms.upsert_entity(
        {"PartitionKey": vm_partition("garbled"), "RowKey": row_key("garbled"), "data": "{"},
        mode=UpdateMode.REPLACE,
    )
    # An event row that is not JSON, listed as open; an index row that names nothing.
    store.open_event("EV-BAD", clock.now())
    store.events.upsert_entity(
        {"PartitionKey": row_key("EV-BAD"), "RowKey": EVENT_ROW, "data": '{"event_id": 5'},
        mode=UpdateMode.REPLACE,
    )
    store.events.upsert_entity(
        {"PartitionKey": OPEN_EVENTS, "RowKey": "junk", "EventId": 42},
        mode=UpdateMode.REPLACE,
    )

    report = run_watchdog(pipeline)

    assert report.silent == ["quiet"]
    assert _relay_silent(pub) == ["quiet"]
    assert [a.outcome for a in report.approvals] == ["approved"], report.approvals
    assert relay.starts()[-1] == "EV-A"  # (the busy answers before were tries too)
    assert report.expired_rejects == 1
    # 7 liveness rows, the garbled VM row, the bad event row, the junk index row.
    assert report.skipped_rows == 10, report.skipped
    text = " ".join(report.skipped)
    assert stranger in text and vm_id_of("victim") in text
    assert "not verified" in text and "`at` is not unix seconds" in text
    assert "EV-BAD".casefold() in text.casefold() and "junk" in text
    assert row_key("garbled") in text
    # The 7 liveness rows were deleted when seen (issue 27: junk costs one sweep, once);
    # the genuine silent relay's row stays.
    left = {row["RowKey"] for row in store.liveness.table.list_entities()}
    assert stranger not in left and vm_id_of("t1") not in left and vm_id_of("quiet") in left
    # The next sweep: the app's own bad rows it reads are skipped again, nothing announced
    # twice (the junk index row is read by the hourly full listing only: a sweep reads the
    # index through its due filter, which a row with no due time never passes).
    again = run_watchdog(pipeline)
    assert again.silent == [] and again.skipped_rows == 2
    assert _relay_silent(pub) == ["quiet"]


def test_a_vm_whose_row_is_garbage_is_not_blocked(store, clock):
    pipeline, pub = make_pipeline(store, clock)
    for data in ("{", json.dumps({"name": 5, "event_ids": "x"}), "[" * 25_000):
        store.vms.upsert_entity(
            {"PartitionKey": vm_partition("vm9"), "RowKey": row_key("vm9"), "data": data},
            mode=UpdateMode.REPLACE,
        )
        assert store.list_vms() == []  # skipped (and logged) by the readers that list
        result = ingest_message(envelope("vm9", 1, [event("EV-9", resources=("vm9",))]), pipeline)
        assert result.outcome == "processed"
        assert store.get_vm("vm9").event_ids == ["EV-9"]  # replaced by a readable row
    assert pub.transitions("EV-9")[:2] == ["scheduled", "decided"]


def test_a_verified_hint_for_a_vm_without_a_row_is_left_alone(store, clock):
    pipeline, pub = make_pipeline(store, clock)
    write_liveness(store, "never-reported", clock.now() - timedelta(hours=1))
    report = run_watchdog(pipeline)
    assert report.silent == [] and report.skipped_rows == 0 and pub.published == []


def test_without_a_verifier_nothing_in_the_liveness_table_is_believed(store, clock):
    pipeline, pub = make_pipeline(store, clock)
    ingest_message(envelope("vm1", 1, []), pipeline)
    write_liveness(store, "vm1", clock.now())
    pipeline.liveness_verifier = None
    clock.advance(20 * 60)
    assert run_watchdog(pipeline).silent == [] and _relay_silent(pub) == []


def test_forgotten_after_retention_days(store, clock):
    pipeline, _ = make_pipeline(store, clock, retention_days=30)
    ingest_message(envelope("gone", 1, []), pipeline)
    write_liveness(store, "gone", clock.now())
    clock.advance(31 * 86400)
    report = run_watchdog(pipeline)
    assert report.forgotten_vms == ["gone"] and report.silent == []
    assert store.get_vm("gone") is None
    assert store.liveness.get(vm_id_of("gone"), pipeline.liveness_verifier, print) is None


# ------------------------------------------------------------------ the contract's row


def test_partition_and_signature_are_the_contracts():
    vm_id = "8f0c4a3e-1b2d-4c5e-9f60-718293a4b5c6"
    digest = hashlib.sha256(vm_id.encode()).hexdigest()
    assert liveness_partition(vm_id) == f"lv{int(digest[:8], 16) % 8:02d}"
    secret = bytes(range(32))
    message = f"liveness/v1\n{vm_id}\n1700000000\nrelay 2.0".encode()
    assert liveness_signature(secret, vm_id, 1700000000, "relay 2.0") == (
        hmac.new(secret, message, hashlib.sha256).hexdigest()
    )


def _row(vm_id: str, secret: bytes, key_id: str, at: int = 1700000000) -> dict:
    return {
        "PartitionKey": liveness_partition(vm_id),
        "RowKey": vm_id,
        "seen": datetime.fromtimestamp(at, UTC),
        "at": at,
        "relay_version": "r",
        "key_id": key_id,
        "sig": liveness_signature(secret, vm_id, at, "r"),
    }


def test_the_verifier_takes_current_and_previous_keys_only():
    vm_id = "8f0c4a3e-1b2d-4c5e-9f60-718293a4b5c6"
    current, previous = b"c" * 32, b"p" * 32
    kid_c, kid_p = (hashlib.sha256(k).hexdigest()[:16] for k in (current, previous))
    verify = DictVerifier({vm_id: ("web_3", {kid_c: current, kid_p: previous})})
    assert to_hint(_row(vm_id, current, kid_c), verify).name == "web_3"
    assert to_hint(_row(vm_id, previous, kid_p), verify).name == "web_3"
    with pytest.raises(BadHint, match="not verified"):
        to_hint(_row(vm_id, current, kid_p), verify)  # key id and key disagree
    with pytest.raises(BadHint, match="not verified"):
        to_hint(_row(vm_id, ATTACKER_KEY, ATTACKER_KID), verify)
    tampered = {**_row(vm_id, current, kid_c), "relay_version": "other"}
    with pytest.raises(BadHint, match="not verified"):
        to_hint(tampered, verify)

    def broken(_row):
        raise RuntimeError("identities table down")

    with pytest.raises(BadHint, match="verifier failed"):
        to_hint(_row(vm_id, current, kid_c), broken)


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"RowKey": "8F0C4A3E-1B2D-4C5E-9F60-718293A4B5C6"}, "lower-case vmId"),
        ({"PartitionKey": "lv99"}, "bucket"),
        ({"at": True}, "unix seconds"),
        ({"at": 2**40}, "unix seconds"),
        ({"seen": "2026-01-01"}, "date-time"),
        ({"relay_version": None}, "relay_version"),
        ({"key_id": "../../x"}, "key id"),
        ({"sig": "A" * 64}, "hex"),
    ],
)
def test_malformed_rows_are_named(change, why):
    vm_id = "8f0c4a3e-1b2d-4c5e-9f60-718293a4b5c6"
    row = {**_row(vm_id, b"c" * 32, "0" * 16), **change}
    with pytest.raises(BadHint, match=why):
        check_row(row)


def test_the_open_index_lists_a_marked_vm_apart_from_events(store, clock):
    store.open_event("EV-1", clock.now())
    store.mark_vm("web_3", vm_id_of("web_3"), T0.isoformat(), done=True)
    events, marks = store.open_index()
    assert [e for e, _ in events] == ["EV-1"] and store.open_events() == events
    assert marks == [
        {"vm": "web_3", "vm_id": vm_id_of("web_3"), "mark": T0.isoformat(), "done": "yes"}
    ]
    rk = reserved("vm|" + row_key("web_3"))
    assert not rk.startswith(row_key("EV-1")[:1])  # apart from every EventId's key
