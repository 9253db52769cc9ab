"""The capacity guard: at most N approved impactful events at once per scale set and per
availability set, so a maintenance wave never takes a whole set down together.

Slots are rows in the events table's capacity partition, taken all-or-nothing under ETags.
Whether a listed holder still holds its slot is decided from the holder's own row, by one
rule every taker applies (`holds_slot`), never by a lapse computed from what a VM reported
(its NotBefore, up to a week out): a holder holds while its approval is in flight, for
APPROVED_START_GRACE after it was approved, while its drain runs, and while it is Started
(its duration and STARTED_GRACE from when it started), and for TAKE_GRACE after it took
the slot (the approval's claim is written just after). A vetoed, failed, pending or
never-started approval holds nothing, so a VM that makes up an event and refuses its
approval never keeps its set-mates waiting, and a crash never leaks a slot.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from functions.model.envelope import PREEMPT, TERMINATE, ScheduledEvent
from functions.model.event import Transition
from functions.model.policy import Policy, is_impactful
from functions.store import claims
from functions.store.records import MAX_WAITING, CapacityRecord, EventRecord, VmRecord
from functions.store.state import Store

# Types after which the VM is gone (evicted, deleted): never flagged for not starting.
GONE_AFTER = frozenset(t.casefold() for t in (PREEMPT, TERMINATE))

# How long an approved event may stay Scheduled before its VM is suspect: Azure starts an
# approved event within moments, so after this its slot goes back and `overdue` says why.
APPROVED_START_GRACE = timedelta(minutes=5)
# How long a drain holds its event's slots at most (its steps are bounded by their own
# timeouts; a drain that outlives this has failed or is holding, and holds nothing).
DRAIN_HOLD = timedelta(minutes=30)
# Beyond the event's own duration, how long a Started event keeps its slots.
STARTED_GRACE = timedelta(minutes=30)
WAKE_AT_MOST = 20  # waiting events a released slot wakes at once (the rest: next sweep)
# A holder listed moments ago whose own row does not show it yet: the slots are taken
# before the approval's claim is written (a Table request or two later), so a taker in
# between must not read the new holder as not entitled and take its slot (the budget
# bench saw three out of two). A host that dies in between leaves it listed this long.
TAKE_GRACE = timedelta(seconds=30)


def approved_at(record: EventRecord) -> datetime | None:
    """When the approval that stands succeeded (its attempt's time)."""
    if record.approval != "approved":
        return None
    times = [a.at for a in record.approval_attempts if a.vm == record.approved_by]
    return max(times, default=record.decided_at)


def holds_slot(record: EventRecord | None, now: datetime) -> bool:
    """Whether an event listed as a slot's holder is entitled to it now (see the module
    docstring). Every taker applies it to the holders it finds, so a slot goes back the
    moment its holder stops being one."""
    if record is None or record.ended:
        return False
    if record.started:
        began = record.started_at
        if began is None:
            return True
        impact = timedelta(seconds=max(record.duration_in_seconds or 0, 0))
        return now < began + impact + STARTED_GRACE
    if record.approval == "in_progress":
        return not claims.is_expired(record.approval_claim, now)
    if record.approval == "approved":
        at = approved_at(record)
        return at is not None and now < at + APPROVED_START_GRACE
    decision = record.decision
    if decision is not None and decision.action == "drain" and record.approval in ("", "pending"):
        since = record.decided_at or record.first_seen
        before = record.not_before is None or now < record.not_before
        return before and now < since + DRAIN_HOLD
    return False


def entitled(record: EventRecord | None, taken_at: datetime | None, now: datetime) -> bool:
    """`holds_slot`, or listed as a holder less than TAKE_GRACE ago."""
    return holds_slot(record, now) or (taken_at is not None and now < taken_at + TAKE_GRACE)


def needs_capacity(event: ScheduledEvent | EventRecord) -> bool:
    """Only impactful events count, and Terminate does not: a deletion is what the scale
    set's owner asked for, and holding it back would only delay it to NotBefore."""
    if event.event_type.casefold() == TERMINATE.casefold():
        return False
    if isinstance(event, EventRecord):
        probe = ScheduledEvent(
            EventId=event.event_id,
            EventStatus=event.event_status,
            EventType=event.event_type,
            DurationInSeconds=event.duration_in_seconds,
        )
        return is_impactful(probe)
    return is_impactful(event)


def capacity_limit(policy: Policy | None) -> int:
    return policy.max_concurrent_per_set if policy else 1


def capacity_keys(record: EventRecord) -> list[str]:
    return [f"ss:{s}" for s in record.scale_sets] + [f"as:{a}" for a in record.availability_sets]


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


def _first(record: EventRecord, waiting: dict[str, datetime | None], now: datetime) -> int:
    """How many listed waiters go before `record`: an earlier NotBefore still ahead."""
    mine = record.not_before or datetime.max.replace(tzinfo=now.tzinfo)
    return sum(
        1
        for other, nb in waiting.items()
        if other != record.event_id and nb is not None and now < nb < mine
    )


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
        if limit - len(kept) <= _first(record, rec.waiting, now):
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
        woken.extend(sorted(rec.waiting, key=lambda e: (rec.waiting[e] is None, rec.waiting[e])))
        if event_id not in rec.holders and event_id not in rec.waiting:
            return None
        rec.holders = [h for h in rec.holders if h != event_id]
        rec.until.pop(event_id, None)
        rec.waiting.pop(event_id, None)
        return rec

    store.mutate_capacity(key, change)
    return [e for e in woken if e != event_id]


def holds_capacity(record: EventRecord) -> bool:
    """Whether the event may hold a slot: an `approve` decision takes one (in ingest or the
    watchdog), a `drain` one before its drain (functions.terminate.workflow), so ending a
    held event need not read the slots. A slot left behind anyway (a crash) is freed by
    `_take`, which drops ended holders."""
    return record.decision is not None and record.decision.action in ("approve", "drain")


def release_capacity(store: Store, record: EventRecord) -> list[str]:
    """Give back the event's slots; returns the events waiting for them (to be woken:
    earliest NotBefore first, a few more than could be admitted)."""
    woken: list[str] = []
    for key in capacity_keys(record):
        woken += _give_back(store, key, record.event_id)
    return list(dict.fromkeys(woken))[:WAKE_AT_MOST]


def take_capacity(store: Store, event_id: str, policy: Policy | None, now: datetime) -> bool:
    """The drain workflow's guard: its event's slots taken (all or none), or not needed (a
    Terminate, an event that is not impactful, an event with no row)."""
    record = store.get_event(event_id)
    if record is None or not needs_capacity(record):
        return True
    return acquire_capacity(store, record, policy, now)


# ------------------------------------------------------------------ disruption budgets

MAX_BUDGET_VMS = 8  # reporters of one event whose budgets an approval takes slots for


def budget_slots(
    store: Store,
    record: EventRecord,
    policy: Policy | None,
    now: datetime,
    *,
    every_reporter: bool = False,
) -> list:
    """The budget slots (functions.model.budgets.Slot, VM) the event's disruptive approval
    needs: for each VM that reported it (its own view; one query of its reporter rows, at
    most MAX_BUDGET_VMS), the groups of every operator budget that covers it, from Azure's
    placements (the identity sync's rows: a VM cannot move itself). The default budget
    over sets stays the set rows above (`acquire_capacity`). `every_reporter`: also VMs
    that no longer list it (giving back what they took)."""
    if policy is None or not policy.budgets:
        return []
    from functions.model.budgets import slots_for
    from functions.pipeline.redecide import as_event
    from functions.store.placements import Placements

    placements = Placements(store.service.get_table_client(f"{store.prefix}identities"))
    rows = store.reporter_rows(record.event_id)
    reporters = [r.vm for r in rows if r.status or every_reporter]
    event = as_event(record)
    found: list = []
    for vm in reporters[:MAX_BUDGET_VMS]:
        where = placements.for_name(vm, now, MAX_PLACEMENT_AGE)
        found += [(slot, vm) for slot in slots_for(policy.budgets, event, where, placements.size)]
    return found


MAX_PLACEMENT_AGE = timedelta(hours=12)  # two sync passes missed: the VM is gone


def acquire_budgets(
    store: Store, record: EventRecord, slots: list, now: datetime, *, over: bool = False
) -> str:
    """Take every slot in `slots` (all or none); "" when taken, else the text of the first
    full one ("waiting for budget checkout-web (1 of 1: vm-a)"), with the event listed as
    waiting there (oldest NotBefore first). `over`: Azure started it: counted even over
    the limit, and shown so."""
    from functions.store.budget_slots import BudgetHolder, BudgetSlots, BudgetWaiter

    rows = BudgetSlots(store.events)
    taken: list = []
    for slot, vm in slots:
        current = rows.get_budget_slot(slot.budget, slot.group)
        held = [h for h in (current.holders if current else []) if h.event_id != record.event_id]
        dead: set[str] = set()
        if len(held) >= slot.limit:
            dead = {
                h.event_id for h in held if not entitled(store.get_event(h.event_id), h.since, now)
            }
        full: list[str] = []

        def change(rec, slot=slot, vm=vm, dead=dead, full=full):
            full.clear()
            from functions.store.budget_slots import BudgetSlot

            rec = rec or BudgetSlot(budget=slot.budget, group=slot.group, limit=slot.limit)
            rec.limit = slot.limit
            mine = [h for h in rec.holders if h.event_id == record.event_id and h.vm == vm]
            kept = [h for h in rec.holders if h.event_id not in dead]
            waiters = {w.event_id: w for w in rec.waiting}
            if mine:
                return None
            ahead = sum(
                1
                for w in rec.waiting
                if w.event_id != record.event_id
                and w.not_before is not None
                and now < w.not_before
                and (record.not_before is None or w.not_before < record.not_before)
            )
            others = [h for h in kept if h.event_id != record.event_id]
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

        rows.mutate_budget_slot(slot.budget, slot.group, change)
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
    from functions.store.budget_slots import BudgetSlots

    rows = BudgetSlots(store.events)
    woken: list[str] = []
    for slot, _vm in slots:
        waiting: list[str] = []

        def change(rec, waiting=waiting):
            waiting.clear()
            if rec is None:
                return None
            served = sorted(rec.waiting, key=lambda w: (w.not_before is None, w.not_before))
            waiting.extend(w.event_id for w in served if w.event_id != record.event_id)
            holders = [h for h in rec.holders if h.event_id != record.event_id]
            queue = (
                rec.waiting
                if keep_waiting
                else [w for w in rec.waiting if w.event_id != record.event_id]
            )
            if holders == rec.holders and queue == rec.waiting:
                return None
            rec.holders, rec.waiting = holders, queue
            return rec

        rows.mutate_budget_slot(slot.budget, slot.group, change)
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


def flag_unstarted(pipeline: Any, record: EventRecord) -> None:
    """An event approved through a VM's relay that Azure never started: that VM's reports
    are suspect, so it takes no slot until one of its events really starts (ingest clears
    the flag on its first document that lists an event Started)."""
    vm = record.approved_by
    if record.approval != "approved" or not vm or vm == "arm" or record.started:
        return
    if record.event_type.casefold() in GONE_AFTER:
        return  # its VM is evicted or deleted: no Started may ever be seen, and no lie

    def change(rec: VmRecord | None) -> VmRecord | None:
        if rec is None or rec.unstarted == record.event_id:
            return None
        rec.unstarted = record.event_id
        return rec

    pipeline.store.mutate_vm(vm, change)
