"""The every-minute sweep: it finds, it never does (docs/lifecycle.md).

- Fleet-wide: the policy's state (policy_invalid / policy_valid), retention.
- Per VM: silent relays (from the relays' liveness hints, functions.store.liveness)
  announced once per silence, their recovery, and VMs not heard for RETENTION_DAYS.
- Per event: nothing here. The events due now are found in the open index (one filtered
  query: each reconcile wrote when its event is next due), together with the events of VMs
  that went silent in this sweep, and their keys go to the work queue
  (functions.pipeline.workqueue), where each is reconciled on its own, with its own
  deadline (functions.pipeline.reconcile.reconcile_key). So a sweep's time does not depend
  on any relay, and its Table requests grow with what is due, not with the fleet.

Everything here is "at most once" through the same claims as ingest, so two overlapping
runs (a slow run and the next tick) announce nothing twice.
"""

from __future__ import annotations

import logging
import weakref
from datetime import datetime, timedelta

from pydantic import BaseModel, Field

from functions.model.envelope import TERMINATE
from functions.model.event import Transition
from functions.pipeline.approval_record import ApprovalResult
from functions.pipeline.context import Pipeline
from functions.pipeline.policy_state import sync_policy_state
from functions.pipeline.reconcile import work_queue
from functions.pipeline.relay_recovery import (
    announce_recovery,
    claim_recovery,
    left_behind,
)
from functions.pipeline.silence_groups import Claimed, group_of, publish_groups
from functions.store import claims
from functions.store.keys import row_key
from functions.store.liveness import Budget, LivenessHint
from functions.store.records import VmRecord
from functions.store.rows import BadRow

log = logging.getLogger(__name__)


MAX_MARK_CHECKS = 100  # VMs with silence marks but no stale hint looked at per sweep
MAX_SKIPPED_LISTED = 20  # skipped rows named in the report (all are counted and logged)
# Due events one sweep hands over at most (earliest first; the rest are found next minute).
MAX_DUE_PER_SWEEP = 20_000
# Once an hour the whole open index is listed, to find rows written before it said when
# they are due (or whose due time a lost write never raised).
FULL_LISTING_EVERY = timedelta(hours=1)


