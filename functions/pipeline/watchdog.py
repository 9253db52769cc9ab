"""The every-minute sweep: silent relays, overdue events, deferred approvals, loose ends,
events that failed closed on a policy that is valid now (functions.pipeline.redecide), and
`relay_recovered` announcements a crash or a topic failure left unpublished.

Everything here is "at most once" through the same ETag claims as ingest, so two
overlapping runs (a slow run and the next tick) announce and approve nothing twice.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from pydantic import BaseModel, Field

from functions.model.envelope import SCHEDULED, TERMINATE
from functions.model.event import Notification, Transition
from functions.pipeline.announce import STALE_PENDING, announce, publish_claimed, stale_pending
from functions.pipeline.approve import ApprovalResult, approval_stale_after, approve_event
from functions.pipeline.capacity import acquire_capacity, needs_capacity
from functions.pipeline.context import Pipeline
from functions.pipeline.policy_state import sync_policy_state
from functions.pipeline.redecide import as_event, redecide, should_redecide
from functions.pipeline.relay_recovery import (
    announce_recovery,
    claim_recovery,
    left_behind,
    silence_occurrence,
)
from functions.pipeline.sources.eventgrid_ingest import end_unheard
from functions.pipeline.transitions import after_decision, end_event
from functions.store import claims
from functions.store.records import EventRecord, VmRecord

log = logging.getLogger(__name__)


RETENTION_EVENTS_PER_SWEEP = 100  # expired events deleted per sweep (144,000 a day)
UNLISTED_AFTER = timedelta(minutes=10)  # an open-index row with no event row this old: drop


class WatchdogReport(BaseModel):
    silent: list[str] = Field(default_factory=list)
    overdue: list[str] = Field(default_factory=list)
    approvals: list[ApprovalResult] = Field(default_factory=list)
    ended: list[str] = Field(default_factory=list)
    republished: list[str] = Field(default_factory=list)
    recovered: list[str] = Field(default_factory=list)  # relay_recovered published
    redecided: list[str] = Field(default_factory=list)  # fail-closed decisions replaced
    expired: list[str] = Field(default_factory=list)  # events deleted by retention
    expired_rejects: int = 0
    forgotten_vms: list[str] = Field(default_factory=list)  # not heard for RETENTION_DAYS
    # Table requests the retention deletes took (listing an expired event's rows and the
    # batch deletes): the sweep's own cost is everything else.
    retention_requests: int = 0
    policy: str | None = None  # policy_invalid / policy_valid announced for the fleet


def run_watchdog(pipeline: Pipeline) -> WatchdogReport:
    """One sweep. Its Table requests do not grow with the fleet or its history: one
    filtered query per VM partition returns only VMs due a look (silent, announced silent,
    recovery pending), one query lists the open events, one range query each finds what
    retention expires; then point reads of those rows only."""
    now = pipeline.clock.now()
    out = WatchdogReport()
    try:
        changed = sync_policy_state(pipeline, now)
        out.policy = changed.value if changed else None
    except Exception:  # retried next minute; never stops the sweep
        log.exception("watchdog: policy state")
    silent = _sweep_vms(pipeline, now, out)
    for event_id, listed_at in pipeline.store.open_events():
        try:
            record = pipeline.store.get_event(event_id)
            if record is None:
                if listed_at is None or now - listed_at > UNLISTED_AFTER:
                    pipeline.store.drop_open(event_id)  # its first write never happened
                continue
            if record.ended:
                _close(pipeline, record, now, out)
                continue
            _sweep_event(pipeline, record, now, silent, out)
        except Exception:  # one bad row must not stop the sweep of the others
            log.exception("watchdog: event %s", event_id)
    try:
        _retention(pipeline, now, out)
    except Exception:
        log.exception("watchdog: retention")
    return out


def _sweep_vms(pipeline: Pipeline, now: datetime, out: WatchdogReport) -> set[str]:
    """Silence, recovery after a heartbeat ended a silence, recoveries left unpublished,
    and VMs not heard for RETENTION_DAYS; returns the names of the silent VMs."""
    silent_after = timedelta(seconds=pipeline.settings.relay_silent_after_seconds)
    forget_before = now - timedelta(days=pipeline.settings.retention_days)
    silent: set[str] = set()
    for vm in pipeline.store.vms_due(now - silent_after):
        try:
            if vm.last_seen is not None and vm.last_seen < forget_before:
                pipeline.store.delete_vm(vm.name)
                out.retention_requests += 1
                out.forgotten_vms.append(vm.name)
                continue
            if _is_silent(vm, now, silent_after):
                silent.add(vm.name)
                if not _silence_pending(vm, now) or _deleted_by_terminate(pipeline, vm):
                    continue  # announced already, or a scale-in deleted it (expected)
                if _announce_silence(pipeline, vm, now):
                    out.silent.append(vm.name)
                continue
            if vm.silent_announced_for is not None:
                # Heard again through a heartbeat (which writes without reading): the
                # silence ends here, claimed in the VM row like ingest claims it.
                if _claim_recovery(pipeline, vm.name, now):
                    out.recovered.append(vm.name)
                continue
            mark = left_behind(vm, now)
            if mark is not None:
                announce_recovery(pipeline.store, pipeline.publisher, vm.name, mark, now)
                out.recovered.append(vm.name)
        except Exception:
            log.exception("watchdog: VM %s", vm.name)
    return silent


def _mark(vm: VmRecord) -> str | None:
    return vm.last_seen.isoformat() if vm.last_seen else None


def _claim_recovery(pipeline: Pipeline, name: str, now: datetime) -> bool:
    claimed: list[str] = []

    def change(rec: VmRecord | None) -> VmRecord | None:
        claimed.clear()
        if rec is None or rec.silent_announced_for is None:
            return None
        if rec.silent_announced_for == _mark(rec):
            return None  # not heard since the silence after all
        mark = claim_recovery(rec, now)
        if mark is not None:
            claimed.append(mark)
        return rec

    _, won = pipeline.store.mutate_vm(name, change)
    if not won or not claimed:
        return False
    announce_recovery(pipeline.store, pipeline.publisher, name, claimed[0], now)
    return True


def _close(pipeline: Pipeline, record: EventRecord, now: datetime, out: WatchdogReport) -> None:
    """An ended event still in the open index: its end announcement failed or was cut
    short. Announce it (once), then move it to the ended-on-day index."""
    transition = Transition.COMPLETED if record.ended == "completed" else Transition.CANCELLED
    stale = stale_pending(record, now)
    if stale:
        publish_claimed(pipeline, record, stale, now)
        out.republished.extend(f"{record.event_id}:{t.value}" for t in stale)
    elif transition.value not in record.announced:
        if announce(pipeline, record.event_id, transition, now):
            out.republished.append(f"{record.event_id}:{transition.value}")
    elif record.announced[transition.value] != claims.DONE:
        return  # being announced right now: close it on a later sweep
    pipeline.store.close_event(record.event_id, record.ended_at or now)


def _retention(pipeline: Pipeline, now: datetime, out: WatchdogReport) -> None:
    """Delete what ended (events, with reporter and audit rows) or was rejected more than
    RETENTION_DAYS ago: found by range queries over day-named partitions, so the work is
    what expires, never a scan of what is kept."""
    store = pipeline.store
    day = (now - timedelta(days=pipeline.settings.retention_days)).strftime("%Y-%m-%d")
    expired = store.expired_events(day, RETENTION_EVENTS_PER_SWEEP)
    if expired:
        out.retention_requests += store.delete_events(expired)
        out.expired.extend(event_id for _, event_id in expired)
    rejects = store.expired_rejects(day)
    if rejects:
        out.retention_requests += store.delete_rejects(rejects)
        out.expired_rejects = len(rejects)


def _is_silent(vm: VmRecord, now: datetime, silent_after: timedelta) -> bool:
    return vm.last_seen is not None and now - vm.last_seen > silent_after


def _deleted_by_terminate(pipeline: Pipeline, vm: VmRecord) -> bool:
    """Its last document held a Terminate naming it, so the VM was (being) deleted."""
    for event_id in vm.event_ids:
        record = pipeline.store.get_event(event_id)
        if (
            record is not None
            and record.event_type.casefold() == TERMINATE.casefold()
            and any(name.casefold() == vm.name.casefold() for name in record.resources)
        ):
            return True
    return False


def _silence_pending(vm: VmRecord, now: datetime) -> bool:
    """This silence still needs announcing: not claimed yet, or its claim went stale."""
    return vm.silent_announced_for != _mark(vm) or claims.is_stale(
        vm.silence_claim, now, STALE_PENDING
    )


def _announce_silence(pipeline: Pipeline, vm: VmRecord, now: datetime) -> bool:
    """Once per silence (functions.store.claims): the claim names the last_seen it is for,
    is marked done after the publish, released if the publish fails, redone if stale."""
    assert vm.last_seen is not None
    mark = vm.last_seen.isoformat()

    def change(rec: VmRecord | None) -> VmRecord | None:
        if rec is None or rec.last_seen != vm.last_seen or not _silence_pending(rec, now):
            return None
        rec.silent_announced_for = mark
        rec.silence_claim = claims.pending(now)
        return rec

    _, won = pipeline.store.mutate_vm(vm.name, change)
    if not won:
        return False
    minutes = int((now - vm.last_seen).total_seconds() // 60)
    note = Notification(
        transition=Transition.RELAY_SILENT,
        occurred_at=now,
        vm=vm.name,
        detail=f"relay on {vm.name} silent for {minutes} min (last seen {mark})",
        occurrence=silence_occurrence(vm.last_seen),
        page=Transition.RELAY_SILENT in _page_transitions(pipeline),
    )
    try:
        pipeline.publisher.publish(note)
    except Exception:
        pipeline.store.mutate_vm(vm.name, _settle(mark, done=False))
        raise
    pipeline.store.mutate_vm(vm.name, _settle(mark, done=True))
    return True


def _settle(mark: str, *, done: bool):
    def change(rec: VmRecord | None) -> VmRecord | None:
        if rec is None or rec.silent_announced_for != mark:
            return None
        if done:
            rec.silence_claim = claims.DONE
        else:
            rec.silent_announced_for = None
            rec.silence_claim = ""
        return rec

    return change


def _page_transitions(pipeline: Pipeline) -> tuple[Transition, ...]:
    from functions.model.policy import PagingPolicy

    policy = pipeline.policy
    return policy.page.transitions if policy else PagingPolicy().transitions


def _sweep_event(
    pipeline: Pipeline, record: EventRecord, now: datetime, silent: set[str], out: WatchdogReport
) -> None:
    # 1. Announcements left pending by a crash: republish (the MessageId dedupes).
    stale = stale_pending(record, now)
    if stale:
        publish_claimed(pipeline, record, stale, now)
        out.republished.extend(f"{record.event_id}:{t.value}" for t in stale)
    # A decision whose announcement was released after a failed publish (ingest retries
    # it on the event's next document, but a held event may never get one): announce it.
    unannounced = _unannounced_decision(record)
    if unannounced is not None and announce(pipeline, record.event_id, unannounced, now):
        out.republished.append(f"{record.event_id}:{unannounced.value}")
        return
    # An approval outcome whose announcement failed (the claim was released, and the
    # document that approved it is processed): announce it now.
    outcome = _unannounced_outcome(record)
    if outcome is not None and announce(pipeline, record.event_id, outcome, now):
        out.republished.append(f"{record.event_id}:{outcome.value}")
    # 2. Every reporter silent, and the event is past its start: it ended without word.
    past = record.started or (record.not_before is not None and now >= record.not_before)
    if (past and silent) or record.arm_resource:
        pipeline.store.load_reporters(record)  # one query, only when it can matter
    if past and record.reporters and all(vm in silent for vm in record.reporters):
        for vm in list(record.reporters):
            end_event(
                record.event_id,
                vm,
                pipeline,
                now,
                detail="every VM that reported it went silent",
            )
        out.ended.append(record.event_id)
        return
    # 2b. Only Event Grid reported it, and its end never came (dead-lettered): end it.
    if not record.past_reporters and end_unheard(record, pipeline, now):
        out.ended.append(record.event_id)
        return
    # 3. It failed closed on an invalid policy, and the policy here is valid: decide again.
    if should_redecide(record, pipeline.settings.policy, now):
        _redecide(pipeline, record, now, out)
        return
    scheduled = record.event_status == SCHEDULED and not record.started
    # 4. Still Scheduled after NotBefore: Azure should have started it.
    if scheduled and record.not_before is not None and now > record.not_before:
        if announce(
            pipeline,
            record.event_id,
            Transition.OVERDUE,
            now,
            detail=f"still Scheduled after NotBefore {record.not_before.isoformat()}",
        ):
            out.overdue.append(record.event_id)
        return
    # 5. Deferred approvals: a window opened, capacity freed, or retries remain.
    result = _deferred_approval(pipeline, record, now)
    if result is not None:
        out.approvals.append(result)


def _unannounced_outcome(record: EventRecord) -> Transition | None:
    if record.ended:
        return None
    outcome = {"approved": Transition.APPROVED, "failed": Transition.APPROVAL_FAILED}.get(
        record.approval
    )
    return None if outcome is None or outcome.value in record.announced else outcome


def _unannounced_decision(record: EventRecord) -> Transition | None:
    decision = record.decision
    if decision is None or record.ended:
        return None
    transition = Transition.POLICY_INVALID if decision.policy_error else Transition.DECIDED
    return None if transition.value in record.announced else transition


def _redecide(pipeline: Pipeline, record: EventRecord, now: datetime, out: WatchdogReport) -> None:
    """Replace the fail-closed decision and claim its `decided` in one ETag-guarded write,
    so a second watchdog (or ingest) racing for it finds nothing left to do; then audit,
    announce and approve through the paths a first decision takes."""
    load = pipeline.settings.policy

    def change(rec: EventRecord | None) -> EventRecord | None:
        if rec is None or not should_redecide(rec, load, now):
            return None
        redecide(rec, as_event(rec), load, now)
        claims.take(rec.announced, Transition.DECIDED.value, now)
        return rec

    store = pipeline.store
    updated, won = store.mutate_event(record.event_id, change, known=record)
    if not won or updated is None:
        return
    updated, approve_now = after_decision(updated, as_event(updated), pipeline, now)
    publish_claimed(pipeline, updated, [Transition.DECIDED], now)
    out.redecided.append(record.event_id)
    if approve_now:
        out.approvals.append(_approve(pipeline, record.event_id, now))


def _deferred_approval(
    pipeline: Pipeline, record: EventRecord, now: datetime
) -> ApprovalResult | None:
    if record.ended or record.started or record.decision is None:
        return None
    stale_claim = record.approval == "in_progress" and claims.is_stale(
        record.approval_claim, now, approval_stale_after(pipeline.settings)
    )
    if record.approval != "pending" and not stale_claim:
        return None
    if record.approve_after is not None and record.approve_after > now:
        return None
    policy = pipeline.policy
    if policy is None or policy.dry_run:
        return None
    if (
        (record.approve_after is not None or record.approval_reason == "capacity")
        and needs_capacity(record)
        and not acquire_capacity(pipeline.store, record, policy, now)
    ):
        _mark_capacity_wait(pipeline, record)
        return None
    return _approve(pipeline, record.event_id, now)


def _approve(pipeline: Pipeline, event_id: str, now: datetime) -> ApprovalResult:
    """One watchdog approval: bounded by the budget of one invocation, like ingest's."""
    return approve_event(
        event_id,
        pipeline,
        by="watchdog",
        give_up_at=now + timedelta(seconds=pipeline.settings.approval_budget_seconds),
    )


def _mark_capacity_wait(pipeline: Pipeline, record: EventRecord) -> None:
    def change(rec: EventRecord | None) -> EventRecord | None:
        if rec is None or rec.approval != "pending" or rec.approval_reason == "capacity":
            return None
        rec.approval_reason = "capacity"
        rec.approve_after = None
        return rec

    pipeline.store.mutate_event(record.event_id, change)
