"""One event's fleet-wide lifecycle, written once for every source, as pure functions.

A relay's document and an Event Grid notification are both an `Observation`: one source
saw the event in one state at one time. `observe` records it on the event row, and does
nothing else: it claims nothing and decides nothing (docs/lifecycle.md: writers record,
only `reconcile_key` claims and acts):
- Event Grid is Azure: its Started starts the event, its Completed / Canceled ends it,
  and once it described the event its NotBefore, type, duration and text are Azure's;
- a relay's report is one VM's word: its status lives in its own reporter row (written by
  ingest), and the decider (functions.pipeline.due) derives from Azure's facts and every
  reporter's own view whether the event started or ended (applied by `end` and the
  reconcile's start), so one VM's Started or absence never decides for another;
- Event Grid is no VM: it is not a reporter, but it names the event's owner in ARM.

Who reports an event is not in its row: each reporter has its own row in the event's
partition (functions.store.reporters), written by that VM's documents alone, so 200 VMs
reporting at once never contend for one row; the event row changes only when the event
does (first report, a new NotBefore, the decision, approval, the start, the end).

Facts that never change back, which ingest relies on to skip reading rows it saw before:
an ended event stays ended (a late report only adds a past reporter row; only a VM that
never reported it reopens an end its set-mates made), a decision once made stays made,
and `resources` / `scale_sets` / `availability_sets` only grow.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from functions.model.envelope import SCHEDULED, STARTED, ScheduledEvent, VmRef
from functions.model.event import Transition
from functions.store import claims
from functions.store.records import (
    MAX_NAME_CHARS,
    MAX_RESOURCES,
    MAX_SETS,
    EventRecord,
)

# An announcement's claimer publishes within this; after it anyone publishes it again (the
# topic drops a MessageId it has seen). Short: 200 reporters of one event reconcile at
# once, and a host that died is found by the next look (a redelivery, 10 s later).
ANNOUNCE_LEASE = timedelta(seconds=5)
# Beyond the approval's own budget, how long its claim is held.
APPROVAL_LEASE_MARGIN = timedelta(seconds=15)


# How far back an observer's time is believed: a document can wait this long behind an
# outage (storage, the function app) and still say when its relay saw what it says; an
# older claim is taken as this old (the documents queue keeps a message for 7 days, but
# nothing a day late decides anything on time anyway).
MAX_OBSERVER_LAG = timedelta(days=1)


def observed(at: datetime, now: datetime) -> datetime:
    """When a source saw something, bounded by the app's clock: never later than now, never
    earlier than MAX_OBSERVER_LAG ago (issue 40: decide by when it happened, not by when
    the app got round to it)."""
    return max(min(at, now), now - MAX_OBSERVER_LAG)


def approval_lease(budget_seconds: float) -> timedelta:
    """An approval claim is held for one attempt's budget (and a margin): longer means its
    holder died, and the next reconcile takes it over."""
    return timedelta(seconds=budget_seconds) + APPROVAL_LEASE_MARGIN


@dataclass(frozen=True)
class Owner:
    """The event's owner in ARM, as Event Grid names it."""

    id: str
    resource_type: str  # virtualMachines | virtualMachineScaleSets | availabilitySets
    name: str


@dataclass(frozen=True)
class Observation:
    """One source's report of one event. `seen_at`: when the source saw it (a relay's
    observation time, Event Grid's event time), never later than the app's clock."""

    event: ScheduledEvent
    seen_at: datetime
    vm: VmRef | None = None  # the reporting VM (a relay); None for Event Grid
    owner: Owner | None = None  # Event Grid: the owner in ARM
    ends: str = ""  # Event Grid: "completed" or "cancelled"
    describes: bool = True  # may move the row's NotBefore and duration (see observe)
    newcomer: bool = False  # a VM's first report of it: an end by reporters reopens


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


def claim_announcement(
    record: EventRecord, transition: Transition, now: datetime, holder: str = ""
) -> bool:
    """Claim one announcement in the row (in place) if nobody has: ANNOUNCE_LEASE."""
    return claims.take(record.announced, transition.value, now, ANNOUNCE_LEASE, holder)