class WatchdogReport(BaseModel):
    silent: list[str] = Field(default_factory=list)
    due: int = 0  # events found due
    handed: int = 0  # of those, handed to the work queue (the rest: logged, found again)
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
    per liveness partition returns only silent VMs, one query lists the VMs with silence
    marks, one filtered query the events due now, one range query each finds what
    retention expires (none until the next day once a pass found nothing); then point
    reads of those rows only. A row that is malformed, hostile or not verified is skipped
    and reported (`skipped_rows`), never stops the sweep. Due events go to the work queue;
    without one (single-threaded tests) they are reconciled here in turn and the report
    says what that did."""
    now = pipeline.clock.now()
    out = WatchdogReport()
    try:
        changed = sync_policy_state(pipeline, now)
        out.policy = changed.value if changed else None
    except Exception:  # retried next minute; never stops the sweep
        log.exception("watchdog: policy state")
    keys: list[str] = []
    full = _full_listing_due(pipeline, now)
    try:
        if full:
            listed, marks = pipeline.store.open_index(out.skip)
            keys += [event_id for event_id, _ in listed]
        else:
            marks = pipeline.store.vm_marks(out.skip)
    except Exception:
        log.exception("watchdog: open index")
        marks = []
    try:
        keys += _sweep_vms(pipeline, now, out, marks)
    except Exception:
        log.exception("watchdog: silent relays")
    try:
        keys += [event_id for event_id, _ in pipeline.store.due_events(now, MAX_DUE_PER_SWEEP)]
    except Exception:
        log.exception("watchdog: due events")
    keys = list(dict.fromkeys(keys))
    out.due = len(keys)
    queue = work_queue(pipeline)
    try:
        # A key the queue cannot take is logged and counted there; even a queue that
        # raises (its namespace down) never keeps retention from running.
        out.handed = queue.enqueue(keys, now, sweep=True)
    except Exception:
        log.exception("watchdog: %d due events not handed to the work queue", len(keys))
    for done in getattr(queue, "results", ()):  # reconciled here (no work queue): told
        _tell(out, done)
    try:
        _retention(pipeline, now, out)
    except Exception:
        log.exception("watchdog: retention")
    return out


# Keyed by the Store itself, never by id(): a Store freed and another made at the same
# address (tests make one per test) inherited its predecessor's listing time, and its
# first sweep then skipped the full listing (a fail-closed event never redecided).
_last_full: weakref.WeakKeyDictionary[object, datetime] = weakref.WeakKeyDictionary()


def _full_listing_due(pipeline: Pipeline, now: datetime) -> bool:
    """The whole open index, once per FULL_LISTING_EVERY per host (and at its first sweep)."""
    last = _last_full.get(pipeline.store)
    if last is not None and now - last < FULL_LISTING_EVERY and now >= last:
        return False
    _last_full[pipeline.store] = now
    return True


def _tell(out: WatchdogReport, done: object) -> None:
    """What a reconcile run here did, in the report (the tests read it)."""
    if isinstance(done, BadRow):
        out.skip(done.skipped)
        return
    event_id = getattr(done, "event_id", "")
    published = getattr(done, "published", [])
    out.republished.extend(f"{event_id}:{t.value}" for t in published)
    if Transition.OVERDUE in published:
        out.overdue.append(event_id)
    if getattr(done, "ended", ""):
        out.ended.append(event_id)
    if getattr(done, "redecided", False):
        out.redecided.append(event_id)
    approval = getattr(done, "approval", None)
    if approval is not None:
        out.approvals.append(approval)


def _sweep_vms(
    pipeline: Pipeline, now: datetime, out: WatchdogReport, marks: list[dict[str, str]]
) -> list[str]:
    """Silence from the relays' verified liveness hints, recovery of VMs with silence
    marks, recoveries left unpublished, and VMs not heard for RETENTION_DAYS; returns the
    open events of the VMs found silent in this sweep (their silence may end them: each is
    reconciled as a unit of work). The marks themselves stay in the app's VM rows; the
    open index only lists which VMs have them."""
    store = pipeline.store
    silent_after = timedelta(seconds=pipeline.settings.relay_silent_after_seconds)
    forget_before = now - timedelta(days=pipeline.settings.retention_days)
    marked = {row_key(m["vm"]): m for m in marks}
    silent: set[str] = set()
    keys: list[str] = []
    verify = pipeline.liveness_verifier
    claimed: list[Claimed] = []  # silences claimed in this sweep, announced per group below
    if verify is None:
        log.warning("watchdog: no liveness verifier: no relay is watched for silence")
    else:
        budget = Budget()
        for hint in store.liveness.stale(now - silent_after, verify, out.skip, now, budget):
            try:
                if not hint.current and _superseded(pipeline, hint, now - silent_after, out):
                    continue
                keys += _silent_hint(
                    pipeline, hint, now, out, marked, silent, forget_before, claimed
                )
            except BadRow as exc:
                log.warning("watchdog: skipped %s", exc)
                out.skip(exc.skipped)
            except Exception:
                log.exception("watchdog: VM %.200r", hint.name)
        keys += _announce_claimed(pipeline, claimed, now, out)
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
    return keys


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
    claimed: list[Claimed],
) -> list[str]:
    """A verified hint not seen since the cutoff: forget it, skip it (this silence is
    announced already: no read at all), or look at the VM row and announce the silence.
    Returns the VM's open events when its silence is new (or a scale-in deleted it)."""
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
            return []
    announced = _mark_time(mark) if mark and mark.get("done") else None
    if announced is not None and hint.seen <= announced:
        silent.add(hint.name)  # announced for this silence (published): no read at all
        return []
    vm = store.get_vm(hint.name, strict=True)
    if vm is None:
        return []  # enrolled but no document yet: nothing to watch
    heard = max(hint.seen, vm.last_seen) if vm.last_seen else hint.seen
    if now - heard <= timedelta(seconds=pipeline.settings.relay_silent_after_seconds):
        return []  # heard otherwise since (a document, a Service Bus heartbeat)
    cutoff = now - timedelta(seconds=pipeline.settings.relay_silent_after_seconds)
    if hint.others and _superseded(pipeline, hint, cutoff, out):
        # The anchor's row of a reimaged VM, whose new relay heartbeats under its new key
        # (Liveness.get reads that row once the anchor's is stale): deleted, not silent.
        return []
    vm.last_seen = heard
    silent.add(vm.name)
    deleted = _deleted_by_terminate(pipeline, vm)
    if deleted:
        return deleted  # a scale-in deleted it (expected): its Terminate may end now
    if not _silence_pending(vm, now):
        listed = (
            mark is not None and mark.get("done") and mark.get("mark") == vm.silent_announced_for
        )
        if vm.silent_announced_for is not None and vm.silence_claim == claims.DONE and not listed:
            # Published, but the listing lacks it (written by an older version, or lost):
            # list it as done, so the next sweeps skip this silence without a read.
            store.mark_vm(vm.name, hint.vm_id, vm.silent_announced_for, done=True)
        return []  # announced already
    mark_claimed = _claim_silence(pipeline, vm, now, hint.vm_id)
    if mark_claimed is not None:
        assert vm.last_seen is not None
        key, label = group_of(vm)
        claimed.append(
            Claimed(
                vm.name, hint.vm_id, mark_claimed, vm.last_seen, key, label, tuple(vm.event_ids)
            )
        )
    return []  # its open events are handed over once its silence is announced


