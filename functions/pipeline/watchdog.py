"""The every-minute sweep: silent relays (from the relays' liveness hints,
functions.store.liveness), overdue events, deferred approvals, loose ends,
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
from functions.pipeline.announce import announce
from functions.pipeline.approve import ApprovalResult
from functions.pipeline.capacity import holds_capacity, release_capacity
from functions.pipeline.context import Pipeline
from functions.pipeline.lifecycle import intend_approval
from functions.pipeline.policy_state import sync_policy_state
from functions.pipeline.reconcile import reconcile
from functions.pipeline.redecide import as_event, redecide, should_redecide
from functions.pipeline.relay_recovery import (
    announce_recovery,
    claim_recovery,
    left_behind,
    silence_occurrence,
)
from functions.pipeline.sources.eventgrid_ingest import end_unheard
from functions.pipeline.transitions import end_event, finish_event
from functions.store import claims
from functions.store.keys import row_key
from functions.store.liveness import Budget, LivenessHint
from functions.store.records import EventRecord, VmRecord
from functions.store.rows import BadRow

log = logging.getLogger(__name__)


UNLISTED_AFTER = timedelta(minutes=10)  # an open-index row with no event row this old: drop
MAX_MARK_CHECKS = 100  # VMs with silence marks but no stale hint looked at per sweep
MAX_SKIPPED_LISTED = 20  # skipped rows named in the report (all are counted and logged)


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
    # Rows not believed or not readable (a liveness hint that fails verification, a VM or
    # event row that is not its record): counted, the first few named, each one logged.
    skipped_rows: int = 0
    skipped: list[str] = Field(default_factory=list)

    def skip(self, what: object) -> None:
        self.skipped_rows += 1
        if len(self.skipped) < MAX_SKIPPED_LISTED:
            self.skipped.append(str(what)[:300])


def run_watchdog(pipeline: Pipeline) -> WatchdogReport:
    """One sweep. Its Table requests do not grow with the fleet or its history: one query
    per liveness partition returns only silent VMs, one query of the open index lists the
    open events and the VMs with silence marks, one range query each finds what retention
    expires; then point reads of those rows only. A row that is malformed, hostile or not
    verified is skipped and reported (`skipped_rows`), never stops the sweep."""
    now = pipeline.clock.now()
    out = WatchdogReport()
    try:
        changed = sync_policy_state(pipeline, now)
        out.policy = changed.value if changed else None
    except Exception:  # retried next minute; never stops the sweep
        log.exception("watchdog: policy state")
    try:
        open_events, marks = pipeline.store.open_index(out.skip)
    except Exception:
        log.exception("watchdog: open index")
        open_events, marks = [], []
    silent: set[str] = set()
    try:
        silent = _sweep_vms(pipeline, now, out, marks)
    except Exception:
        log.exception("watchdog: silent relays")
    for event_id, listed_at in open_events:
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
        except BadRow as exc:  # one bad row must not stop the sweep of the others
            log.warning("watchdog: skipped %s", exc)
            out.skip(exc.skipped)
        except Exception:
            log.exception("watchdog: event %.200r", event_id)
    try:
        _retention(pipeline, now, out)
    except Exception:
        log.exception("watchdog: retention")
    return out


def _sweep_vms(
    pipeline: Pipeline, now: datetime, out: WatchdogReport, marks: list[dict[str, str]]
) -> set[str]:
    """Silence from the relays' verified liveness hints, recovery of VMs with silence
    marks, recoveries left unpublished, and VMs not heard for RETENTION_DAYS; returns the
    names of the silent VMs. The marks themselves stay in the app's VM rows; the open
    index only lists which VMs have them."""
    store = pipeline.store
    silent_after = timedelta(seconds=pipeline.settings.relay_silent_after_seconds)
    forget_before = now - timedelta(days=pipeline.settings.retention_days)
    marked = {row_key(m["vm"]): m for m in marks}
    silent: set[str] = set()
    verify = pipeline.liveness_verifier
    if verify is None:
        log.warning("watchdog: no liveness verifier: no relay is watched for silence")
    else:
        budget = Budget()
        for hint in store.liveness.stale(now - silent_after, verify, out.skip, now, budget):
            try:
                if not hint.current and _superseded(pipeline, hint, now - silent_after, out):
                    continue
                _silent_hint(pipeline, hint, now, out, marked, silent, forget_before)
            except BadRow as exc:
                log.warning("watchdog: skipped %s", exc)
                out.skip(exc.skipped)
            except Exception:
                log.exception("watchdog: VM %.200r", hint.name)
    checks = 0
    for key, mark in marked.items():
        if mark["vm"] in silent or checks >= MAX_MARK_CHECKS:
            continue
        checks += 1
        try:
            _marked(pipeline, mark, now, out, silent_after)
        except BadRow as exc:
            log.warning("watchdog: skipped %s", exc)
            out.skip(exc.skipped)
        except Exception:
            log.exception("watchdog: VM %.200r", key)
    return silent


def _mark_time(mark: dict[str, str]) -> datetime | None:
    try:
        return datetime.fromisoformat(mark.get("mark", ""))
    except ValueError:
        return None


def _silent_hint(
    pipeline: Pipeline,
    hint: LivenessHint,
    now: datetime,
    out: WatchdogReport,
    marked: dict[str, dict[str, str]],
    silent: set[str],
    forget_before: datetime,
) -> None:
    """A verified hint not seen since the cutoff: forget it, skip it (this silence is
    announced already: no read at all), or look at the VM row and announce the silence."""
    store = pipeline.store
    mark = marked.get(row_key(hint.name))
    if hint.seen < forget_before:
        vm = store.get_vm(hint.name, strict=True)
        if vm is None or vm.last_seen is None or vm.last_seen < forget_before:
            store.liveness.delete(hint)
            store.delete_vm(hint.name)
            store.unmark_vm(hint.name)
            out.retention_requests += 3
            out.forgotten_vms.append(hint.name)
            return
    announced = _mark_time(mark) if mark and mark.get("done") else None
    if announced is not None and hint.seen <= announced:
        silent.add(hint.name)  # announced for this silence (published): no read at all
        return
    vm = store.get_vm(hint.name, strict=True)
    if vm is None:
        return  # enrolled but no document yet: nothing to watch
    heard = max(hint.seen, vm.last_seen) if vm.last_seen else hint.seen
    if now - heard <= timedelta(seconds=pipeline.settings.relay_silent_after_seconds):
        return  # heard otherwise since (a document, a Service Bus heartbeat)
    vm.last_seen = heard
    silent.add(vm.name)
    if not _silence_pending(vm, now) or _deleted_by_terminate(pipeline, vm):
        listed = (
            mark is not None and mark.get("done") and mark.get("mark") == vm.silent_announced_for
        )
        if vm.silent_announced_for is not None and vm.silence_claim == claims.DONE and not listed:
            # Published, but the listing lacks it (written by an older version, or lost):
            # list it as done, so the next sweeps skip this silence without a read.
            store.mark_vm(vm.name, hint.vm_id, vm.silent_announced_for, done=True)
        return  # announced already, or a scale-in deleted it (expected)
    if _announce_silence(pipeline, vm, now, hint.vm_id):
        out.silent.append(vm.name)


def _superseded(
    pipeline: Pipeline, hint: LivenessHint, cutoff: datetime, out: WatchdogReport
) -> bool:
    """A stale row of a previous key: superseded (deleted) when the VM's current key's row
    was written since the cutoff; then the relay is alive and rotated its key."""
    verify = pipeline.liveness_verifier
    assert verify is not None
    fresh = pipeline.store.liveness.get(hint.vm_id, verify, out.skip)
    if fresh is None or not fresh.current or fresh.seen < cutoff:
        return False
    pipeline.store.liveness.delete(hint)
    return True


def _marked(
    pipeline: Pipeline,
    mark: dict[str, str],
    now: datetime,
    out: WatchdogReport,
    silent_after: timedelta,
) -> None:
    """A VM listed with silence marks whose hint is not stale: heard again through its
    liveness row (the silence ends here, claimed in the VM row as ingest claims it), a
    recovery left unpublished, or a listing whose marks are gone (dropped)."""
    store = pipeline.store
    vm = store.get_vm(mark["vm"], strict=True)
    if vm is None or (vm.silent_announced_for is None and vm.recovery_pending is None):
        store.unmark_vm(mark["vm"])
        return
    if vm.silent_announced_for is not None:
        # Heard since: its verified liveness row, or the VM row's own `seen` (a Service
        # Bus heartbeat merges it without reading, so it cannot end the silence itself).
        verify = pipeline.liveness_verifier
        vm_id = mark.get("vm_id")
        hint = store.liveness.get(vm_id, verify, out.skip) if verify and vm_id else None
        heard = [vm.last_seen] if vm.last_seen else []
        if hint is not None and hint.name.casefold() == vm.name.casefold():
            heard.append(hint.seen)
        latest = max(heard, default=None)
        if latest is None or now - latest > silent_after:
            return  # nothing believable heard lately: still silent as far as we know
        if _claim_recovery(pipeline, vm.name, now, latest):
            out.recovered.append(vm.name)
        return
    left = left_behind(vm, now)
    if left is not None:
        announce_recovery(store, pipeline.publisher, vm.name, left, now)
        out.recovered.append(vm.name)


def _mark(vm: VmRecord) -> str | None:
    return vm.last_seen.isoformat() if vm.last_seen else None


def _claim_recovery(pipeline: Pipeline, name: str, now: datetime, heard: datetime) -> bool:
    claimed: list[str] = []

    def change(rec: VmRecord | None) -> VmRecord | None:
        claimed.clear()
        if rec is None or rec.silent_announced_for is None:
            return None
        if rec.last_seen is None or heard > rec.last_seen:
            rec.last_seen = heard  # the verified hint: the app's own record of it
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
    """An ended event still in the open index: its end (or something claimed before it)
    was not announced, or the host died before moving it. Reconcile announces what is
    due, then moves it to the ended-on-day index."""
    _reconcile(pipeline, record, out)


def _retention(pipeline: Pipeline, now: datetime, out: WatchdogReport) -> None:
    """Delete what ended (events, with reporter and audit rows) or was rejected more than
    RETENTION_DAYS ago: found by range queries over day-named partitions, so the work is
    what expires, never a scan of what is kept."""
    store = pipeline.store
    day = (now - timedelta(days=pipeline.settings.retention_days)).strftime("%Y-%m-%d")
    expired = store.expired_events(day, pipeline.settings.retention_events_per_sweep)
    if expired:
        out.retention_requests += store.delete_events(expired)
        out.expired.extend(event_id for _, event_id in expired)
    rejects = store.expired_rejects(day)
    if rejects:
        out.retention_requests += store.delete_rejects(rejects)
        out.expired_rejects = len(rejects)


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


# A silence claim older than this was left by a sweep that died before publishing: the
# next sweep publishes it again (the MessageId names the silence, so the topic drops a
# repeat). Shorter than a sweep's period, so the next sweep is the one.
SILENCE_IN_FLIGHT = timedelta(seconds=30)


def _silence_pending(vm: VmRecord, now: datetime) -> bool:
    """This silence still needs announcing: not claimed yet, or its claim went stale."""
    return vm.silent_announced_for != _mark(vm) or claims.is_stale(
        vm.silence_claim, now, SILENCE_IN_FLIGHT
    )


def _announce_silence(pipeline: Pipeline, vm: VmRecord, now: datetime, vm_id: str) -> bool:
    """Once per silence (functions.store.claims): the claim names the last_seen it is for,
    is marked done after the publish, released if the publish fails, redone if stale.
    `vm.last_seen` is the latest moment heard (the hint's or the VM row's); the VM is
    listed in the open index first, so a marked VM row is never unlisted."""
    assert vm.last_seen is not None
    mark = vm.last_seen.isoformat()
    pipeline.store.mark_vm(vm.name, vm_id, mark)

    def change(rec: VmRecord | None) -> VmRecord | None:
        if rec is None:
            return None
        heard = max(rec.last_seen, vm.last_seen) if rec.last_seen else vm.last_seen
        if heard != vm.last_seen or not _silence_pending(rec, now):
            return None
        rec.last_seen = heard
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
    pipeline.store.mark_vm(vm.name, vm_id, mark, done=True)
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
    # 1. Every reporter silent, and the event is past its start: it ended without word.
    past = record.started or (record.not_before is not None and now >= record.not_before)
    if past or record.arm_resource:
        pipeline.store.load_reporters(record)  # one query, only when it can matter
    if past and record.past_reporters and not record.reporters and not record.arm_resource:
        # Every reporter's row says it left, yet the event did not end: a host died between
        # the last reporter's leaving and the end (level-triggered: the rows say it is due).
        if finish_event(record.event_id, pipeline, now):
            out.ended.append(record.event_id)
        return
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
    # 1b. Only Event Grid reported it, and its end never came (dead-lettered): end it.
    if not record.past_reporters and end_unheard(record, pipeline, now):
        out.ended.append(record.event_id)
        return
    # 2. It failed closed on an invalid policy, and the policy here is valid: decide again.
    mine = ""
    if should_redecide(record, pipeline.settings.policy, now):
        record, mine = _redecide(pipeline, record, now, out) or (record, "")
    scheduled = record.event_status == SCHEDULED and not record.started
    # 3a. Approved, yet still listed as Scheduled well after: Azure starts an approved event
    # within moments, so its VM is flagged and its slot goes back (issue 32: one VM's own
    # made-up events hold its set's capacity for APPROVED_START_GRACE at most).
    approved_at = _approved_at(record)
    if scheduled and approved_at is not None and now > approved_at + APPROVED_START_GRACE:
        if holds_capacity(record):
            release_capacity(pipeline.store, record)
        minutes = int(APPROVED_START_GRACE.total_seconds() // 60)
        detail = (
            f"approved at {approved_at.isoformat()} via {record.approved_by}, yet still "
            f"listed as Scheduled {minutes} min later: Azure starts an approved event at once, "
            "so its VM's reports are suspect; its capacity slot is given back"
        )
        if announce(pipeline, record.event_id, Transition.OVERDUE, now, detail=detail):
            out.overdue.append(record.event_id)
            return
        _reconcile(pipeline, record, out, approve=False)
        return
    # 3. Still Scheduled after NotBefore: Azure should have started it.
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
        # Announced before (or by a host that died between its claim and the publish):
        # what is pending is published again; nothing is approved past NotBefore.
        _reconcile(pipeline, record, out, approve=False)
        return
    # 4. Whatever else the row says is still due: announcements a crash or a failed publish
    # left behind, a deferred approval (a window opened, capacity freed, a claim whose
    # host died), the same reconcile ingest runs.
    _reconcile(pipeline, record, out, mine=mine)


# How long an approved event may stay Scheduled before it is flagged and its slot freed.
APPROVED_START_GRACE = timedelta(minutes=5)


def _approved_at(record: EventRecord) -> datetime | None:
    if record.approval != "approved":
        return None
    times = [a.at for a in record.approval_attempts if a.vm == record.approved_by]
    return max(times, default=record.decided_at)


def _reconcile(
    pipeline: Pipeline,
    record: EventRecord,
    out: WatchdogReport,
    *,
    approve: bool = True,
    mine: str = "",
) -> None:
    claimed = (Transition.DECIDED,) if mine or record.event_id in out.redecided else ()
    done = reconcile(pipeline, record, by="watchdog", approve=approve, mine=mine, claimed=claimed)
    out.republished.extend(f"{record.event_id}:{t.value}" for t in done.published)
    if done.approval is not None:
        out.approvals.append(done.approval)  # type: ignore[arg-type]


def _redecide(
    pipeline: Pipeline, record: EventRecord, now: datetime, out: WatchdogReport
) -> tuple[EventRecord, str] | None:
    """Replace the fail-closed decision, claim its `decided` and set up the approval's
    intent in one ETag-guarded write, so a second watchdog (or ingest) racing for it
    finds nothing left to do; reconcile then announces and approves."""
    load = pipeline.settings.policy
    dry_run = load.policy is not None and load.policy.dry_run

    mine: list[str] = []

    def change(rec: EventRecord | None) -> EventRecord | None:
        if rec is None or not should_redecide(rec, load, now):
            return None
        redecide(rec, as_event(rec), load, now)
        claims.take(rec.announced, Transition.DECIDED.value, now)
        mine[:] = [intend_approval(rec, dry_run, now)]
        return rec

    store = pipeline.store
    updated, won = store.mutate_event(record.event_id, change, known=record)
    if not won or updated is None:
        return None
    out.redecided.append(record.event_id)
    return updated, mine[0] if mine else ""
