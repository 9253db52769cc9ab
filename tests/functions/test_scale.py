"""Fleet scale (issue 11): a 1,000-VM set, a 2,000-event document, retention, and the
watchdog's Table requests at 10 and at 10,000 VMs, counted on the wire (tests/tablecount.py).
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import pytest

from functions.model.policy import Policy, Rule
from functions.pipeline.ingest import ingest_message
from functions.pipeline.watchdog import run_watchdog
from functions.store.events import EVENT_ROW, REPORTER, ended_partition
from functions.store.keys import row_key
from functions.store.state import Store
from tests.functions.conftest import (
    T0,
    Handed,
    envelope,
    event,
    liveness_row,
    make_pipeline,
    make_settings,
    write_liveness,
)
from tests.tablecount import TableCounter

STRING_LIMIT = 64 * 1024  # bytes of one string property (UTF-16)


def name64(i: int) -> str:
    return f"vm-{i:05d}-" + "x" * 55  # 64 characters, as long as a Linux VM name may be


def _string_bytes(entity: dict) -> list[int]:
    return [len(v) * 2 for v in entity.values() if isinstance(v, str)]


def test_a_1000_vm_event_reported_by_300_of_its_vms_is_decided_announced_and_approved_once(
    store, clock, relay
):
    """An event naming 1,000 VMs (the most a document may list), reported by 300 of them
    16 at once: as many concurrent writers as 1,000 would be, at a third of the suite's
    time (make bench's fan-out and fleet phases measure the larger sets)."""
    approve_all = Policy(rules=[Rule(name="all", action="approve", ignore_windows=True)])
    pipeline, publisher = make_pipeline(store, clock, approve_all, approval_budget_seconds=5)
    named = [name64(i) for i in range(1000)]
    vms = named[:300]
    ev = event("EV-BIG", resources=tuple(named), not_before=T0 + timedelta(minutes=15))
    ev["Description"] = "d" * 100_000  # far over the property limit: kept bounded at parse
    bodies = [
        envelope(vm, 1, [ev], availability_set="as-big", callback_url=relay.url) for vm in vms
    ]
    with ThreadPoolExecutor(max_workers=16) as pool:
        outcomes = list(pool.map(lambda b: ingest_message(b, pipeline).outcome, bodies))
    assert outcomes == ["processed"] * len(vms)
    assert publisher.transitions("EV-BIG") == ["scheduled", "decided", "approved"]
    assert publisher.duplicates == []
    assert relay.starts() == ["EV-BIG"]
    outcomes = [r["outcome"] for r in store.audit_rows("EV-BIG")]
    assert outcomes.count("approving") == 1  # decided once
    assert len([o for o in outcomes if o.startswith("approved via")]) == 1
    record = store.get_event("EV-BIG", reporters=True)
    assert record.approval == "approved" and len(record.resources) == 1000
    assert len(record.reporters) == len(vms) and len(record.description) < 2100
    # No property near the 64 KiB limit: the row is split, each reporter is its own row.
    row = store.events.get_entity(row_key("EV-BIG"), EVENT_ROW)
    assert max(_string_bytes(row)) < STRING_LIMIT and "data1" in row
    # Everyone leaves: completed once.
    with ThreadPoolExecutor(max_workers=16) as pool:
        list(pool.map(lambda vm: ingest_message(envelope(vm, 2, []), pipeline), vms))
    assert publisher.transitions("EV-BIG")[-1] == "completed"
    assert publisher.transitions("EV-BIG").count("completed") == 1


def test_a_document_with_2000_events_is_rejected_with_the_reason_never_dead_lettered(store, clock):
    pipeline, publisher = make_pipeline(store, clock)
    ingest_message(envelope("vm1", 1, [event("EV-KEEP", resources=("vm1",))]), pipeline)
    mine = [event(f"EV-{i:04d}", resources=("vm1",)) for i in range(2000)]
    result = ingest_message(envelope("vm1", 2, mine), pipeline)  # returns: completed
    assert result.outcome == "rejected" and "100" in result.reason
    (row,) = list(store.rejected_rows())
    assert row["reason"] == result.reason and len(row["body"]) <= 30_000
    assert publisher.transitions("EV-0001") == []
    # Nothing else changed: the VM's next valid document is processed as usual.
    assert store.get_vm("vm1").event_ids == ["EV-KEEP"]
    clock.advance(1)
    assert ingest_message(envelope("vm1", 3, []), pipeline).outcome == "processed"
    assert publisher.transitions("EV-KEEP")[-1] == "cancelled"


# ------------------------------------------------------------------ retention


def test_retention_deletes_what_expired_and_nothing_else(store, clock):
    pipeline, _ = make_pipeline(store, clock, retention_days=30)
    for name, vm in (("EV-OLD", "vm-old"), ("EV-NEW", "vm-new")):
        ingest_message(envelope(vm, 1, [event(name, resources=(vm,))]), pipeline)
        ingest_message(envelope(vm, 2, []), pipeline)  # cancelled, on T0's day
        write_liveness(store, vm, clock.now())  # its relay's last liveness row
    ingest_message(envelope("vm-open", 1, [event("EV-OPEN", resources=("vm-open",))]), pipeline)
    store.reject(at=clock.now(), reason="old", body="x")
    assert len(store.audit_rows("EV-OLD")) == 1
    # EV-NEW ends 20 days later; EV-OLD's day is then 31 days back when we sweep.
    clock.advance(20 * 86400)
    # Seen by the relay just now (its observation time: when the event ended, issue 40).
    now = clock.now()
    ev = event("EV-NEW2", resources=("vm-new",))
    ingest_message(envelope("vm-new", 3, [ev], observed_at=now), pipeline)
    ingest_message(envelope("vm-new", 4, [], observed_at=now), pipeline)
    write_liveness(store, "vm-new", clock.now())
    ingest_message(envelope("vm-open", 2, [event("EV-OPEN", resources=("vm-open",))]), pipeline)
    store.reject(at=clock.now(), reason="recent", body="y")
    clock.advance(11 * 86400)
    ingest_message(envelope("vm-open", 3, [event("EV-OPEN", resources=("vm-open",))]), pipeline)

    report = run_watchdog(pipeline)
    assert sorted(report.expired) == ["EV-NEW", "EV-OLD"]  # both ended on T0's day
    assert report.expired_rejects == 1 and report.forgotten_vms == ["vm-old"]
    for gone in ("EV-OLD", "EV-NEW"):
        assert store.get_event(gone) is None and store.audit_rows(gone) == []
        assert list(store.events.query_entities(f"PartitionKey eq '{row_key(gone)}'")) == []
    assert store.get_event("EV-NEW2").ended  # ended 11 days ago: kept
    assert store.get_event("EV-OPEN", reporters=True).reporters == {"vm-open": "Scheduled"}
    assert [r["reason"] for r in store.rejected_rows()] == ["recent"]
    assert store.get_vm("vm-old") is None and store.get_vm("vm-new") is not None
    left = [
        r["PartitionKey"]
        for r in store.events.query_entities(
            "PartitionKey ge '%ended|' and PartitionKey lt '%ended}'"
        )
    ]
    assert left == [ended_partition((T0 + timedelta(days=20)).strftime("%Y-%m-%d"))]
    assert run_watchdog(pipeline).expired == []  # nothing twice


# ------------------------------------------------------------------ watchdog cost


def _seed(store: Store, clock, vms: int, ended: int) -> None:
    """`vms` VMs heard just now and `ended` events that ended 40 days ago, written with
    batch transactions (the watchdog must not care how many there are)."""
    store.heard([(f"vm-{i:05d}", clock.now(), f"http://10.0.0.1:{i}", "t") for i in range(vms)])
    # Every relay's liveness row too, heard just now: none is stale, so none is returned.
    rows: dict[str, list[dict]] = {}
    for i in range(vms):
        row = liveness_row(f"vm-{i:05d}", clock.now())
        rows.setdefault(row["PartitionKey"], []).append(row)
    for partition in rows.values():
        for start in range(0, len(partition), 100):
            store.liveness.table.submit_transaction(
                [("upsert", r) for r in partition[start : start + 100]]
            )
    day = (clock.now() - timedelta(days=40)).strftime("%Y-%m-%d")
    index = []
    for i in range(ended):
        pk = row_key(f"OLD-{i:04d}")
        data = {
            "event_id": f"OLD-{i:04d}",
            "event_type": "Reboot",
            "event_status": "Scheduled",
            "first_seen": (clock.now() - timedelta(days=41)).isoformat(),
            "ended": "cancelled",
        }
        store.events.submit_transaction(
            [
                ("upsert", {"PartitionKey": pk, "RowKey": EVENT_ROW, "data": json.dumps(data)}),
                (
                    "upsert",
                    {"PartitionKey": pk, "RowKey": REPORTER + "vm", "vm": "vm", "status": ""},
                ),
            ]
        )
        index.append(
            {"PartitionKey": ended_partition(day), "RowKey": pk, "EventId": f"OLD-{i:04d}"}
        )
    for start in range(0, len(index), 100):
        store.events.submit_transaction([("upsert", e) for e in index[start : start + 100]])


def _sweep_requests(azurite: str, clock, vms: int, ended: int) -> tuple[int, object]:
    seeded = Store.from_connection_string(azurite, f"w{vms}").ensure_tables()
    _seed(seeded, clock, vms, ended)
    with TableCounter(azurite) as counter:
        store = Store.from_connection_string(counter.connection_string, seeded.prefix)
        pipeline, _ = make_pipeline(store, clock)
        for i in range(5):  # 5 active events, reported by 5 of the VMs
            vm = f"vm-{i:05d}"
            ingest_message(envelope(vm, 1, [event(f"ACT-{i}", resources=(vm,))]), pipeline)
        counter.reset()
        pipeline.work_queue = queue = Handed()  # the sweep finds; workers reconcile
        report = run_watchdog(pipeline)
        print(f"watchdog sweep at {vms} VMs: {counter.total()} requests {counter.by_kind()}")
        assert sorted(queue.keys) == [f"ACT-{i}" for i in range(5)]  # due: listed just now
        return counter.total(), report


@pytest.mark.timeout(300)
def test_the_watchdog_costs_the_same_few_requests_at_10_and_at_2500_vms(azurite, clock):
    """Counted: every Table request of one sweep, the retention deletes included. 2,500 VMs
    span three of Table storage's 1,000-row query pages, which is what a cost that grew
    with the fleet would show; `make bench` sweeps 10,000 (watchdog_requests_10k, and
    with 100,000 junk rows watchdog_requests_10k_junk): seeding those costs Azurite about
    a minute, too long for every `make test`."""
    per_sweep = make_settings().retention_events_per_sweep
    small, small_report = _sweep_requests(azurite, clock, 10, ended=20)
    large, large_report = _sweep_requests(azurite, clock, 2_500, ended=200)
    assert small == large <= 30
    # It did its work: retention started on the expired events (a bounded share per
    # sweep), no VM is silent, the 5 active events (due: listed just now) were handed to
    # the work queue, not reconciled by the sweep.
    assert len(small_report.expired) == len(large_report.expired) == per_sweep
    assert large_report.silent == [] and large_report.ended == []


def test_a_row_that_would_not_fit_is_recorded_as_rejected_not_dead_lettered(
    store, clock, monkeypatch
):
    from functions.store import rows as tables

    monkeypatch.setattr(tables, "MAX_CHUNKS", 1)  # as if a row could hold 30,000 characters
    pipeline, publisher = make_pipeline(store, clock)
    names = tuple(name64(i) for i in range(600))  # 39,000 characters of Resources
    result = ingest_message(envelope(names[0], 1, [event("EV-FAT", resources=names)]), pipeline)
    assert result.outcome == "rejected" and "Table size limit" in result.reason
    (row,) = list(store.rejected_rows())
    assert "exceeds" in row["reason"]
    assert publisher.published == []


def test_rows_are_split_by_utf16_units_as_table_storage_counts_them():
    from functions.store.rows import CHUNK_CHARS, _chunks

    text = "😀" * 40_000  # 80,000 UTF-16 units in 40,000 characters
    parts = _chunks(text)
    assert "".join(parts[k] for k in ("data", "data1", "data2")) == text
    assert all(len(p.encode("utf-16-le")) // 2 <= CHUNK_CHARS for p in parts.values())


def test_a_200_vm_set_costs_at_most_4_table_requests_per_document(azurite, clock):
    """200 VMs of one availability set (64-character names) report one event through
    Scheduled, Started and gone, 16 at once: Table requests per document, on the wire."""
    vms = [name64(i) for i in range(200)]
    with TableCounter(azurite) as counter:
        store = Store.from_connection_string(counter.connection_string, "set200").ensure_tables()
        pipeline, publisher = make_pipeline(store, clock)
        counter.reset()
        for sequence, status in ((1, "Scheduled"), (2, "Started"), (3, None)):
            events = [event("EV-SET", status=status, resources=tuple(vms))] if status else []
            bodies = [envelope(vm, sequence, events, availability_set="as-200") for vm in vms]
            with ThreadPoolExecutor(max_workers=16) as pool:
                outcomes = list(pool.map(lambda b: ingest_message(b, pipeline).outcome, bodies))
            assert outcomes == ["processed"] * 200
        per_document = counter.total() / 600
    assert per_document <= 4, counter.by_kind()
    assert publisher.transitions("EV-SET") == ["scheduled", "decided", "started", "completed"]