def _superseded(
    pipeline: Pipeline, hint: LivenessHint, cutoff: datetime, out: WatchdogReport
) -> bool:
    """A stale row of a previous key: superseded (deleted) when the VM's current key's row
    was written since the cutoff; then the relay is alive and rotated its key. Likewise a
    stale anchor's row, when the VM's other key's row is fresh (a reimaged VM: Liveness.get
    reads that row only once the anchor's is older than RELAY_SILENT_AFTER_SECONDS)."""
    verify = pipeline.liveness_verifier
    assert verify is not None
    silent_after = timedelta(seconds=pipeline.settings.relay_silent_after_seconds)
    now = cutoff + silent_after
    fresh = pipeline.store.liveness.get(
        hint.vm_id, verify, out.skip, silent_after=silent_after, now=now
    )
    if fresh is None or not fresh.current or fresh.seen < cutoff or fresh.row == hint.row:
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
        hint = (
            store.liveness.get(vm_id, verify, out.skip, silent_after=silent_after, now=now)
            if verify and vm_id
            else None
        )
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


# Keyed by the Store, as _last_full: the retention cutoff (a day) at which this host's last
# pass found nothing to expire.
_idle_cutoff: weakref.WeakKeyDictionary[object, str] = weakref.WeakKeyDictionary()


def _retention(pipeline: Pipeline, now: datetime, out: WatchdogReport) -> None:
    """Delete what ended (events, with reporter and audit rows) or was rejected more than
    RETENTION_DAYS ago: found by range queries over day-named partitions, so the work is
    what expires, never a scan of what is kept.

    Once a pass found nothing at a cutoff day, the sweeps until the cutoff moves to the next
    day make no query (two requests of the 13 a quiet sweep makes): rows are filed under
    the day they ended or were rejected, which is not before the cutoff, so nothing new
    expires until midnight. An event closed late under an older day still (a reconcile that
    ran days after the end) is found once the cutoff moves on, at most a day later. A pass
    that found something runs again at the next sweep, as before (a backlog drains at
    `retention_events_per_sweep` a minute)."""
    store = pipeline.store
    day = (now - timedelta(days=pipeline.settings.retention_days)).strftime("%Y-%m-%d")
    if _idle_cutoff.get(store) == day:
        return
    expired = store.expired_events(day, pipeline.settings.retention_events_per_sweep)
    if expired:
        out.retention_requests += store.delete_events(expired)
        out.expired.extend(event_id for _, event_id in expired)
    rejects = store.expired_rejects(day)
    if rejects:
        out.retention_requests += store.delete_rejects(rejects)
        out.expired_rejects = len(rejects)
    if expired or rejects:
        _idle_cutoff.pop(store, None)
    else:
        _idle_cutoff[store] = day


