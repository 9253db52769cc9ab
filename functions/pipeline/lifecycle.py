"""One event's fleet-wide lifecycle, as pure functions over its row.

A VM's document says "these events exist, in these states" from that VM's point of view.
Fleet-wide an event is `scheduled` when first seen Scheduled, `started` when any reporter
says Started (or it is first seen Started: a host failure skips Scheduled), and it ends
only when *every* VM that reported it has sent a later document without it (or went
silent): `completed` if it had started, `cancelled` if it never did.

Two facts never change back, and ingest relies on it to skip reading rows it saw
before (functions.pipeline.ingest._already_ended_with): an ended event stays ended (a late
report only adds to `past_reporters`), and `past_reporters` only grows.

These functions only compute; the caller writes the result under the row's ETag and may
call them again on a fresh row after losing a race, so they must stay side-effect free.
"""

from __future__ import annotations

from datetime import datetime

from functions.model.envelope import STARTED, ScheduledEvent, VmRef
from functions.model.event import Transition
from functions.pipeline.announce import pending_mark
from functions.store.records import EventRecord


def _add(items: list[str], value: str | None) -> None:
    if value and value.casefold() not in {i.casefold() for i in items}:
        items.append(value)


def _claim(
    record: EventRecord, transition: Transition, now: datetime, out: list[Transition]
) -> None:
    if transition.value not in record.announced:
        record.announced[transition.value] = pending_mark(now)
        out.append(transition)


def report(
    record: EventRecord | None, event: ScheduledEvent, vm: VmRef, now: datetime
) -> tuple[EventRecord | None, list[Transition]]:
    """A VM's document contains `event`. Returns the new row (None: unchanged) and the
    transitions this write claims for announcing."""
    claimed: list[Transition] = []
    if record is None:
        record = EventRecord(
            event_id=event.event_id,
            event_type=event.event_type,
            event_status=event.event_status,
            event_source=event.event_source,
            resource_type=event.resource_type,
            resources=list(event.resources),
            not_before=event.not_before,
            description=event.description,
            duration_in_seconds=event.duration_in_seconds,
            first_seen=now,
        )
        changed = True
    else:
        before = record.model_dump_json()
        changed = False
    if record.ended:
        # A late document from a VM after the event ended fleet-wide: remember the VM,
        # do not reopen the event (it would announce it twice).
        if vm.name not in record.past_reporters:
            record.past_reporters.append(vm.name)
            return record, claimed
        return None, claimed
    record.reporters[vm.name] = event.event_status
    _add(record.past_reporters, vm.name)
    for name in event.resources:
        _add(record.resources, name)
    _add(record.scale_sets, vm.scale_set)
    _add(record.availability_sets, vm.availability_set)
    if event.not_before is not None and not record.started:
        record.not_before = event.not_before
    if event.description and not record.description:
        record.description = event.description
    if event.duration_in_seconds is not None:
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


def absent(
    record: EventRecord | None, vm_name: str, now: datetime, why: str = ""
) -> tuple[EventRecord | None, list[Transition]]:
    """`vm_name` no longer reports the event (a newer document without it, or silence)."""
    claimed: list[Transition] = []
    if record is None or record.ended or vm_name not in record.reporters:
        return None, claimed
    del record.reporters[vm_name]
    if not record.reporters:
        end(record, now, claimed)
    return record, claimed


def end(record: EventRecord, now: datetime, claimed: list[Transition]) -> None:
    """No VM reports it any more. It "had started" if a VM said Started, we approved it,
    or NotBefore passed (a 1 s poll can miss a short Started phase)."""
    passed = record.not_before is not None and now >= record.not_before
    had_started = record.started or record.approval == "approved" or passed
    record.ended = "completed" if had_started else "cancelled"
    record.ended_at = now
    _claim(
        record,
        Transition.COMPLETED if had_started else Transition.CANCELLED,
        now,
        claimed,
    )
