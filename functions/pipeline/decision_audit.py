"""The decision's audit row, written once per decision whoever writes it (ingest, a
redelivery, the watchdog, Event Grid): keyed by when the decision was made."""

from __future__ import annotations

from functions.store.records import EventRecord
from functions.store.state import Store


def audit_decision(record: EventRecord, store: Store) -> None:
    """Audit the row's decision: one row per decision, keyed by when it was made, so a
    redelivery or a takeover that audits it again leaves one row. What follows the
    decision (its announcement, the approval and its capacity slot) is not done here:
    the decision's own write holds its intent, and functions.pipeline.reconcile does it."""
    decision = record.decision
    if decision is None:
        return
    outcome = "decided"
    if decision.policy_error:
        outcome = "failed closed: policy invalid"
    elif decision.dry_run:
        outcome = f"dry run: would {decision.action}"
    elif decision.action == "approve" and record.event_status != "Started":
        window = record.approve_after or decision.approve_after
        if window is not None and record.approval != "in_progress":
            outcome = f"waiting for the maintenance window at {window.isoformat()}"
        else:
            outcome = "approving"
    at = record.redecided_at or record.decided_at or record.first_seen
    store.audit(
        record.event_id,
        at=at,
        rule=decision.rule,
        action=decision.action,
        outcome=outcome,
        detail=decision.reason,
        once=f"decision:{at.isoformat()}:{decision.rule}:{decision.action}",
        rank=1,
    )
