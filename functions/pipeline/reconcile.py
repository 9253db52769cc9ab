"""Level-triggered: what an event still needs is read from its stored row, every time.

The host can die between any two requests and a write can land while its answer is lost;
Service Bus then delivers the message again, to a host with no memory. So no effect may be
reachable only from "the write that made it due" (ARCHITECTURE.md, "Level-triggered").
Ingest (a first delivery or a redelivery), Event Grid and the watchdog all end with the
same `reconcile`, and none of them keeps a list of states it can resume from:

    due(row, policy, now) -> Due          # pure: what is due and not marked done
    reconcile(row): due -> do each part   # every effect idempotent, then marked done

What is due, from the row alone:
- every announcement whose intent is written (a claim still "pending": published by
  the caller that claimed it, or by anyone once it is older than IN_FLIGHT, as the topic
  drops a MessageId it has seen within its duplicate-detection window), and every one
  whose condition holds but was never claimed (a claim released after a failed publish),
  in the order a person reads them: scheduled, started, decided, approved, ... so
  `approved` is never announced before `decided`;
- the approval, whenever the decision says approve and the row is not approved, failed,
  started or ended, its window (if any) has opened, and nobody holds a live claim on it:
  it follows from the decision, not from a write made after it, so a crash between the
  decision and anything after it loses nothing;
- the capacity slot the approval needs, taken just before approving (the slot rows
  forget a holder that ended or lapsed, so a crash never leaks one for good);
- for an ended event, its end announcement, then its capacity slots given back and its
  move out of the open index, only once every announcement is done (a `started` claimed
  just before the end is still published).

The drain workflow keeps its own level (functions.terminate: each step a row, re-run by
the `decided` message's redelivery); the silence of relays is the watchdog's.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

from functions.model.event import Transition
from functions.model.policy import Policy
from functions.pipeline.announce import mark_done, publish_claimed
from functions.pipeline.approve import approval_stale_after, approve_event
from functions.pipeline.capacity import (
    acquire_capacity,
    capacity_limit,
    holds_capacity,
    needs_capacity,
    release_capacity,
)
from functions.pipeline.context import Pipeline
from functions.pipeline.decision_audit import audit_decision
from functions.store import claims
from functions.store.records import EventRecord

log = logging.getLogger(__name__)

# The order announcements are published in when several are due at once.
ORDER = (
    Transition.SCHEDULED,
    Transition.STARTED,
    Transition.POLICY_INVALID,
    Transition.DECIDED,
    Transition.APPROVED,
    Transition.APPROVAL_FAILED,
    Transition.OVERDUE,
    Transition.COMPLETED,
    Transition.CANCELLED,
)


@dataclass(frozen=True)
class Due:
    """What one event row still needs (`due`); empty when nothing."""

    publish: tuple[Transition, ...] = ()  # claimed (intent written), not marked done
    announce: tuple[Transition, ...] = ()  # due, never claimed (or released): claim first
    approve: bool = False
    capacity: bool = False  # the approval takes a slot in its sets first
    close: bool = False  # ended, every announcement done: leave the open index

    def __bool__(self) -> bool:
        return bool(self.publish or self.announce or self.approve or self.close)


def approvable(record: EventRecord, policy: Policy | None) -> bool:
    """The decision asks for an approval, and the row does not have one yet."""
    decision = record.decision
    if decision is None or decision.action != "approve" or decision.policy_error:
        return False
    if decision.dry_run or (policy is not None and policy.dry_run):
        return False
    if record.ended or record.started:
        return False
    return record.approval in ("", "pending", "in_progress")


def window_of(record: EventRecord) -> datetime | None:
    """When the approval may happen: the row's own time once the approval was set up (a
    retry later clears it), else the decision's maintenance window."""
    if record.approval:
        return record.approve_after
    return record.decision.approve_after if record.decision else None


# A claim this fresh is most likely being published by the live host that wrote it (200
# reporters of one event reconcile at once): left to it. A host that died left it older
# than this by the time anyone looks again (a redelivery comes a lock duration, 10 s,
# later). Publishing one twice costs a send the topic drops, nothing more.
IN_FLIGHT = timedelta(seconds=5)