def observe(record: EventRecord | None, seen: Observation, now: datetime) -> EventRecord | None:
    """Record one observation. Returns the new event row (None: unchanged). A relay's own
    reporter row is the caller's (functions.pipeline.ingest). `describes`: this report may
    move the row's description (NotBefore, DurationInSeconds), which the approval deadline
    and the end read; only the VM whose view the row shows may (its own event was
    rescheduled), so no other VM's report moves them for everyone. The text operators
    read is attributed (`described_by`): Azure's once Event Grid described the event,
    else the VM whose report gave it (functions.store.records.EventRecord.snapshot)."""
    event = seen.event
    grid = seen.vm is None
    if record is None:
        record = EventRecord(
            event_id=event.event_id,
            event_type=event.event_type,
            # A VM's Started is its own (its reporter row): the decider derives the start.
            event_status=STARTED if grid and event.event_status == STARTED else SCHEDULED,
            event_source=event.event_source,
            resource_type=event.resource_type,
            not_before=event.not_before,
            description=event.description,  # bounded by functions.model.envelope
            duration_in_seconds=event.duration_in_seconds,
            first_seen=now,
            described_by="azure" if grid else (seen.vm.name if seen.vm else ""),
        )
        before = ""
    else:
        before = record.model_dump_json()
    if record.ended and seen.newcomer and not grid and record.ended_by == "reporters":
        # The first report of a VM that had not listed it: the end other VMs made is not
        # this VM's (its own view says the event is on). It reopens for it.
        reopen(record)
    if record.ended:
        # A late report (the caller records a relay as a past reporter only), or a late or
        # reordered notification: ending is final.
        return None
    # `Resources` is a claim about other VMs (ingest checked only that it names the
    # reporter). It decides nothing about them: every action on a named VM goes to that
    # VM's own relay, which acts only for an event its own IMDS shows naming it. Kept as
    # the union, as genuine reports agree, so a report that adds nothing writes nothing.
    dropped = _union(record.resources, event.resources, MAX_RESOURCES)
    record.resources_dropped = max(record.resources_dropped, dropped)
    if seen.vm is not None:  # Azure's facts about the reporting VM
        _union(record.scale_sets, [seen.vm.scale_set], MAX_SETS)
        _union(record.availability_sets, [seen.vm.availability_set], MAX_SETS)
    if seen.owner is not None:
        record.arm_resource = record.arm_resource or seen.owner.id
        if seen.owner.resource_type == "virtualMachineScaleSets":
            _union(record.scale_sets, [seen.owner.name], MAX_SETS)
        elif seen.owner.resource_type == "availabilitySets":
            _union(record.availability_sets, [seen.owner.name], MAX_SETS)
    # Once Event Grid described the event its NotBefore is Azure's, and a relay's report
    # (perhaps a set-mate's, perhaps hostile) does not move it.
    moves = not record.started and (grid or (seen.describes and not record.arm_resource))
    if event.not_before is not None and (moves or record.not_before is None):
        # IMDS blanks NotBefore once an event Started, so a report that has one fills a
        # row that has none (a set-mate's Started seen first leaves no NotBefore).
        record.not_before = event.not_before
    if grid and record.described_by != "azure":
        # Azure's own words replace what the first reporting VM said (Azure wins).
        record.event_type = event.event_type
        record.description = event.description or record.description
        record.described_by = "azure"
    if event.description and not record.description:
        record.description = event.description
    if event.duration_in_seconds is not None and (grid or seen.describes):
        record.duration_in_seconds = event.duration_in_seconds
    if seen.ends:
        end(record, observed(seen.seen_at, now), how=seen.ends, by="azure")
    elif grid and event.event_status == STARTED and not record.started:
        record.started = True
        record.event_status = STARTED
        record.started_at = observed(seen.seen_at, now)
    if record.model_dump_json() != before:
        return record
    return None


def end(record: EventRecord, at: datetime, *, how: str = "", by: str = "reporters") -> None:
    """End the event (in place) as seen at `at` (when the source saw it end: a relay's
    observation, Event Grid's event time, never when the app got round to it). Without
    `how`, it "had started" if it started, the app approved it, or NotBefore had passed by
    `at` (a 1 s poll can miss a short Started phase): completed, else cancelled. The one
    rule for every end; its announcement is the decider's (functions.pipeline.due)."""
    if not how:
        passed = record.not_before is not None and at >= record.not_before
        how = "completed" if record.started or record.approval == "approved" or passed else ""
        how = how or "cancelled"
    record.ended = "completed" if how == "completed" else "cancelled"
    record.ended_at = at
    record.ended_by = "azure" if by == "azure" else "reporters"


def note_sent(record: EventRecord, now: datetime, relay_to: str) -> None:
    """In the claim's own write, before any call (as `arm_sent_at` before ARM's): the
    relay path is about to send StartRequests. A host that dies after the relay's IMDS
    took it, and before the approval is recorded, leaves a claim that the one decider
    settles as approved once the VM reports Started before NotBefore."""
    if record.relay_sent_at is None:
        record.relay_sent_at = now
    if relay_to and not record.relay_sent_to:
        record.relay_sent_to = relay_to


def reopen(record: EventRecord) -> None:
    """Undo an end the reporters made: open again, its end to be announced afresh (with a
    MessageId of its own: functions.pipeline.announce.occurrence)."""
    for transition in (Transition.COMPLETED, Transition.CANCELLED):
        record.announced.pop(transition.value, None)
    record.ended = ""
    record.ended_at = None
    record.ended_by = ""
    record.reopened += 1
