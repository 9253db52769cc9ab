"""The slots' effects: reading and writing the capacity and budget slot rows, by the rules
of functions.pipeline.slot_rules (pure: who holds, who is entitled, who goes next).

The capacity guard allows at most N approved impactful events at once per scale set and
per availability set (`max_concurrent_per_set`), so a maintenance wave never takes a whole
set down together; disruption budgets do the same over any group of VMs (tags, zones,
sets, subscriptions), and where a budget covers every VM of an event it replaces the set
guard. Slots are rows in the events table, taken all-or-nothing under ETags; a listed
holder keeps its slot only while its own row entitles it (`slot_rules.holds_slot`), so a
crash never leaks one and a VM that makes up an event never keeps its set-mates waiting.

The decider (functions.pipeline.reconcile) uses three entry points: `take_slots` before an
approval, `settle_slots` at the end of a reconcile (give back what the row no longer
entitles it to, count a Started event in its budgets), and `release_slots` after an
approval that did not succeed. (An approved event that never started flags its VM in
functions.pipeline.announce, with its `overdue`: no slot is involved.)

Each reads what it needs first (the budget groups covering the event's VMs, from Azure's
placements: `_coverage`), then, row by row, reads the slot row (and its holders' rows when
it is full), has slot_rules decide the change, and writes it under the row's ETag; a row
with no free slot gives back what was taken before it (all or none).
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from functions.model.policy import Policy
from functions.pipeline.slot_rules import (
    SET_FULL,
    SlotFull,
    budget_holders_to_read,
    capacity_keys,
    capacity_limit,
    give_back_budget,
    give_back_set,
    holds_budget,
    holds_slot,
    list_waiting,
    needs_capacity,
    set_full_text,
    set_guard_applies,
    set_holders_to_read,
    take_budget,
    take_set,
    too_big,
    unknown_until,
    vm_still_out,
    wait_for,
    woken_order,
)
from functions.store.records import EventRecord
from functions.store.state import Store

log = logging.getLogger(__name__)


# ------------------------------------------------------------------ the decider's entry points


def take_slots(pipeline: Any, record: EventRecord, now: datetime) -> tuple[bool, bool]:
    """The slots the approval needs, all or none: every disruption budget's group that
    covers its VMs, and its sets' (the capacity guard) unless budgets cover every VM of
    it. Returns (taken, waiting newly recorded): not taken, it waits (the row says for
    what, oldest NotBefore first), and is woken when a slot is given back."""
    store = pipeline.store
    waiting, guard, big = _take(store, record, pipeline.policy, now)
    if not waiting:
        return True, False
    reason = set_full_text(pipeline.policy) if waiting == SET_FULL else waiting
    if record.approval_reason != "capacity" and record.decision is not None:
        # Before the row says so (once per event): a host that dies in between leaves the
        # wait to be found again, and audited again as the same row.
        store.audit(
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
    if guard and not big:
        # Listed in its sets' queues only where their guard applies, and never when it
        # cannot be admitted at all (it would hold back every later NotBefore there).
        for key in capacity_keys(record):
            store.mutate_capacity(key, list_waiting(key, record))
    # The row says why it waits (once; its claim, if this caller held it, given back): due
    # again at the next sweep, or when a slot is given back.
    first: list[bool] = []
    store.mutate_event(record.event_id, wait_for(reason, first), known=record)
    return False, bool(first)


def _take(
    store: Store,
    record: EventRecord,
    policy: Policy | None,
    now: datetime,
    *,
    started: bool = False,
) -> tuple[str, bool, str]:
    """Take every slot the event needs, all or none: ("", ...) when taken, else (what it
    waits for: SET_FULL, or a budget's text; whether the set guard applies; why it can
    never be admitted, or ""). Its sets' (the capacity guard) unless budgets cover every VM
    that reported it (`set_guard_applies`), then every budget slot of its reporters' VMs
    unless it is too big for one of their groups (`too_big`, counting the VMs it names that
    did not report it: one approval starts the event on every VM it names). Each row is
    read, then its holders' rows when it is full, then written by slot_rules' change; a
    full one gives back what was taken before it (the event stays listed where it waits).
    `started`: Azure started it: counted in its budgets' groups, over their limit if full.
    """
    need = _coverage(store, record, policy, now, every_reporter=False, named=not started)
    guard = not started and set_guard_applies(need.reporters, {vm for _s, vm in need.slots})
    big = too_big(need.slots + need.named) if need.slots and not started else ""
    keys, limit = capacity_keys(record) if guard else [], capacity_limit(policy)
    taken: list[str] = []
    waiting = ""
    for key in keys:
        current = store.get_capacity(key)
        rows = {h: store.get_event(h) for h in set_holders_to_read(current, record, limit)}
        try:
            store.mutate_capacity(key, take_set(key, record, current, rows, limit, now))
        except SlotFull:
            waiting = SET_FULL
            break
        taken.append(key)
    counted: list = []
    waiting = waiting or big
    for slot, vm in need.slots if not waiting else []:
        row = store.get_budget_slot(slot.budget, slot.group)
        dead: set[tuple[str, str]] = set()
        for holder in budget_holders_to_read(row, record, slot, vm):
            keeps = holds_budget(holder, store.get_event(holder.event_id), now)
            if keeps is None:  # past its grace: its VM's own document says
                mine = store.get_reporter(holder.event_id, holder.vm)
                keeps = vm_still_out(None if mine is None else mine.status)
            if not keeps:
                dead.add((holder.event_id, holder.vm))
        full: list[str] = []
        change = take_budget(record, slot, vm, dead, now, started, full)
        store.mutate_budget_slot(slot.budget, slot.group, change)
        if full:
            waiting = full[0]
            break
        counted.append((slot, vm))
    # Short of a slot, what it took goes back (all or none): its budgets' slots (taken last)
    # first, then its sets'. Unlike a give-back (`_give_back`), it stays listed in the
    # budgets' queues, where it waits, and wakes no one (who found a row full meanwhile is
    # due again at the next sweep).
    if waiting:
        for slot, _vm in counted:
            undo = give_back_budget(record.event_id, True, [])
            store.mutate_budget_slot(slot.budget, slot.group, undo)
        for key in taken:
            store.mutate_capacity(key, give_back_set(record.event_id, []))
    if big:
        log.warning("%s: %s", record.event_id[:128], big)
    return waiting, guard, big


def _give_back(store: Store, event_id: str, keys: list[str], slots: list) -> list[str]:
    """Give back the event's slots in the set rows `keys`, then in the budget groups of
    `slots`, and its places in their queues; returns the events waiting there, to be woken
    (`slot_rules.woken_order`). (An approval that could not take them all puts back what it
    took in `_take` itself.)"""
    woken: list[str] = []
    for key in keys:
        waiting: list[str] = []
        store.mutate_capacity(key, give_back_set(event_id, waiting))
        woken += waiting
    for slot, _vm in slots:
        waiting = []
        change = give_back_budget(event_id, False, waiting)
        store.mutate_budget_slot(slot.budget, slot.group, change)
        woken += waiting
    return woken_order(event_id, woken)


def settle_slots(
    pipeline: Any, record: EventRecord, now: datetime, *, give_back: bool, count: bool
) -> tuple[list[str], EventRecord | None]:
    """The end of a reconcile's slot work (`Due.give_back`, `Due.count`): its slots given
    back, then a Started event counted in its budgets. Returns (the events waiting for the
    slots given back, to be woken; the row as counted, or None)."""
    woken = release_slots(pipeline, record, now) if give_back else []
    return woken, count_started(pipeline, record, now) if count else None


def release_slots(
    pipeline: Any, record: EventRecord, now: datetime, *, after_attempt: bool = False
) -> list[str]:
    """Give back the event's slots (its sets', then its budgets': those of every VM that
    reported it); returns the events waiting for them, to be woken (earliest NotBefore
    first), but itself. `after_attempt`: an approval that did not succeed; while its
    outcome is unknown (a relay's answer that never came) its slots stay
    (`slot_rules.unknown_until`), said once in the audit. Called only for an event that
    may hold slots (`Due.give_back`, or an approval that took them)."""
    store = pipeline.store
    if after_attempt:
        fresh = store.recent_event(record.event_id) or record
        until = unknown_until(fresh)
        if until is not None and holds_slot(fresh, now):
            _note_unknown(store, fresh, now, until)
            return []
    need = _coverage(store, record, pipeline.policy, now, every_reporter=True)
    return _give_back(store, record.event_id, capacity_keys(record), need.slots)


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


def take_capacity(store: Store, event_id: str, policy: Policy | None, now: datetime) -> bool:
    """The drain workflow's guard, before it takes a VM out of service: the event's slots
    (its sets' and its budgets', as its approval takes them: all or none), or not needed
    (a Terminate, an event that is not impactful, an event with no row). A drained VM is
    out: a budget counts it from its drain, not only from its approval."""
    record = store.get_event(event_id)
    if record is None or not needs_capacity(record):
        return True
    return not _take(store, record, policy, now)[0]


# ------------------------------------------------------------------ disruption budgets

MAX_BUDGET_VMS = 8  # reporters of one event whose budgets an approval takes slots for
MAX_PLACEMENT_AGE = timedelta(hours=12)  # two sync passes missed: the VM is gone


class Coverage(NamedTuple):
    """The budget slots (functions.model.budgets.Slot, VM) of the event's reporters'
    VMs (`slots`), the VMs they were sought for (`reporters`), and the slots of the VMs it
    names that did not report it (`named`: what `slot_rules.too_big` counts beside)."""

    slots: list
    reporters: list[str]
    named: list


def _coverage(
    store: Store,
    record: EventRecord,
    policy: Policy | None,
    now: datetime,
    *,
    every_reporter: bool = False,
    named: bool = False,
) -> Coverage:
    """What the event's budgets cover, read once: for each VM that reported it (its own
    view; one query of its reporter rows, at most MAX_BUDGET_VMS), the groups of every
    operator budget that covers it, from Azure's placements (the identity sync's rows: a
    VM cannot move itself; one read per VM). The default budget over sets stays the set
    rows. `every_reporter`: also VMs that no longer list it (giving back what they took).
    `named`: also the VMs it names that did not report it (at most MAX_BUDGET_VMS in all),
    when any budget covers a reporter."""
    if policy is None or not policy.budgets:
        return Coverage([], [], [])
    from functions.model.budgets import slots_for
    from functions.pipeline.redecide import as_event
    from functions.store.placements import Placements

    rows = store.reporter_rows(record.event_id)
    reporters = [r.vm for r in rows if r.status or every_reporter][:MAX_BUDGET_VMS]
    seen = {vm.casefold() for vm in reporters}
    others = [n for n in record.resources if n.casefold() not in seen] if named else []
    others = others[: max(0, MAX_BUDGET_VMS - len(reporters))]
    budgets, event = policy.budgets, as_event(record)
    placements = Placements(store.service.get_table_client(f"{store.prefix}identities"))

    def covering(vm: str) -> list:
        where = placements.for_name(vm, now, MAX_PLACEMENT_AGE)
        return [(slot, vm) for slot in slots_for(budgets, event, where, placements.size)]

    slots = [slot for vm in reporters for slot in covering(vm)]
    # Named VMs count only beside a reporter's budget slots (none: nothing to count them in).
    beside = [slot for vm in others for slot in covering(vm)] if slots else []
    return Coverage(slots, reporters, beside)


def count_started(pipeline: Any, record: EventRecord, now: datetime) -> EventRecord | None:
    """Azure started it (approved or at NotBefore): it counts in its disruption budgets'
    groups until it ends, over the limit if they are full (a budget delays an approval,
    never Azure), and shown so; marked in the row, once."""
    _take(pipeline.store, record, pipeline.policy, now, started=True)

    def change(rec: EventRecord | None) -> EventRecord | None:
        if rec is None or rec.budget_counted:
            return None
        rec.budget_counted = True
        rec.waiting_for = ""
        return rec

    updated, _ = pipeline.store.mutate_event(record.event_id, change, known=record)
    return updated
