"""The memo of rows a Store last read or wrote: bounded, private copies, never etag-less."""

from __future__ import annotations

from datetime import timedelta

from functions.store.recent import RecentRows
from functions.store.records import VmRecord
from tests.functions.conftest import T0


def _row(name: str, etag: str | None = "W/1") -> VmRecord:
    return VmRecord(name=name, etag=etag, last_seen=T0, event_ids=["E1"])


def test_rows_come_back_as_copies_that_callers_cannot_share():
    memo: RecentRows[VmRecord] = RecentRows(limit=4)
    original = _row("vm1")
    memo.note("vm1", original)
    original.event_ids.append("changed after noting")
    first = memo.recall("vm1")
    assert first is not None and first.event_ids == ["E1"] and first.etag == "W/1"
    first.event_ids.append("changed by a caller")
    assert memo.recall("vm1").event_ids == ["E1"]


def test_the_least_recently_noted_row_goes_first():
    memo: RecentRows[VmRecord] = RecentRows(limit=2)
    memo.note("a", _row("a"))
    memo.note("b", _row("b"))
    memo.note("a", _row("a"))  # noted again: now the newest
    memo.note("c", _row("c"))
    assert memo.recall("b") is None
    assert memo.recall("a") is not None and memo.recall("c") is not None
    assert len(memo) == 2


def test_none_or_a_row_without_an_etag_forgets_the_key():
    memo: RecentRows[VmRecord] = RecentRows(limit=4)
    memo.note("vm1", _row("vm1"))
    memo.note("vm1", _row("vm1", etag=None))  # built, never stored: no write to guard
    assert memo.recall("vm1") is None
    memo.note("vm1", _row("vm1"))
    memo.note("vm1", None)
    assert memo.recall("vm1") is None


def test_a_store_forgets_vm_rows_it_changes_without_reading(store):
    store.mutate_vm("vm1", lambda rec: VmRecord(name="vm1"))
    assert store.recent_vm("vm1") is not None
    store.heard([("vm1", T0 + timedelta(minutes=1), None, "2.0")])
    assert store.recent_vm("vm1") is None  # a merge moved the row's ETag
    assert store.get_vm("vm1").relay_version == "2.0"
    assert store.recent_vm("vm1").relay_version == "2.0"  # a read is remembered
    store.delete_vm("vm1")
    assert store.recent_vm("vm1") is None
    assert store.get_vm("vm1") is None and store.recent_vm("vm1") is None
