"""The slots' effects: reading and writing the capacity and budget slot rows, by the rules
of functions.pipeline.slot_rules (pure: who holds, who is entitled, who goes next).

The capacity guard allows at most N approved impactful events at once per scale set and
per availability set (`max_concurrent_per_set`), so a maintenance wave never takes a whole
set down together; disruption budgets do the same over any group of VMs (tags, zones,
sets, subscriptions), and where a budget covers every VM of an event it replaces the set
guard. Slots are rows in the events table, taken all-or-nothing under ETags; a listed
holder keeps its slot only while its own row entitles it (`slot_rules.holds_slot`), so a
crash never leaks one and a VM that makes up an event never keeps its set-mates waiting.

The decider (functions.pipeline.reconcile) uses four entry points: `take_slots` before an
approval, `release_slots` when the row stops entitling it, `count_started` when Azure
started it, and `flag_unstarted` when an approved event never started.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Any

from functions.identity.facts import normalise_vm_id
from functions.model.event import Transition
from functions.model.policy import Policy
from functions.pipeline.slot_rules import (
    TAKE_GRACE,
    WAKE_AT_MOST,
    ahead_of,
    capacity_keys,
    capacity_limit,
    entitled,
    flags_unstarted,
    holds_slot,
    needs_capacity,
    served_order,
    set_guard_applies,
    too_big,
    unknown_until,
    vm_still_out,
)
from functions.store import claims
from functions.store.records import MAX_WAITING, CapacityRecord, EventRecord, VmRecord
from functions.store.state import Store

log = logging.getLogger(__name__)


# ------------------------------------------------------------------ the decider's entry points


def take_slots(pipeline: Any, record: EventRecord, now: datetime) -> tuple[bool, bool]:
    """The slots the approval needs, all or none: every disruption budget's group that
    covers its VMs, and its sets' (the capacity guard) unless budgets cover every VM of
    it. Returns (taken, waiting newly recorded): not taken, it waits (the row says for
    what, oldest NotBefore first), and is woken when a slot is given back."""
    waiting, guard, big = _acquire(pipeline.store, record, pipeline.policy, now)
    if not waiting:
        return True, False
    # Listed in its sets' queues only where their guard applies, and never when it cannot
    # be admitted at all (it would hold back every later NotBefore there).
    queue = guard and not big
    budget = "" if waiting is _SET_FULL else waiting
    return False, wait_for_slot(pipeline, record, now, (), budget, queue=queue)


_SET_FULL = "its set is full"


def _acquire(
    store: Store, record: EventRecord, policy: Policy | None, now: datetime
) -> tuple[str, bool, bool]:
    """Take every slot the event needs, all or none: ("", ...) when taken, else (what it
    waits for, whether the set guard applies, whether it can never be admitted)."""
    slots, reporters = budget_needs(store, record, policy, now)
    covered = {vm for _slot, vm in slots}
    guard = set_guard_applies(reporters, covered)
    if guard and not acquire_capacity(store, record, policy, now):
        return _SET_FULL, guard, False
    # One approval starts the event on every VM it names (their relays confirm the names
    # against their own IMDS before approving): counted, though only reporters take slots.
    big = too_big(slots + _named_slots(store, record, policy, now, reporters)) if slots else ""
    waiting = big or (acquire_budgets(store, record, slots, now) if slots else "")
    if waiting:
        if big:
            log.warning("%s: %s", record.event_id[:128], big)
        if guard:
            release_capacity(store, record)
    return waiting, guard, bool(big)


def release_slots(
    pipeline: Any, record: EventRecord, now: datetime, *, after_attempt: bool = False
) -> list[str]:
    """Give back the event's slots (its sets' and its budgets'); returns the events
    waiting for them, to be woken (earliest NotBefore first). `after_attempt`: an approval
    that did not succeed; while its outcome is unknown (a relay's answer that never came)
    its slots stay (`slot_rules.unknown_until`), said once in the audit. Called only for
    an event that may hold slots (`Due.give_back`, or an approval that took them)."""
    store = pipeline.store
    if after_attempt:
        fresh = store.recent_event(record.event_id) or record
        until = unknown_until(fresh)
        if until is not None and holds_slot(fresh, now):
            _note_unknown(store, fresh, now, until)
            return []
    woken = release_capacity(store, record)
    slots = budget_slots(store, record, pipeline.policy, now, every_reporter=True)
    if slots:
        woken += release_budgets(store, record, slots)
    return [e for e in dict.fromkeys(woken) if e != record.event_id][:WAKE_AT_MOST]


def _note_unknown(store: Store, record: EventRecord, now: datetime, until: datetime) -> None:
    """Say, once per event, that its approval's outcome is unknown and its slots stay."""
    decision = record.decision
    store.audit(
        record.event_id,
        at=now,
        rule=decision.rule if decision else "",
        action="approve",
        outcome="outcome unknown",
        detail=(
            "a relay's answer never came, so StartRequests may have reached Azure: its "
            f"slots are kept until it is seen Started or until {until.isoformat()}"
        ),
        once="approval:unknown",
        anchor=record.decided_at,
        rank=3,
    )


# ------------------------------------------------------------------ set slots


def acquire_capacity(
    store: Store, record: EventRecord, policy: Policy | None, now: datetime
) -> bool:
    """Take a slot in each of the event's sets, or none at all. Where slots are free but
    events with an earlier NotBefore wait for them, those go first."""
    limit = capacity_limit(policy)
    taken: list[str] = []
    for key in capacity_keys(record):
        if _take(store, key, record, limit, now):
            taken.append(key)
        else:
            for done in taken:
                _give_back(store, done, record.event_id)
            return False
    return True


def wait_for_capacity(store: Store, record: EventRecord) -> None:
    """List the event as waiting in each of its slot rows (one write each, once)."""
    for key in capacity_keys(record):

        def change(rec: CapacityRecord | None, key: str = key) -> CapacityRecord | None:
            rec = rec or CapacityRecord(key=key)
            if record.event_id in rec.waiting or len(rec.waiting) >= MAX_WAITING:
                return None
            rec.waiting[record.event_id] = record.not_before
            return rec

        store.mutate_capacity(key, change)


def _take(store: Store, key: str, record: EventRecord, limit: int, now: datetime) -> bool:
    # Holders no longer entitled (`holds_slot`, from each one's row) free their slot: read
    # only when the slot is full, one point read per holder.
    event_id = record.event_id
    current = store.get_capacity(key)
    holders = [h for h in (current.holders if current else []) if h != event_id]
    taken = current.taken if current else {}
    dead: set[str] = set()
    if len(holders) >= limit:
        dead = {h for h in holders if not entitled(store.get_event(h), taken.get(h), now)}

    def change(rec: CapacityRecord | None) -> CapacityRecord | None:
        rec = rec or CapacityRecord(key=key)
        if event_id in rec.holders:
            return None
        kept = [h for h in rec.holders if h not in dead]
        if limit - len(kept) <= ahead_of(event_id, record.not_before, rec.waiting, now):
            raise _Full
        rec.holders = [*kept, event_id]
        rec.until = {}
        rec.taken = {h: at for h, at in rec.taken.items() if h in rec.holders}
        rec.taken[event_id] = now
        rec.waiting.pop(event_id, None)
        return rec

    try:
        store.mutate_capacity(key, change)
    except _Full:
        return False
    return True


class _Full(Exception):
    pass


def _give_back(store: Store, key: str, event_id: str) -> list[str]:
    """Give the event's slot (and its place in the queue) back; returns the events that
    wait for this slot, earliest NotBefore first."""
    woken: list[str] = []

    def change(rec: CapacityRecord | None) -> CapacityRecord | None:
        woken.clear()
        if rec is None:
            return None
        woken.extend(served_order(rec.waiting))
        if event_id not in rec.holders and event_id not in rec.waiting:
            return None
        rec.holders = [h for h in rec.holders if h != event_id]
        rec.until.pop(event_id, None)
        rec.waiting.pop(event_id, None)
        return rec

    store.mutate_capacity(key, change)
    return [e for e in woken if e != event_id]


def release_capacity(store: Store, record: EventRecord) -> list[str]:
    """Give back the event's slots; returns the events waiting for them (to be woken:
    earliest NotBefore first, a few more than could be admitted)."""
    woken: list[str] = []
    for key in capacity_keys(record):
        woken += _give_back(store, key, record.event_id)
    return list(dict.fromkeys(woken))[:WAKE_AT_MOST]


def take_capacity(store: Store, event_id: str, policy: Policy | None, now: datetime) -> bool:
    """The drain workflow's guard, before it takes a VM out of service: the event's slots
    (its sets' and its budgets', as its approval takes them: all or none), or not needed
    (a Terminate, an event that is not impactful, an event with no row). A drained VM is
    out: a budget counts it from its drain, not only from its approval."""
    record = store.get_event(event_id)
    if record is None or not needs_capacity(record):
        return True
    return not _acquire(store, record, policy, now)[0]


# ------------------------------------------------------------------ disruption budgets

MAX_BUDGET_VMS = 8  # reporters of one event whose budgets an approval takes slots for


def budget_needs(
    store: Store,
    record: EventRecord,
    policy: Policy | None,
    now: datetime,
    *,
    every_reporter: bool = False,
) -> tuple[list, list[str]]:
    """(the budget slots (functions.model.budgets.Slot, VM) the event's disruptive approval
    needs, the VMs they were sought for): for each VM that reported it (its own view; one
    query of its reporter rows, at most MAX_BUDGET_VMS), the groups of every operator
    budget that covers it, from Azure's placements (the identity sync's rows: a VM cannot
    move itself). The default budget over sets stays the set rows above
    (`acquire_capacity`). `every_reporter`: also VMs that no longer list it (giving back
    what they took)."""
    if policy is None or not policy.budgets:
        return [], []
    rows = store.reporter_rows(record.event_id)
    reporters = [r.vm for r in rows if r.status or every_reporter][:MAX_BUDGET_VMS]
    return _slots_of(store, record, policy, now, reporters), reporters


def _named_slots(
    store: Store, record: EventRecord, policy: Policy | None, now: datetime, reporters: list[str]
) -> list:
    """The budget slots of the VMs the event names that have not reported it (at most
    MAX_BUDGET_VMS in all): what `slot_rules.too_big` counts beside the reporters'."""
    if policy is None or not policy.budgets:
        return []
    seen = {vm.casefold() for vm in reporters}
    others = [n for n in record.resources if n.casefold() not in seen]
    others = others[: max(0, MAX_BUDGET_VMS - len(reporters))]
    return _slots_of(store, record, policy, now, others) if others else []


def _slots_of(
    store: Store, record: EventRecord, policy: Policy, now: datetime, vms: list[str]
) -> list:
    """The budget slots (functions.model.budgets.Slot, VM) of `vms`: the groups of every
    operator budget that covers each, from Azure's placements (one read per VM), for both
    the reporters (`budget_needs`) and the VMs named beside them (`_named_slots`)."""
    from functions.model.budgets import slots_for
    from functions.pipeline.redecide import as_event
    from functions.store.placements import Placements

    event = as_event(record)
    placements = Placements(store.service.get_table_client(f"{store.prefix}identities"))
    found: list = []
    for vm in vms:
        where = placements.for_name(vm, now, MAX_PLACEMENT_AGE)
        found += [(slot, vm) for slot in slots_for(policy.budgets, event, where, placements.size)]
    return found


def budget_slots(
    store: Store,
    record: EventRecord,
    policy: Policy | None,
    now: datetime,
    *,
    every_reporter: bool = False,
) -> list:
    """The budget slots of `budget_needs` alone."""
    return budget_needs(store, record, policy, now, every_reporter=every_reporter)[0]


MAX_PLACEMENT_AGE = timedelta(hours=12)  # two sync passes missed: the VM is gone


def _holds_budget(store: Store, holder: Any, now: datetime) -> bool:
    """A budget holder keeps its slot while its event's row entitles it and its VM's own
    document still lists the event (`slot_rules.vm_still_out`)."""
    if not entitled(store.get_event(holder.event_id), holder.since, now):
        return False
    if now < holder.since + TAKE_GRACE:
        return True
    mine = store.get_reporter(holder.event_id, holder.vm)
    return vm_still_out(None if mine is None else mine.status)


def acquire_budgets(
    store: Store, record: EventRecord, slots: list, now: datetime, *, over: bool = False
) -> str:
    """Take every slot in `slots` (all or none); "" when taken, else the text of the first
    full one ("waiting for budget checkout-web (1 of 1: vm-a)"), with the event listed as
    waiting there (oldest NotBefore first). `over`: Azure started it: counted even over
    the limit, and shown so."""
    from functions.store.budget_slots import BudgetHolder, BudgetWaiter

    taken: list = []
    for slot, vm in slots:
        current = store.get_budget_slot(slot.budget, slot.group)
        held = [
            h
            for h in (current.holders if current else [])
            if not (h.event_id == record.event_id and h.vm == vm)
        ]
        dead: set[tuple[str, str]] = set()
        if len(held) >= slot.limit:
            dead = {(h.event_id, h.vm) for h in held if not _holds_budget(store, h, now)}
        full: list[str] = []

        def change(rec, slot=slot, vm=vm, dead=dead, full=full):
            full.clear()
            from functions.store.budget_slots import BudgetSlot

            rec = rec or BudgetSlot(budget=slot.budget, group=slot.group, limit=slot.limit)
            rec.limit = slot.limit
            mine = [h for h in rec.holders if h.event_id == record.event_id and h.vm == vm]
            kept = [h for h in rec.holders if (h.event_id, h.vm) not in dead]
            waiters = {w.event_id: w for w in rec.waiting}
            if mine:
                return None
            queue = {w.event_id: w.not_before for w in rec.waiting}
            ahead = ahead_of(record.event_id, record.not_before, queue, now)
            # Every other holder counts, this event's other VMs too: one event never puts
            # more of a group out than it allows (`slot_rules.too_big` holds it back).
            others = kept
            if not over and slot.limit - len(others) <= ahead:
                full.append(rec.text())
                if record.event_id not in waiters:
                    rec.waiting.append(
                        BudgetWaiter(
                            vm=vm, event_id=record.event_id, not_before=record.not_before, since=now
                        )
                    )
                    rec.holders = kept
                    return rec
                if kept == rec.holders:
                    return None
                rec.holders = kept
                return rec
            rec.holders = [
                *kept,
                BudgetHolder(
                    vm=vm,
                    event_id=record.event_id,
                    since=now,
                    over=len(others) >= slot.limit,
                ),
            ]
            rec.waiting = [w for w in rec.waiting if w.event_id != record.event_id]
            return rec

        store.mutate_budget_slot(slot.budget, slot.group, change)
        if full:
            release_budgets(store, record, taken, keep_waiting=True)
            return full[0]
        taken.append((slot, vm))
    return ""


def release_budgets(
    store: Store, record: EventRecord, slots: list, *, keep_waiting: bool = False
) -> list[str]:
    """Give back the event's budget slots (and its places in their queues, unless
    `keep_waiting`); returns the events waiting there, earliest NotBefore first."""
    woken: list[str] = []
    for slot, _vm in slots:
        waiting: list[str] = []

        def change(rec, waiting=waiting):
            waiting.clear()
            if rec is None:
                return None
            queue = {w.event_id: w.not_before for w in rec.waiting}
            waiting.extend(e for e in served_order(queue) if e != record.event_id)
            holders = [h for h in rec.holders if h.event_id != record.event_id]
            left = (
                rec.waiting
                if keep_waiting
                else [w for w in rec.waiting if w.event_id != record.event_id]
            )
            if holders == rec.holders and left == rec.waiting:
                return None
            rec.holders, rec.waiting = holders, left
            return rec

        store.mutate_budget_slot(slot.budget, slot.group, change)
        woken += waiting
    return list(dict.fromkeys(woken))[:WAKE_AT_MOST]


# ------------------------------------------------------------------ the event row's side
# (what reconcile does to an event row about its slots: functions.pipeline.reconcile)


def wait_for_slot(
    pipeline: Any,
    record: EventRecord,
    now: datetime,
    settle: tuple[Transition, ...],
    budget: str = "",
    *,
    queue: bool = True,
) -> bool:
    """The set (or a disruption budget's group: `budget`, its waiting text) has no free
    slot: the approval waits (the row says why, once; its claim, if this caller held it,
    is given back), and is due again at the next sweep, or when a slot is given back."""
    limit = capacity_limit(pipeline.policy)
    reason = budget or (
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
            rec.approval == "pending"
            and rec.approval_reason == "capacity"
            and rec.waiting_for == reason
        ):
            return rec if marked else None
        first.append(True)
        rec.approval = "pending"
        rec.approval_claim = ""
        rec.approval_reason = "capacity"
        rec.approve_after = None
        rec.waiting_for = reason
        decision = rec.decision
        if decision is not None and "waiting" not in decision.reason:
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
    if queue:
        wait_for_capacity(pipeline.store, record)
    pipeline.store.mutate_event(record.event_id, change, known=record)
    return bool(first)


def count_started(pipeline: Any, record: EventRecord, now: datetime) -> EventRecord | None:
    """Azure started it (approved or at NotBefore): it counts in its disruption budgets'
    groups until it ends, over the limit if they are full (a budget delays an approval,
    never Azure), and shown so; marked in the row, once."""
    slots = budget_slots(pipeline.store, record, pipeline.policy, now)
    if slots:
        acquire_budgets(pipeline.store, record, slots, now, over=True)

    def change(rec: EventRecord | None) -> EventRecord | None:
        if rec is None or rec.budget_counted:
            return None
        rec.budget_counted = True
        rec.waiting_for = ""
        return rec

    updated, _ = pipeline.store.mutate_event(record.event_id, change, known=record)
    return updated


def flag_unstarted(pipeline: Any, record: EventRecord, now: datetime) -> None:
    """An event approved through a VM's relay that Azure never started, by that VM's own
    document (its reporter row: one point read): its relay is not asked to approve again
    for a while (`slot_rules.suspect`)."""
    if not record.approved_by or record.approved_by == "arm" or record.approval != "approved":
        return
    own = pipeline.store.get_reporter(record.event_id, record.approved_by)
    vm = flags_unstarted(record, None if own is None else own.status)
    if not vm:
        return

    def change(rec: VmRecord | None) -> VmRecord | None:
        if rec is None or rec.unstarted == record.event_id:
            return None
        rec.unstarted = record.event_id
        rec.unstarted_at = now
        return rec

    flagged, _ = pipeline.store.mutate_vm(vm, change)
    # And in its identity row, where the approver looks (it reads no VM row for a VM whose
    # own reporter row is fresh: functions.pipeline.relay_phase).
    admission = getattr(pipeline, "admission", None)
    if flagged is None or not flagged.vm_id or admission is None:
        return

    def flag(identity: Any) -> Any:
        if identity is None or identity.unstarted == record.event_id:
            return None
        return identity.model_copy(update={"unstarted": record.event_id, "unstarted_at": now})

    admission.registry.mutate(normalise_vm_id(flagged.vm_id), flag)
