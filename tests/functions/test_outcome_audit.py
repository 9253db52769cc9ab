"""An outcome and its audit row are one write (issue 47, the wave's cost): the event row's
conditional write and the audit row go in one entity group transaction of the event's
partition, so an approval's outcome costs one Table request, and the audit row exists
exactly when the outcome it records does, whatever race or deletion happens in between."""

from __future__ import annotations

from datetime import UTC, datetime

from functions.store.records import EventRecord
from functions.store.state import Store

AT = datetime(2026, 12, 4, 12, 0, tzinfo=UTC)


def _record(event_id: str) -> EventRecord:
    return EventRecord(
        event_id=event_id, event_type="Reboot", event_status="Scheduled", first_seen=AT
    )


def _audit(store: Store, event_id: str, outcome: str) -> dict:
    return store.audit_row(
        event_id, at=AT, rule="r", action="approve", outcome=outcome, once=f"o:{outcome}"
    )


def test_a_lost_race_writes_the_audit_row_with_the_retry_once(store: Store) -> None:
    store.mutate_event("EV-OA", lambda _: _record("EV-OA"))
    stale = store.get_event("EV-OA")
    assert stale is not None

    def approve_elsewhere(rec: EventRecord | None) -> EventRecord | None:
        assert rec is not None
        rec.approval_reason = "someone else wrote first"
        return rec

    store.mutate_event("EV-OA", approve_elsewhere)  # stale's ETag is now old

    def outcome(rec: EventRecord | None) -> EventRecord | None:
        assert rec is not None
        rec.approval = "approved"
        return rec

    audit = _audit(store, "EV-OA", "approved via relay:vm")
    row, wrote = store.mutate_event("EV-OA", outcome, known=stale, with_rows=[audit])
    assert wrote and row is not None and row.approval == "approved"
    assert row.approval_reason == "someone else wrote first"  # the retry started afresh
    rows = [r["outcome"] for r in store.audit_rows("EV-OA")]
    assert rows == ["approved via relay:vm"], rows
    # The transaction's ETag guards the next write as a single write's would.
    assert store.get_event("EV-OA").etag == row.etag  # type: ignore[union-attr]


def test_no_write_no_audit_row_and_a_deleted_row_is_no_error(store: Store) -> None:
    store.mutate_event("EV-OB", lambda _: _record("EV-OB"))
    known = store.get_event("EV-OB")
    store.events.delete_entity("ev-ob", "event")
    audit = _audit(store, "EV-OB", "approved via relay:vm")

    def outcome(rec: EventRecord | None) -> EventRecord | None:
        if rec is None:
            return None
        rec.approval = "approved"
        return rec

    row, wrote = store.mutate_event("EV-OB", outcome, known=known, with_rows=[audit])
    assert (row, wrote) == (None, False)
    assert store.audit_rows("EV-OB") == []


def test_audit_rows_kept_in_the_audit_table_by_an_earlier_version_are_still_read(
    store: Store,
) -> None:
    """Deployments upgraded in place keep their audit table until those events expire."""
    store.audit_table.upsert_entity(
        {"PartitionKey": "ev-oc", "RowKey": "20261204T110000.000000Z-o5-x", "outcome": "held"}
    )
    store.audit("EV-OC", at=AT, rule="r", action="approve", outcome="approved via arm")
    outcomes = [r["outcome"] for r in store.audit_rows("EV-OC")]
    assert outcomes == ["held", "approved via arm"], outcomes
    store.delete_events([("", "EV-OC")])
    assert store.audit_rows("EV-OC") == []


def test_a_decision_and_its_redecision_in_one_instant_are_two_audit_rows(store, clock) -> None:
    """A set-mate's view, then the victim's differing one, in the same instant: `decided`
    is announced twice (the second with its own MessageId), and each announcement has its
    audit row. Before, both were keyed by the same time and the second replaced the first
    (the crash explorer's set-mate-text showed the first row only when a crash delayed the
    second)."""
    from functions.model.policy import Policy, Rule
    from functions.pipeline.ingest import ingest_message
    from tests.functions.conftest import envelope, event, make_pipeline

    pipeline, publisher = make_pipeline(
        store, clock, Policy(rules=(Rule(name="h", action="hold"),))
    )
    names = ("vm-m", "vm-v")
    lure = event("EV-OD", "Freeze", resources=names)
    real = event("EV-OD", "Redeploy", resources=names)
    assert ingest_message(envelope("vm-m", 1, [lure], availability_set="s"), pipeline).outcome == (
        "processed"
    )
    assert ingest_message(envelope("vm-v", 1, [real], availability_set="s"), pipeline).outcome == (
        "processed"
    )
    decided = [n for n in publisher.published if n.transition.value == "decided"]
    assert len(decided) == 2, [n.transition for n in publisher.published]
    rows = [r for r in store.audit_rows("EV-OD") if r["outcome"] == "decided"]
    assert len(rows) == 2, rows
    assert "views differ" in rows[-1]["detail"] and "views differ" not in rows[0]["detail"]
