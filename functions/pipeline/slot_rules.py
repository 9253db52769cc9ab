"""The slot rules: who holds a capacity or budget slot, who is entitled to one, and who is
admitted next. Pure: no I/O, no clock (functions.pipeline.capacity reads and writes the
slot rows by these rules; functions.pipeline.due asks them what is due). Taking and giving
back slots are decided here from the rows capacity read (`set_holders_to_read`,
`take_set`, `holds_budget`, `take_budget`, ...): each takes what was read and returns the
change to write.

A listed holder's entitlement is read from the holder's own row by one rule every taker
applies (`holds_slot`), never from a lapse computed from what a VM reported (its
NotBefore, up to a week out). An event holds its slots:
- while its approval is in flight (its claim live);
- while its approval's outcome is unknown (`unknown_until`): a relay's answer that never
  came (a timeout, a reset, a 5xx) may hide a StartRequests that reached Azure, so the
  slots stay until the event is seen Started (then the Started rule holds them) or
  UNKNOWN_HOLD has passed with it still Scheduled;
- for APPROVED_START_GRACE after it was approved (Azure starts an approved event at once);
- while its drain runs (at most DRAIN_HOLD, never past NotBefore);
- while it is Started: its duration, at most what its type can last (`IMPACT_AT_MOST`: a
  VM's made-up 366-day Redeploy holds for an hour, not a year), and STARTED_GRACE;
- and for TAKE_GRACE after it took the slot (the approval's claim is written just after).
A vetoed, failed, pending or never-started approval holds nothing, so a VM that makes up
an event and refuses its approval never keeps its set-mates waiting, and a crash never
leaks a slot. Evidence ends a hold sooner: a budget holder whose VM's own document no
longer lists the event (back to normal) holds nothing (`vm_still_out`), and an event whose
reporters all went silent ends (functions.pipeline.due), giving back its slots.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from functions.model.budgets import Slot
from functions.model.envelope import (
    FREEZE,
    PREEMPT,
    REBOOT,
    REDEPLOY,
    TERMINATE,
    ScheduledEvent,
)
from functions.model.policy import Policy, is_impactful
from functions.store import claims
from functions.store.budget_slots import BudgetHolder, BudgetSlot, BudgetWaiter
from functions.store.records import MAX_WAITING, CapacityRecord, EventRecord

# How long an approved event may stay Scheduled before its VM is suspect: Azure starts an
# approved event within moments, so after this its slot goes back and `overdue` says why.
APPROVED_START_GRACE = timedelta(minutes=5)
# How long an approval whose outcome is unknown keeps its slots with the event still not
# Started: as long as an approved one (if StartRequests reached Azure, it starts at once).
UNKNOWN_HOLD = APPROVED_START_GRACE
# How long a drain holds its event's slots at most (its steps are bounded by their own
# timeouts; a drain that outlives this has failed or is holding, and holds nothing).
DRAIN_HOLD = timedelta(minutes=30)
# Beyond the event's own duration, how long a Started event keeps its slots (Learn,
# scheduled-events: "EventStatus: Started to Completed (event removed): 10 minutes").
STARTED_GRACE = timedelta(minutes=30)
# The longest impact each type's DurationInSeconds is believed for: what the VM reports is
# its own word (the envelope accepts up to 366 days). Learn describes a Freeze as a pause
# "for a few seconds" (the sample approves those under 9 s), a typical maintenance's impact
# as about 7 s, and Started-to-removed as about 10 minutes; Microsoft's mock server plays a
# user reboot as 10 minutes Started. A Preempt or a Terminate ends the VM: nothing to wait.
IMPACT_AT_MOST = {
    FREEZE.casefold(): timedelta(seconds=60),
    REBOOT.casefold(): timedelta(minutes=15),
    REDEPLOY.casefold(): timedelta(minutes=30),
    PREEMPT.casefold(): timedelta(0),
    TERMINATE.casefold(): timedelta(0),
}
IMPACT_UNKNOWN_TYPE = timedelta(minutes=15)  # a type Azure may add later
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


def started_until(record: EventRecord) -> datetime | None:
    """Until when a Started event holds its slots: its duration, at most what its type can
    last, and STARTED_GRACE, from when it started (None: it has no start time)."""
    began = record.started_at
    if began is None:
        return None
    said = timedelta(seconds=max(record.duration_in_seconds or 0, 0))
    cap = IMPACT_AT_MOST.get(record.event_type.casefold(), IMPACT_UNKNOWN_TYPE)
    return began + min(said, cap) + STARTED_GRACE


def answer_unknown(outcome: str) -> bool:
    """Whether an attempt's recorded outcome leaves open that the call reached Azure: no
    answer (a timeout, a reset: "error: ...") or a server error ("5xx ...")."""
    if outcome.startswith("error:"):
        return True
    code = outcome[:3]
    return code.isdigit() and code.startswith("5")


def last_unknown(record: EventRecord) -> Any | None:
    """The latest attempt, among each VM's (or ARM's) last, whose answer leaves open that
    the call reached Azure (`answer_unknown`); None when every last answer is known. A
    later answer of the same relay settles it (a relay answers a repeated AttemptId from
    what it did)."""
    if record.relay_sent_at is None and record.arm_sent_at is None:
        return None
    last: dict[str | None, Any] = {}
    for attempt in record.approval_attempts:
        last[attempt.vm] = attempt
    unknown = [a for a in last.values() if answer_unknown(a.outcome)]
    return max(unknown, key=lambda a: a.at) if unknown else None


def unknown_until(record: EventRecord) -> datetime | None:
    """An approval that did not succeed and whose outcome is unknown (`last_unknown`, or a
    claim whose host died mid-call): until when its slots stay with the event not seen
    Started (None: its outcome is known, or it started)."""
    if record.approval not in ("pending", "failed", "in_progress") or record.started:
        return None
    times = []
    attempt = last_unknown(record)
    if attempt is not None:
        times.append(attempt.at)
    if record.approval == "in_progress" and (record.relay_sent_at or record.arm_sent_at):
        # A claim whose host died mid-call: unknown from when its lease ran out.
        expiry = claims.expires(record.approval_claim)
        if expiry is not None:
            times.append(expiry)
    return max(times) + UNKNOWN_HOLD if times else None


def holds_slot(record: EventRecord | None, now: datetime) -> bool:
    """Whether an event listed as a slot's holder is entitled to it now (see the module
    docstring). Every taker applies it to the holders it finds, so a slot goes back the
    moment its holder stops being one."""
    if record is None or record.ended:
        return False
    if record.started:
        until = started_until(record)
        return until is None or now < until
    if record.approval == "in_progress" and not claims.is_expired(record.approval_claim, now):
        return True
    unknown = unknown_until(record)
    if unknown is not None and now < unknown:
        return True
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


def vm_still_out(status: str | None) -> bool:
    """A budget holder's VM, by its own reporter row's status (None: no row, a VM Azure
    named that never reported it): it holds only while its own document lists the event.
    Back to normal (its document no longer lists it), it holds nothing."""
    return status is None or bool(status)


def needs_capacity(event: ScheduledEvent | EventRecord) -> bool:
    """Only impactful events count, and Terminate does not: a deletion is what the scale
    set's owner asked for, and holding it back would only delay it to NotBefore."""
    if event.event_type.casefold() == TERMINATE.casefold():
        return False
    if isinstance(event, EventRecord):
        probe = ScheduledEvent(
            event_id=event.event_id,
            event_status=event.event_status,
            event_type=event.event_type,
            duration_in_seconds=event.duration_in_seconds,
        )
        return is_impactful(probe)
    return is_impactful(event)


