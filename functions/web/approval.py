"""Approving by hand: the one path the JSON API and the approval page share.

A person's approval is recorded like anything else a source sees (docs/lifecycle.md): the
request (`asked_by="manual:<who>"`, `asked_at`) is written on the event row, the event is
made due now, and the event is reconciled, where the one decider carries the request out
like every other approval (the claim under the row's ETag, the relays, the audit, the
announcement), whatever the decision, its window or the slots say. A host that dies after
the request is written leaves it due: the sweep's next unit of work approves it. Refused in
dry run. What the caller shows for each outcome is in `HTTP_STATUS`.

Approving by hand skips the drain (the VM goes while it still serves), so the page offers
"drain, then approve" beside it (`drain_by_hand`): the person's decision replaces the
policy's with a `drain` for every view of the event, announced as a re-decision, and the
event is made due, so the decider runs the drain workflow from the row as it does for a
policy's drain (docs/lifecycle.md) and approves once drained.

`who` is never a name a caller chose (issue 22, property 7):
- on the operators' pages, `operator_actor`: the Entra object id App Service Authentication
  vouches for, with the display name beside it (`oid:<object id> (<name>)`); a display name
  alone names nobody (anyone can call themselves "alice");
- on the function-key API, `FUNCTION_KEY_ACTOR`: whoever holds a function key, which is all
  the host tells us (it does not pass the key's name to a Python worker).
"""

from __future__ import annotations

from functions import telemetry
from functions.model.event import Decision, Transition
from functions.model.policy import ALL_CHANNELS
from functions.pipeline.approval_record import ApprovalResult
from functions.pipeline.approve import why_not
from functions.pipeline.context import Pipeline
from functions.pipeline.due import unannounced_before
from functions.pipeline.reconcile import reconcile_key
from functions.store.records import EventRecord
from functions.store.rows import BadRow
from functions.web.principal import Principal

FUNCTION_KEY_ACTOR = "function-key"
MAX_NAME = 100


def operator_actor(principal: Principal) -> str:
    """`oid:<object id> (<display name>)`: the id is who it is, the name is for people."""
    name = "".join(ch if ch.isprintable() else " " for ch in principal.name)
    name = " ".join(name.split())[:MAX_NAME] or "?"
    return f"oid:{principal.user_id} ({name})"


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
    try:
        record = store.get_event(event_id)
    except BadRow as exc:  # named, never a failed request: nothing can approve it
        why = f"the event's row cannot be read, so it cannot be approved: {exc}"
        raise Refused(409, why) from None
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
    result = _ask(pipeline, record, by)
    telemetry.manual_approval(record.event_id, by, result.outcome, result.detail)
    current = store.recent_event(record.event_id)  # as _ask last read it
    # The same person asking again for an approval made at their request (their first
    # answer lost, say to a crash) is told so (409, already approved), and not audited
    # again: the audit has their request's outcome already.
    again = current is not None and current.approval == "approved" and current.asked_by == by
    if result.outcome == "skipped" and not again:
        store.audit(
            record.event_id,
            at=clock.now(),
            rule="manual",
            action="approve",
            outcome=f"skipped: {result.detail}",
            by=by,
        )
    return result


def _ask(pipeline: Pipeline, record: EventRecord, by: str) -> ApprovalResult:
    """Record the request, make the event due now, and reconcile it here (the person waits
    for the answer); the approval's outcome, or why none was attempted."""
    store, now = pipeline.store, pipeline.clock.now()

    def change(rec: EventRecord | None) -> EventRecord | None:
        if rec is None or rec.ended or rec.started or rec.approval == "approved":
            return None
        rec.asked_by, rec.asked_at = by, now
        return rec

    asked, _ = store.mutate_event(record.event_id, change, known=record)
    if asked is None:
        current = store.get_event(record.event_id)
        return ApprovalResult(event_id=record.event_id, outcome="skipped", detail=why_not(current))
    store.set_due(asked.event_id, now)  # found by the sweep if this host dies here
    done = reconcile_key(pipeline, asked.event_id, by, row=asked, worker=False)
    if done.approval is not None:
        return done.approval
    current = store.get_event(record.event_id)
    if current is None or current.ended or current.started or current.approval == "approved":
        detail = why_not(current)
    elif current.not_before is not None and now >= current.not_before:
        detail = "NotBefore has passed: Azure starts it now, an approval adds nothing"
    elif unannounced_before(current, now, by):
        # Its `decided` is another caller's to publish first (issue 46): that caller, or
        # the event's wake-up once it is out, approves it as asked.
        detail = "its decision is being announced: approved for you once that is out"
    else:
        detail = "another caller is approving it"
    return ApprovalResult(event_id=record.event_id, outcome="skipped", detail=detail)


MANUAL_DRAIN = "manual-drain"


def drain_by_hand(pipeline: Pipeline, event_id: str, who: str) -> str:
    """Ask the bridge to drain the event's VMs, then approve it, for `who`; what happens,
    in words. Refused as `approve_by_hand` is (unknown, unreadable, dry run), and when
    there is nothing left to do (ended, started, approved, or draining already)."""
    store, now = pipeline.store, pipeline.clock.now()
    by = f"manual:{who}"
    try:
        record = store.get_event(event_id)
    except BadRow as exc:
        raise Refused(409, f"the event's row cannot be read: {exc}") from None
    if record is None:
        raise Refused(404, f"unknown event {event_id}")
    load = pipeline.settings.policy
    if load.policy is not None and load.policy.dry_run:
        raise Refused(409, "POLICY__DRY_RUN is on: nothing is drained or approved")
    if record.decision is not None and record.decision.action == "drain":
        return "the policy drains it already: it is approved once drained"
    decision = Decision(
        action="drain",
        rule=MANUAL_DRAIN,
        reason=f"drain, then approve, asked by {by}",
        channels=record.decision.channels if record.decision else ALL_CHANNELS,
        severity="warning",
        page=record.decision.page if record.decision else False,
    )

    def change(rec: EventRecord | None) -> EventRecord | None:
        if rec is None or rec.ended or rec.started or rec.approval == "approved":
            return None
        if rec.decision is not None and rec.decision.action == "drain":
            return None
        # A person's decision speaks for every VM the event names, as a manual approval
        # does: each view's own decision becomes the drain (functions.terminate.targets
        # drains a VM only on its own view's decision).
        for entry in rec.views:
            entry.decision = decision
        rec.decision, rec.decided_at = decision, now
        if rec.announced.pop(Transition.DECIDED.value, None) is not None:
            rec.redecided_at = now  # announced again, with its own MessageId
        if rec.approval == "pending":
            rec.approval, rec.approve_after = "", None
        return rec

    changed, _ = store.mutate_event(record.event_id, change, known=record)
    if changed is None:
        return f"nothing done: {why_not(store.get_event(record.event_id))}"
    store.audit(record.event_id, at=now, rule=MANUAL_DRAIN, action="drain", outcome="asked", by=by)
    store.set_due(changed.event_id, now)  # the decider drains it, then approves
    telemetry.manual_approval(record.event_id, by, "drain_asked", "drain, then approve")
    return "drain asked: the bridge takes it out of service, then approves it"
