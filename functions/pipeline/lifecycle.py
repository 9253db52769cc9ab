"""One event's fleet-wide lifecycle, as pure functions over its row.

A VM's document says "these events exist, in these states" from that VM's point of view.
Fleet-wide an event is `scheduled` when first seen Scheduled, `started` when any reporter
says Started (or it is first seen Started: a host failure skips Scheduled), and it ends
only when *every* VM that reported it has sent a later document without it (or went
silent): `completed` if it had started, `cancelled` if it never did.

Who reports an event is not in its row: each reporter has its own row in the event's
partition (functions.store.events), written by that VM's documents alone, so 200 VMs
reporting at once never contend for one row; the event row changes only when the event
does (first report, Started, a new NotBefore, the decision, approval, the end).

Facts that never change back, which ingest relies on to skip reading rows it saw before:
an ended event stays ended (a late report only adds a past reporter row), a decision once
made stays made, and `resources` / `scale_sets` / `availability_sets` only grow.

These functions only compute; the caller writes the result under the row's ETag and may
call them again on a fresh row after losing a race, so they must stay side-effect free.
"""

from __future__ import annotations

from datetime import datetime

from functions.model.envelope import STARTED, ScheduledEvent, VmRef
from functions.model.event import Transition
from functions.store import claims
from functions.store.records import (
    MAX_NAME_CHARS,
    MAX_RESOURCES,
    MAX_SETS,
    EventRecord,
)


def _union(
    items: list[str],
    values: list[str | None] | tuple[str, ...],
    cap: int,
    chars: int = MAX_NAME_CHARS,
) -> int:
    """Add the values not already in `items` (case-insensitively), up to `cap` items and
    `chars` characters in all; returns how many were left out for the caps."""
    known = {i.casefold() for i in items}
    used = sum(len(i) for i in items)
    dropped = 0
    for value in values:
        if not value or value.casefold() in known:
            continue
        if len(items) >= cap or used + len(value) > chars:
            dropped += 1
            continue
        items.append(value)
        known.add(value.casefold())
        used += len(value)
    return dropped


def _add(items: list[str], value: str | None) -> None:
    """Add one name (case-insensitively new) within the caps (Event Grid's path uses it)."""
    _union(items, [value], MAX_RESOURCES)


def _claim(
    record: EventRecord, transition: Transition, now: datetime, out: list[Transition]
) -> None:
    if claims.take(record.announced, transition.value, now):
        out.append(transition)


def report(
    record: EventRecord | None,
    event: ScheduledEvent,
    vm: VmRef,
    now: datetime,
    describes: bool = True,
    newcomer: bool = False,
) -> tuple[EventRecord | None, list[Transition]]:
    """A VM's document contains `event`. Returns the new event row (None: unchanged) and
    the transitions this write claims for announcing. The VM's own reporter row is the
    caller's (functions.pipeline.ingest). `describes`: this report may move the row's
    description (NotBefore, DurationInSeconds, Description), which the approval deadline,
    the watchdog and the end read; only the VM whose view the row shows may (its own
    event was rescheduled), so no other VM's report moves them for everyone."""
    claimed: list[Transition] = []
    if record is None:
        record = EventRecord(
            event_id=event.event_id,
            event_type=event.event_type,
            event_status=event.event_status,
            event_source=event.event_source,
            resource_type=event.resource_type,
            not_before=event.not_before,
            description=event.description,  # bounded by functions.model.envelope
            duration_in_seconds=event.duration_in_seconds,
            first_seen=now,
        )
        changed = True
    else:
        before = record.model_dump_json()
        changed = False
    if record.ended and newcomer and record.ended_by == "reporters":
        # The first report of a VM that had not listed it: the end other VMs made is not
        # this VM's (its own view says the event is on). It reopens for it.
        reopen(record)
        changed = True
    if record.ended:
        # A late document from a VM that reported it before, or after Azure ended it:
        # the caller records the VM as a past reporter; the event is not reopened.
        return None, claimed
    # `Resources` from a relay is a claim about other VMs (ingest checked only that it names
    # the reporter). It decides nothing about them: every action on a named VM goes to that
    # VM's own relay, which acts only for an event its own IMDS shows naming it (and, to
    # approve, of the type and source decided on). Kept as the union, as genuine reports
    # agree, so a report that adds nothing writes nothing. The sets are Azure's facts.
    dropped = _union(record.resources, event.resources, MAX_RESOURCES)
    record.resources_dropped = max(record.resources_dropped, dropped)
    _union(record.scale_sets, [vm.scale_set], MAX_SETS)
    _union(record.availability_sets, [vm.availability_set], MAX_SETS)
    moves = describes and not record.started and not record.arm_resource
    if event.not_before is not None and moves:
        # Once Event Grid described the event, its NotBefore is Azure's and a relay's
        # report (perhaps a set-mate's, perhaps hostile) does not move it.
        record.not_before = event.not_before
    if event.description and not record.description:
        record.description = event.description
    if event.duration_in_seconds is not None and describes:
        record.duration_in_seconds = event.duration_in_seconds
    if event.event_status == STARTED and not record.started:
        record.started = True
        record.event_status = STARTED
    if record.started:
        _claim(record, Transition.STARTED, now, claimed)
    else:
        _claim(record, Transition.SCHEDULED, now, claimed)
    if changed or claimed or record.model_dump_json() != before:
        return record, claimed
    return None, claimed


def end(record: EventRecord, now: datetime, claimed: list[Transition]) -> None:
    """No VM reports it any more. It "had started" if a VM said Started, we approved it,
    or NotBefore passed (a 1 s poll can miss a short Started phase)."""
    passed = record.not_before is not None and now >= record.not_before
    had_started = record.started or record.approval == "approved" or passed
    record.ended = "completed" if had_started else "cancelled"
    record.ended_at = now
    record.ended_by = "reporters"
    _claim(
        record,
        Transition.COMPLETED if had_started else Transition.CANCELLED,
        now,
        claimed,
    )


def intend_approval(record: EventRecord, dry_run: bool, now: datetime) -> str:
    """In the same write as a decision to approve: the approval's intent (`pending`, with
    the decision's window), and, when it may happen now, the approval claim itself, so
    the writer goes on to approve without a second write and a host that dies after this
    write leaves a claim whose lease runs out, never a decision with nothing after it.
    Returns the claim taken ("" when none). Pure: the caller writes the row."""
    decision = record.decision
    if decision is None or decision.action != "approve" or decision.policy_error:
        return ""
    if decision.dry_run or dry_run or record.started or record.ended:
        return ""
    if record.approval not in ("", "pending"):
        return ""
    if not record.approval:
        record.approval = "pending"
        record.approve_after = decision.approve_after
    window = record.approve_after
    if (window is not None and window > now) or record.approval_reason == "capacity":
        return ""
    record.approval = "in_progress"
    record.approval_claim = claims.pending(now)
    return record.approval_claim


def reopen(record: EventRecord) -> None:
    """Undo an end the reporters made: open again, its end to be announced afresh (with a
    MessageId of its own: functions.pipeline.redecide.occurrence)."""
    for transition in (Transition.COMPLETED, Transition.CANCELLED):
        record.announced.pop(transition.value, None)
    record.ended = ""
    record.ended_at = None
    record.ended_by = ""
    record.reopened += 1


def own_claim(record: EventRecord, tag: str) -> bool:
    """The approval is claimed, and by the message (or run) `tag` names: delivered again
    after its host died, it acts on that claim at once (`approval_claimed_by`)."""
    return (
        record.approval == "in_progress"
        and bool(record.approval_claim)
        and record.approval_claimed_by == tag
    )
