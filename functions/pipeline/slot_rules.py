"""The slot rules: who holds a capacity or budget slot, who is entitled to one, and who is
admitted next. Pure: no I/O, no clock (functions.pipeline.capacity reads and writes the
slot rows by these rules; functions.pipeline.due asks them what is due).

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
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, Protocol

from functions.model.envelope import (
    FREEZE,
    PREEMPT,
    REBOOT,
    REDEPLOY,
    SCHEDULED,
    TERMINATE,
    ScheduledEvent,
)
from functions.model.policy import Policy, is_impactful
from functions.store import claims
from functions.store.records import EventRecord

# Types after which the VM is gone (evicted, deleted): never flagged for not starting.
GONE_AFTER = frozenset(t.casefold() for t in (PREEMPT, TERMINATE))

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
# How long a VM whose approved event never started in its own view stays suspect (its
# relay not asked to approve): its own documents cannot end it sooner (issue 46).
UNSTARTED_FOR = timedelta(hours=24)
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


class Flagged(Protocol):
    """Where a VM's `unstarted` flag is kept: its VM row, and its identity row (which the
    approver reads for the relay's address and keys anyway: functions.pipeline.approve)."""

    @property
    def unstarted(self) -> str | None: ...

    @property
    def unstarted_at(self) -> datetime | None: ...


def suspect(vm: Flagged, event_id: str, now: datetime) -> bool:
    """Whether this VM's relay is not asked to approve `event_id`: an event approved
    through it stayed Scheduled in its own view (`unstarted`), less than UNSTARTED_FOR
    ago. A flag of before `unstarted_at` was kept has lapsed."""
    if not vm.unstarted or vm.unstarted == event_id or vm.unstarted_at is None:
        return False
    return now < vm.unstarted_at + UNSTARTED_FOR


def flags_unstarted(record: EventRecord, own_status: str | None) -> str:
    """The VM to flag `unstarted` for this event ("" for none): the VM whose relay
    approved it, when its own document (its reporter row's status: `own_status`) still
    lists the event as Scheduled. A set-mate that keeps listing a shared event cannot get
    the approver flagged, nor can a VM that no longer lists it (a 5 s Freeze over between
    two polls)."""
    vm = record.approved_by
    if record.approval != "approved" or not vm or vm == "arm" or record.started:
        return ""
    if record.event_type.casefold() in GONE_AFTER:
        return ""  # its VM is evicted or deleted: no Started may ever be seen, and no lie
    return vm if own_status == SCHEDULED else ""


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
