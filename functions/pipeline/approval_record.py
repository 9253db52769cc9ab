"""Recording an approval's outcome (functions.pipeline.approve): the event row's
approval fields, its audit row and the marks of the announcements that went out, in one
write; an outcome worth announcing is published first (`record_outcome`).

Apart from the approvers, so the approval's walk, once an approver settled it, goes on
to the record and the announcement and does not return into the module that ran the
approvers (issue 46). The words for how an approval reached Azure (`approval_path`) are
here too: the audit, the announcements and the pages say it alike.
"""

from __future__ import annotations

import logging
from typing import Any, Literal

from pydantic import BaseModel, Field

from functions.model.event import Transition
from functions.pipeline.announce import publish_claimed
from functions.pipeline.approve_arm import ARM
from functions.pipeline.context import Pipeline
from functions.store import claims
from functions.store.recent import copy_record
from functions.store.records import MAX_ATTEMPTS_KEPT, Attempt, EventRecord

log = logging.getLogger(__name__)

Outcome = Literal["approved", "failed", "retry_later", "skipped"]


class ApprovalResult(BaseModel):
    event_id: str
    outcome: Outcome
    vm: str | None = None  # whose relay approved
    detail: str = ""
    attempts: list[Attempt] = Field(default_factory=list)
    imds_status: int | None = None


def approval_path(approved_by: str | None) -> str:
    """How an approval reached Azure, for the audit and announcements: relay:<vm> or arm."""
    return ARM if approved_by == ARM else f"relay:{approved_by}"


def _manual_detail(by: str, outcome: str, vm: str | None, detail: str) -> str:
    who = by.removeprefix("manual:")
    if outcome == "approved":
        return f"approved by {who} (by hand), via {approval_path(vm)}"
    return f"{who} approved by hand, but nothing could approve: {detail}"


def record_outcome(
    pipeline: Pipeline,
    record: EventRecord,
    outcome: Outcome,
    vm: str | None,
    attempts: list[Attempt],
    detail: str,
    by: str,
    imds_status: int | None = None,
    *,
    announce: bool = True,
    settle_marks: tuple[Transition, ...] = (),
    settle_rows: list[dict[str, Any]] | None = None,
) -> ApprovalResult:
    """Record the outcome in one write. An outcome worth announcing is published FIRST
    and written as done in that same write: a crash in between leaves the claim held,
    and whoever takes it over approves again (the relay answers a repeated AttemptId
    from memory, ARM acknowledges once) and publishes again (the topic drops a
    MessageId it has seen), so nothing is lost and nothing happens twice. A publish
    that fails leaves the announcement unclaimed; reconcile announces it later."""
    store, clock = pipeline.store, pipeline.clock
    now = clock.now()
    settle_rows = settle_rows or []
    state = {"approved": "approved", "failed": "failed", "retry_later": "pending"}[outcome]
    transition = {"approved": Transition.APPROVED, "failed": Transition.APPROVAL_FAILED}.get(
        outcome
    )
    announced = False
    if announce and transition is not None and transition.value not in record.announced:
        # A person's approval names them in the announcement too, not only in the audit.
        manual = by.startswith("manual:")
        details = {transition: _manual_detail(by, outcome, vm, detail)} if manual else None
        shown = copy_record(record)
        # Who reports it is not stored on the row (the copy drops it): kept, not reread.
        shown.reporters, shown.past_reporters = dict(record.reporters), list(record.past_reporters)
        shown.approval = state  # type: ignore[assignment]
        shown.approval_reason = detail[:1000]
        shown.approved_by = vm if outcome == "approved" else shown.approved_by
        try:
            publish_claimed(pipeline, shown, [transition], now, details, mark=False)
            announced = True
        except Exception:
            log.exception(
                "%s of %s not published; reconcile retries it", transition, record.event_id
            )

    def change(rec: EventRecord | None) -> EventRecord | None:
        if rec is None:
            return None
        if rec.approval == "approved" and outcome != "approved":
            return None  # someone else succeeded meanwhile; keep their result
        rec.approval = state  # type: ignore[assignment]
        # Done once approved or failed; released for a later try otherwise.
        rec.approval_claim = claims.DONE if outcome in ("approved", "failed") else ""
        rec.approval_reason = detail[:1000]
        rec.approval_attempts = (rec.approval_attempts + attempts)[-MAX_ATTEMPTS_KEPT:]
        if outcome == "approved":
            rec.approved_by = vm
        if outcome == "retry_later":
            rec.approve_after = None
        done = [t.value for t in settle_marks if claims.is_pending(rec.announced.get(t.value))]
        if announced and transition is not None:
            done.append(transition.value)
        claims.finish(rec.announced, done)
        return rec

    decision = record.decision
    audit = store.audit_row(
        record.event_id,
        at=now,
        rule=decision.rule if decision else "",
        action="approve",
        outcome=outcome if outcome != "approved" else f"approved via {approval_path(vm)}",
        detail=detail,
        by=by,
        # Once per outcome: an outcome kept by someone else's write meanwhile (below) is
        # audited on its own, and a takeover that records the same outcome again leaves
        # one audit row.
        once=f"approval:{outcome}:{vm}" if outcome != "retry_later" else "",
        anchor=record.decided_at,
        rank=3,
    )
    # The audit row in the same transaction as the outcome's write (one request; both or
    # neither: a host that dies before it leaves the claim to a takeover, which audits).
    _, wrote = store.mutate_event(
        record.event_id, change, known=record, with_rows=[audit, *settle_rows]
    )
    if not wrote:
        store.put_audit(audit)
    log.info("approval of %s: %s %s", record.event_id, outcome, detail)
    return ApprovalResult(
        event_id=record.event_id,
        outcome=outcome,
        vm=vm,
        detail=detail,
        attempts=attempts,
        imds_status=imds_status if isinstance(imds_status, int) else None,
    )