def due(
    record: EventRecord,
    policy: Policy | None,
    now: datetime,
    lease: timedelta,
    mine: str = "",
    claimed: frozenset[Transition] = frozenset(),
) -> Due:
    """Everything `record` still needs, from the row alone (pure). `mine`: the approval
    claim this caller wrote itself (it may act on it without waiting for its lease);
    `claimed`: the announcements it claimed itself (published without waiting)."""

    def owed(key: str, mark: str) -> bool:
        if not claims.is_pending(mark):
            return False
        return key in claimed or claims.is_stale(mark, now, IN_FLIGHT)

    pending = [t for t in ORDER if owed(t.value, record.announced.get(t.value, ""))]
    known = {t.value for t in ORDER}
    pending += [
        Transition(key)
        for key, mark in record.announced.items()
        if key not in known and key in Transition._value2member_map_ and owed(key, mark)
    ]
    missing = [t for t in _conditions(record) if t.value not in record.announced]
    approve = approvable(record, policy)
    if approve and record.approval == "in_progress":
        held = record.approval_claim
        approve = held == mine or claims.is_stale(held, now, lease) or not claims.is_pending(held)
    window = window_of(record) if approve else None
    if window is not None and window > now:
        approve = False
    capacity = approve and needs_capacity(record)
    unsent = [m for m in record.announced.values() if claims.is_pending(m)]
    close = bool(record.ended) and not unsent and not missing
    return Due(
        publish=tuple(pending),
        announce=tuple(missing),
        approve=approve,
        capacity=capacity,
        close=close,
    )


def _conditions(record: EventRecord) -> list[Transition]:
    """The announcements the row's facts call for (claimed or not), in ORDER."""
    out: list[Transition] = [Transition.STARTED if record.started else Transition.SCHEDULED]
    decision = record.decision
    if decision is not None:
        out.append(Transition.POLICY_INVALID if decision.policy_error else Transition.DECIDED)
    if record.approval == "approved":
        out.append(Transition.APPROVED)
    elif record.approval == "failed":
        out.append(Transition.APPROVAL_FAILED)
    if record.ended:
        out.append(Transition.COMPLETED if record.ended == "completed" else Transition.CANCELLED)
    if record.ended:
        # Only the end and what was claimed before it: a decision never announced for an
        # event that is over is not news any more.
        return [t for t in out if t in (Transition.COMPLETED, Transition.CANCELLED)]
    return out


@dataclass
class Reconciled:
    """What one reconcile did (for logs, results and tests)."""

    event_id: str
    published: list[Transition]
    approval: object | None = None  # functions.pipeline.approve.ApprovalResult
    waiting_for_capacity: bool = False
    closed: bool = False


def reconcile(
    pipeline: Pipeline,
    record: EventRecord,
    *,
    by: str = "policy",
    mine: str = "",
    claimed: tuple[Transition, ...] | list[Transition] = (),
    approve: bool = True,
    details: dict[Transition, str] | None = None,
) -> Reconciled:
    """Do what `due` says `record` still needs. `record` is the row as last read or
    written (its ETag guards every write, so a stale copy costs a re-read, never a wrong
    write). Raises when the topic or storage fails (the message is redelivered, or the
    next sweep runs it again); approval trouble is an outcome, never raised."""
    store, now = pipeline.store, pipeline.clock.now()
    settings, policy = pipeline.settings, pipeline.policy
    plan = due(record, policy, now, approval_stale_after(settings), mine, frozenset(claimed))
    out = Reconciled(record.event_id, [])
    if plan.announce:
        record = _claim(pipeline, record, plan.announce, now) or record
    sending = [t for t in ORDER if t in plan.publish or t in plan.announce]
    sending += [t for t in plan.publish if t not in ORDER]
    sending = [t for t in sending if claims.is_pending(record.announced.get(t.value))]
    go = plan.approve and approve
    # Approving next: the done-marks ride on the write that records the approval.
    defer = tuple(sending) if go else ()
    decided = {Transition.DECIDED, Transition.POLICY_INVALID} & set(sending)
    if decided:
        # The decision's audit goes with its announcement: both are due until the
        # announcement is done, so a host that dies between the decision and its audit
        # leaves it due (the row is keyed once per decision).
        audit_decision(record, store)
    if sending:
        try:
            publish_claimed(pipeline, record, sending, now, details, mark=not defer)
        except Exception:
            if go and mine and record.approval_claim == mine:
                _give_back_approval(pipeline, record.event_id, mine)
            raise
        out.published = sending
        if not defer:
            record = store.recent_event(record.event_id) or record
            if record.ended:  # its end announced just now: it may leave the open index
                plan = due(record, policy, now, approval_stale_after(settings), mine)
    if plan.close:
        if holds_capacity(record):
            # Its slots go back before it leaves the open index (a host that died after
            # the end's write leaves this due; giving back twice is harmless).
            release_capacity(store, record)
        store.close_event(record.event_id, record.ended_at or now)
        out.closed = True
        return out
    if not go:
        return out
    if plan.capacity and not acquire_capacity(store, record, policy, now):
        out.waiting_for_capacity = _wait_for_capacity(pipeline, record, now, defer)
        return out
    result = approve_event(
        record.event_id,
        pipeline,
        by=by,
        give_up_at=now + timedelta(seconds=settings.approval_budget_seconds),
        claimed=record if mine and record.approval_claim == mine else None,
        settle=defer,
    )
    if result.outcome == "skipped" and defer:
        mark_done(store, record.event_id, defer)
    out.approval = result
    return out


