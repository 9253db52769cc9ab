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

Taking and giving back are decided in slot_rules (`acquire`, `give_back_slots`,
`take_budgets`): each asks for the reads and writes it needs, one at a time, deciding
the next from the answers (a full row's holders are read, a write that found no free slot
gives back what was taken), and `_run` answers them from the store. So every decision is
in one pure place, and the rows are read and written exactly as the rules need them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any, TypeVar

from functions.identity.facts import normalise_vm_id
from functions.model.event import Transition
from functions.model.policy import Policy
from functions.pipeline.slot_rules import (
    SET_FULL,
    Ask,
    SlotFull,
    Steps,
    acquire,
    capacity_keys,
    capacity_limit,
    flags_unstarted,
    give_back_slots,
    holds_slot,
    needs_capacity,
    take_budgets,
    unknown_until,
)
from functions.store import claims
from functions.store.records import MAX_WAITING, CapacityRecord, EventRecord, VmRecord
from functions.store.state import Store

log = logging.getLogger(__name__)

T = TypeVar("T")


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
    budget = "" if waiting == SET_FULL else waiting
    return False, wait_for_slot(pipeline, record, now, (), budget, queue=queue)


def _acquire(
    store: Store, record: EventRecord, policy: Policy | None, now: datetime
) -> tuple[str, bool, bool]:
    """Take every slot the event needs, all or none (`slot_rules.acquire`): ("", ...) when
    taken, else (what it waits for, whether the set guard applies, whether it can never
    be admitted)."""
    slots, reporters = budget_needs(store, record, policy, now)
    taken = _run(
        store,
        acquire(record, policy, slots, reporters, now),
        named=lambda: _named_slots(store, record, policy, now, reporters),
    )
    if taken.big:
        log.warning("%s: %s", record.event_id[:128], taken.big)
    return taken.waiting, taken.guard, bool(taken.big)


def _run(store: Store, steps: Steps[T], **reads: Callable[[], list]) -> T:
    """Do the reads and writes the slot rules ask for (`slot_rules.Ask`), in their order,
    each answer sent back to them; returns what they decided. `reads`: the answers to
    asks of slots worked out beside the rows ("named", "slots": `budget_needs`)."""
    answer: Any = None
    while True:
        try:
            ask = steps.send(answer)
        except StopIteration as done:
            return done.value
        answer = _answer(store, ask, reads)


def _answer(store: Store, ask: Ask, reads: dict[str, Callable[[], list]]) -> Any:
    change = ask.change
    if ask.kind == "event":
        return store.get_event(ask.key)
    if ask.kind == "reporter":
        event_id, vm = ask.key
        return store.get_reporter(event_id, vm)
    if ask.kind in reads:
        return reads[ask.kind]()
    if ask.kind == "capacity" and change is None:
        return store.get_capacity(ask.key)
    if ask.kind == "capacity" and change is not None:
        try:
            store.mutate_capacity(ask.key, change)
        except SlotFull:
            return False
        return True
    if ask.kind == "budget":
        budget, group = ask.key
        if change is None:
            return store.get_budget_slot(budget, group)
        return store.mutate_budget_slot(budget, group, change)
    raise ValueError(f"no answer for {ask.kind}")


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
    return _run(
        store,
        give_back_slots(record),
        slots=lambda: budget_slots(store, record, pipeline.policy, now, every_reporter=True),
    )


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
        _run(pipeline.store, take_budgets(record, slots, now, over=True))

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
    for a while (`relay_phase.suspect`)."""
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