def holds_capacity(record: EventRecord) -> bool:
    """Whether the event may hold a slot: an `approve` decision takes one (in the decider),
    a `drain` one before its drain (functions.terminate.workflow), so ending a held event
    need not read the slots. A slot left behind anyway (a crash) is freed by the next
    taker, which drops holders no longer entitled."""
    return record.decision is not None and record.decision.action in ("approve", "drain")


def capacity_limit(policy: Policy | None) -> int:
    return policy.max_concurrent_per_set if policy else 1


def capacity_keys(record: EventRecord) -> list[str]:
    return [f"ss:{s}" for s in record.scale_sets] + [f"as:{a}" for a in record.availability_sets]


def set_guard_applies(reporters: Sequence[str], covered: Iterable[str]) -> bool:
    """The per-set guard (`max_concurrent_per_set`) counts an event unless an operator's
    budget covers every VM that reported it: where both apply, the budget replaces it (a
    20 % budget is not silently cut to one VM per set)."""
    if not reporters:
        return True
    known = {vm.casefold() for vm in covered}
    return not all(vm.casefold() in known for vm in reporters)


# ------------------------------------------------------------------ admission


def ahead_of(
    event_id: str,
    not_before: datetime | None,
    waiting: Mapping[str, datetime | None],
    now: datetime,
) -> int:
    """How many listed waiters go before this event: an earlier NotBefore still ahead (one
    order for every slot, so no two events can each wait for the other)."""
    mine = not_before or datetime.max.replace(tzinfo=now.tzinfo)
    return sum(
        1
        for other, nb in waiting.items()
        if other != event_id and nb is not None and now < nb < mine
    )