def _claim(
    pipeline: Pipeline, record: EventRecord, transitions: tuple[Transition, ...], now: datetime
) -> EventRecord | None:
    """Claim announcements that are due and not claimed, in one write."""

    def change(rec: EventRecord | None) -> EventRecord | None:
        if rec is None:
            return None
        wanted = set(_conditions(rec))
        took = [t for t in transitions if t in wanted and claims.take(rec.announced, t.value, now)]
        return rec if took else None

    updated, _ = pipeline.store.mutate_event(record.event_id, change, known=record)
    return updated


def _wait_for_capacity(
    pipeline: Pipeline, record: EventRecord, now: datetime, settle: tuple[Transition, ...]
) -> bool:
    """The set has no free slot: the approval waits (the row says why, once; its claim,
    if this caller held it, is given back), and the watchdog tries again each sweep."""
    limit = capacity_limit(pipeline.policy)
    reason = (
        f"waiting: {limit} impactful event(s) already approved in its scale set / availability set"
    )
    first: list[bool] = []

    def change(rec: EventRecord | None) -> EventRecord | None:
        first.clear()
        if rec is None:
            return None
        marked = claims.finish(
            rec.announced,
            [t.value for t in settle if claims.is_pending(rec.announced.get(t.value))],
        )
        if rec.approval not in ("", "pending", "in_progress") or (
            rec.approval == "pending" and rec.approval_reason == "capacity"
        ):
            return rec if marked else None
        first.append(True)
        rec.approval = "pending"
        rec.approval_claim = ""
        rec.approval_reason = "capacity"
        rec.approve_after = None
        decision = rec.decision
        if decision is not None and "waiting:" not in decision.reason:
            rec.decision = decision.model_copy(update={"reason": f"{decision.reason}; {reason}"})
        return rec

    if record.approval_reason != "capacity" and record.decision is not None:
        # Before the row says so (once per event): a host that dies in between leaves the
        # wait to be found again, and audited again as the same row.
        pipeline.store.audit(
            record.event_id,
            at=now,
            rule=record.decision.rule,
            action="approve",
            outcome="waiting for capacity",
            detail=reason,
            once="capacity",
            anchor=record.decided_at,
            rank=2,
        )
    pipeline.store.mutate_event(record.event_id, change, known=record)
    return bool(first)


def _give_back_approval(pipeline: Pipeline, event_id: str, mine: str) -> None:
    """The topic failed before the approval this caller claimed could follow its
    announcements: the claim goes back, so the redelivery approves at once instead of
    waiting for the claim's lease."""

    def change(rec: EventRecord | None) -> EventRecord | None:
        if rec is None or rec.approval != "in_progress" or rec.approval_claim != mine:
            return None
        rec.approval = "pending"
        rec.approval_claim = ""
        return rec

    pipeline.store.mutate_event(event_id, change)