def _deleted_by_terminate(pipeline: Pipeline, vm: VmRecord) -> list[str]:
    """Its last document held a Terminate naming it, still open: the VM was (being)
    deleted, so its silence is expected (not announced) and ends that event. Returns the
    EventIds of those open Terminates (none: not deleted)."""
    found: list[str] = []
    for event_id in vm.event_ids:
        record = pipeline.store.get_event(event_id)
        if (
            record is not None
            and not record.ended
            and record.event_type.casefold() == TERMINATE.casefold()
            and any(name.casefold() == vm.name.casefold() for name in record.resources)
        ):
            found.append(event_id)
    return found


# A silence's announcer publishes within this; after it the next sweep publishes it again
# (the MessageId names the silence, so the topic drops a repeat). Shorter than a sweep's
# period, so the next sweep is the one.
SILENCE_LEASE = timedelta(seconds=30)


def _silence_pending(vm: VmRecord, now: datetime) -> bool:
    """This silence still needs announcing: not claimed yet, or its claim went stale."""
    return vm.silent_announced_for != _mark(vm) or claims.is_expired(vm.silence_claim, now)


def _claim_silence(pipeline: Pipeline, vm: VmRecord, now: datetime, vm_id: str) -> str | None:
    """Once per silence (functions.store.claims): the claim names the last_seen it is for;
    it is marked done after its group's announcement (_announce_claimed), released if that
    fails, redone if stale. `vm.last_seen` is the latest moment heard (the hint's or the VM
    row's); the VM is listed in the open index first, so a marked VM row is never unlisted.
    Returns the silence's mark when this sweep claimed it."""
    assert vm.last_seen is not None
    seen = vm.last_seen
    mark = seen.isoformat()
    pipeline.store.mark_vm(vm.name, vm_id, mark)

    def change(rec: VmRecord | None) -> VmRecord | None:
        if rec is None:
            return None
        heard = max(rec.last_seen, seen) if rec.last_seen else seen
        if heard != seen or not _silence_pending(rec, now):
            return None
        rec.last_seen = heard
        rec.silent_announced_for = mark
        rec.silence_claim = claims.pending(now, SILENCE_LEASE)
        return rec

    _, won = pipeline.store.mutate_vm(vm.name, change)
    return mark if won else None


def _announce_claimed(
    pipeline: Pipeline, claimed: list[Claimed], now: datetime, out: WatchdogReport
) -> list[str]:
    """The silences this sweep claimed, announced once per common-cause group
    (functions.pipeline.silence_groups: one page for a scale set's relays gone silent
    together, not one per VM). Returns the open events of the VMs announced."""
    if not claimed:
        return []
    store = pipeline.store

    def settle(claim: Claimed, done: bool) -> None:
        store.mutate_vm(claim.name, _settle(claim.mark, done=done))
        if done:
            store.mark_vm(claim.name, claim.vm_id, claim.mark, done=True)

    page = Transition.RELAY_SILENT in _page_transitions(pipeline)
    done, _ = publish_groups(claimed, now, page, pipeline.publisher.publish, settle)
    announced = set(done)
    out.silent.extend(c.name for c in claimed if c.name in announced)
    return [e for c in claimed if c.name in announced for e in c.event_ids]


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