def too_big(slots: Sequence[tuple[Any, str]]) -> str:
    """An event whose VMs in one budget group are more than the group allows at once: one
    approval starts it on all of them (Azure: any named VM approves for every one), so no
    approval of the bridge's can keep that budget. It is not approved early (Azure starts
    it at NotBefore, counted over the limit); "" when every group can take it."""
    count = Counter((slot.budget, slot.group) for slot, _vm in slots)
    for slot, _vm in slots:
        n = count[(slot.budget, slot.group)]
        if n > slot.limit:
            return (
                f"waiting for budget {slot.budget}: the event names {n} of its VMs in one "
                f"group ({slot.group}), which allows {slot.limit} out at once, so it is not "
                "approved early; Azure starts it at NotBefore"
            )
    return ""


def served_order(waiting: Mapping[str, datetime | None]) -> list[str]:
    """Waiters in the order they are woken: earliest NotBefore first, none last."""
    return sorted(waiting, key=lambda e: (waiting[e] is None, waiting[e]))


# ------------------------------------------------------------------ the slot rows' changes
# Each only computes (the store runs it again when the row moved under its ETag).


class SlotFull(Exception):
    """A set's row has no slot free for the taker (`take_set`'s change)."""


def take_set(
    key: str,
    record: EventRecord,
    current: CapacityRecord | None,
    rows: Mapping[str, EventRecord | None],
    limit: int,
    now: datetime,
) -> Callable[[CapacityRecord | None], CapacityRecord | None]:
    """The change taking `record`'s slot in a set's row, from the row as read (`current`)
    and its listed holders' own rows (`rows`, read only when it was full): holders no
    longer entitled free their slot; SlotFull when none is free, or events with an
    earlier NotBefore wait for it."""
    event_id = record.event_id
    taken = current.taken if current else {}
    dead = {h for h, row in rows.items() if not entitled(row, taken.get(h), now)}

    def change(rec: CapacityRecord | None) -> CapacityRecord | None:
        rec = rec or CapacityRecord(key=key)
        if event_id in rec.holders:
            return None
        kept = [h for h in rec.holders if h not in dead]
        if limit - len(kept) <= ahead_of(event_id, record.not_before, rec.waiting, now):
            raise SlotFull
        rec.holders = [*kept, event_id]
        rec.until = {}
        rec.taken = {h: at for h, at in rec.taken.items() if h in rec.holders}
        rec.taken[event_id] = now
        rec.waiting.pop(event_id, None)
        return rec

    return change


def give_back_set(
    event_id: str, woken: list[str]
) -> Callable[[CapacityRecord | None], CapacityRecord | None]:
    """The change giving the event's set slot (and its place in the queue) back; `woken`
    gets the events that wait for it, earliest NotBefore first."""

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

    return change


def list_waiting(
    key: str, record: EventRecord
) -> Callable[[CapacityRecord | None], CapacityRecord | None]:
    """The change listing the event as waiting in a set's row (once; a full queue, at
    MAX_WAITING, lists no more: the next sweep finds it)."""

    def change(rec: CapacityRecord | None) -> CapacityRecord | None:
        rec = rec or CapacityRecord(key=key)
        if record.event_id in rec.waiting or len(rec.waiting) >= MAX_WAITING:
            return None
        rec.waiting[record.event_id] = record.not_before
        return rec

    return change


def set_full_text(policy: Policy | None) -> str:
    """What the row of an approval waiting for its set's slot says."""
    limit = capacity_limit(policy)
    return (
        f"waiting: {limit} impactful event(s) already approved in its scale set / availability set"
    )


