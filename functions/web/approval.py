"""Approving by hand: the one path the JSON API and the approval page share.

It goes through `approve_event` like every other approval (the claim under the row's
ETag, the relays, the audit, the announcement), with `by="manual:<who>"`, and refuses in
dry run. What the caller shows for each outcome is in `HTTP_STATUS`.
"""

from __future__ import annotations

from functions import telemetry
from functions.pipeline.approve import ApprovalResult, approve_event
from functions.pipeline.context import Pipeline

HTTP_STATUS = {"approved": 200, "failed": 502, "retry_later": 503, "skipped": 409}


class Refused(Exception):
    """Nothing was attempted; `status` and the message say why."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def approve_by_hand(pipeline: Pipeline, event_id: str, who: str) -> ApprovalResult:
    """Approve now for `who`; Refused if the event is unknown or the policy is in dry run."""
    store, clock = pipeline.store, pipeline.clock
    by = f"manual:{who}"
    record = store.get_event(event_id)
    if record is None:
        raise Refused(404, f"unknown event {event_id}")
    load = pipeline.settings.policy
    if load.policy is not None and load.policy.dry_run:
        store.audit(
            record.event_id,
            at=clock.now(),
            rule="manual",
            action="approve",
            outcome="refused: dry run",
            by=by,
        )
        raise Refused(409, "POLICY__DRY_RUN is on: nothing is approved")
    result = approve_event(record.event_id, pipeline, by=by, force=True)
    telemetry.manual_approval(record.event_id, by, result.outcome, result.detail)
    if result.outcome == "skipped":
        store.audit(
            record.event_id,
            at=clock.now(),
            rule="manual",
            action="approve",
            outcome=f"skipped: {result.detail}",
            by=by,
        )
    return result