def wait_for(reason: str, first: list[bool]) -> Callable[[EventRecord | None], EventRecord | None]:
    """The change recording in the event's row that its approval waits for a slot
    (`reason`), its claim given back: once (`first` gets True when this wrote it);
    nothing when its approval is past waiting, or already waits for the same."""

    def change(rec: EventRecord | None) -> EventRecord | None:
        first.clear()
        if rec is None:
            return None
        if rec.approval not in ("", "pending", "in_progress") or (
            rec.approval == "pending"
            and rec.approval_reason == "capacity"
            and rec.waiting_for == reason
        ):
            return None
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

    return change


def take_budget(
    record: EventRecord,
    slot: Slot,
    vm: str,
    dead: set[tuple[str, str]],
    now: datetime,
    over: bool,
    full: list[str],
) -> Callable[[BudgetSlot | None], BudgetSlot | None]:
    """The change taking a budget group's slot for one VM of the event, dropping the
    holders read as no longer holding (`dead`). Full (unless `over`: counted anyway):
    `full` gets the row's text and the event is listed as waiting there."""

    def change(rec: BudgetSlot | None) -> BudgetSlot | None:
        full.clear()
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
        # more of a group out than it allows (`too_big` holds it back).
        if not over and slot.limit - len(kept) <= ahead:
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
            BudgetHolder(vm=vm, event_id=record.event_id, since=now, over=len(kept) >= slot.limit),
        ]
        rec.waiting = [w for w in rec.waiting if w.event_id != record.event_id]
        return rec

    return change


def give_back_budget(
    event_id: str, keep_waiting: bool, waiting: list[str]
) -> Callable[[BudgetSlot | None], BudgetSlot | None]:
    """The change giving the event's slots in a budget group back (and its place in the
    queue, unless `keep_waiting`); `waiting` gets the events waiting there."""

    def change(rec: BudgetSlot | None) -> BudgetSlot | None:
        waiting.clear()
        if rec is None:
            return None
        queue = {w.event_id: w.not_before for w in rec.waiting}
        waiting.extend(e for e in served_order(queue) if e != event_id)
        holders = [h for h in rec.holders if h.event_id != event_id]
        left = rec.waiting if keep_waiting else [w for w in rec.waiting if w.event_id != event_id]
        if holders == rec.holders and left == rec.waiting:
            return None
        rec.holders, rec.waiting = holders, left
        return rec

    return change


# ------------------------------------------------------------------ what a taker reads, and what
# it does with what it read (functions.pipeline.capacity reads the rows these name, then
# writes the changes above)


SET_FULL = "its set is full"


def set_holders_to_read(
    current: CapacityRecord | None, record: EventRecord, limit: int
) -> list[str]:
    """The holders of a set's row (as read) whose own rows `take_set` needs: only when the
    row is full (one point read per holder), never the taker itself."""
    holders = [h for h in (current.holders if current else []) if h != record.event_id]
    return holders if len(holders) >= limit else []


def budget_holders_to_read(
    current: BudgetSlot | None, record: EventRecord, slot: Slot, vm: str
) -> list[BudgetHolder]:
    """The holders of a budget group's row (as read) whose entitlement `take_budget` needs
    (`holds_budget`): only when the row is full, never this event's own VM."""
    held = [
        h
        for h in (current.holders if current else [])
        if not (h.event_id == record.event_id and h.vm == vm)
    ]
    return held if len(held) >= slot.limit else []


def holds_budget(holder: BudgetHolder, row: EventRecord | None, now: datetime) -> bool | None:
    """Whether a budget holder keeps its slot, from its event's row: while the row entitles
    it (`entitled`), and past TAKE_GRACE only while its VM's own document still lists the
    event: None when that document is needed (then `vm_still_out` decides)."""
    if not entitled(row, holder.since, now):
        return False
    if now < holder.since + TAKE_GRACE:
        return True
    return None


def woken_order(event_id: str, woken: Iterable[str]) -> list[str]:
    """The events woken by a give-back, in the order they were found (each row's waiters
    earliest NotBefore first), each once, never the giver, at most WAKE_AT_MOST."""
    return [e for e in dict.fromkeys(woken) if e != event_id][:WAKE_AT_MOST]
