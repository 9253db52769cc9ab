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

The reconcile by key changes the row too, and only as `due` says: its changes of state
(`change_of_state`: the end, the derived start, a decision made again, an approval
settled) and its claims (`claiming`) are pure changes of the row here, which
functions.pipeline.reconcile writes under the row's ETag.

Facts that never change back, which ingest relies on to skip reading rows it saw before:
an ended event stays ended (a late report only adds a past reporter row; only a VM that
never reported it reopens an end its set-mates made), a decision once made stays made,
and `resources` / `scale_sets` / `availability_sets` only grow.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from functions.model.envelope import SCHEDULED, STARTED, ScheduledEvent, VmRef
from functions.model.event import Transition
from functions.model.policy import PolicyLoad
from functions.pipeline.due import Due, conditions, settled_path, unannounced_before
from functions.pipeline.redecide import redecide, should_redecide
from functions.store import claims
from functions.store.records import (
    MAX_ATTEMPTS_KEPT,
    MAX_NAME_CHARS,
    MAX_RESOURCES,
    MAX_SETS,
    Attempt,
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


# ------------------------------------------------------------------ the reconcile's changes
# Each a change of the event row for Store.mutate_event: the row as read in (None: it is
# gone), the row to write out (None: nothing to write). The reconcile by key (functions.
# pipeline.reconcile) writes it under the row's ETag, so a writer that raced it makes the
# change run again on the row that writer left, where it finds nothing left to do.

Change = Callable[[EventRecord | None], EventRecord | None]

END_DETAILS = {
    "silent": "every VM that reported it went silent",
    "unheard": "no Event Grid notification of its end within {limit} s",
}


@dataclass(frozen=True)
class StateChange:
    """The change of state that `due` found (an end, a start, a decision made again, an
    approval settled), ready to write; `audit`: the audit row written just before it."""

    change: Change
    audit: dict[str, Any] | None = None


def change_of_state(
    plan: Due,
    record: EventRecord,
    left_at: datetime,
    now: datetime,
    me: str,
    load: PolicyLoad,
    end_limit: float,
) -> StateChange | None:
    """The change of state `plan` asks for first (`due` asks for one at a time), each
    claiming the announcement it makes due in its own write; None when it asks for none.
    `left_at`: when the last reporter saw the event go; `end_limit`: how long an event
    only Event Grid reported waits for its end (EVENTGRID_END_AFTER_SECONDS)."""
    if plan.end:
        return StateChange(ending(plan.end, left_at, now, me, end_limit))
    if plan.start is not None:
        return StateChange(starting(plan.start, now, me))
    if plan.redecide:
        return StateChange(redeciding(load, now, me))
    if plan.settle:
        return settling(record, plan.settle, now)
    return None


def ending(why: str, seen_at: datetime, now: datetime, me: str, limit: float) -> Change:
    """End the event (once; its end announcement claimed in the same write), by the one
    rule (`end`). A silent reporter's own row keeps what it last said (it said nothing
    since): the end is the event row's alone, one write, so a crash leaves nothing half
    done."""
    detail = END_DETAILS.get(why, "").format(limit=limit)
    at = now if why != "reporters" else observed(seen_at, now)

    def change(rec: EventRecord | None) -> EventRecord | None:
        if rec is None or rec.ended:
            return None
        end(rec, at, by="azure" if why == "unheard" else "reporters")
        rec.end_detail = detail
        ended = Transition.COMPLETED if rec.ended == "completed" else Transition.CANCELLED
        claim_announcement(rec, ended, now, me)
        return rec

    return change


def starting(seen_at: datetime, now: datetime, me: str) -> Change:
    """The event started, as the decider derived it from the reporters' own views (its
    `started` claimed in the same write). `seen_at` is a reporter row's: bounded by the
    app's clock when ingest wrote it (`observed`), or when the row was written."""

    def change(rec: EventRecord | None) -> EventRecord | None:
        if rec is None or rec.ended or rec.started:
            return None
        rec.started = True
        rec.event_status = STARTED
        rec.started_at = seen_at
        claim_announcement(rec, Transition.STARTED, now, me)
        return rec

    return change


def settling(record: EventRecord, path: str, now: datetime) -> StateChange:
    """An approval whose call reached Azure and whose host died before recording it: the
    VM reports the event Started before NotBefore (or Azure reports it completed), so it
    was this approval. Recorded as approved through the path the attempt took (`path`:
    "relay:<vm>" or "arm"), audited; its `approved` is then due like any other."""
    vm = "arm" if path == "arm" else path.removeprefix("relay:")
    detail = (
        "the call reached Azure before its answer was lost: the event "
        + ("started" if record.started else "completed")
        + " before NotBefore"
    )

    def change(rec: EventRecord | None) -> EventRecord | None:
        if rec is None or settled_path(rec) != path:
            return None
        rec.approval = "approved"
        rec.approval_claim = claims.DONE
        rec.approved_by = vm
        rec.approval_reason = detail
        at = rec.relay_sent_at if path != "arm" else rec.arm_sent_at
        attempt = Attempt(at=at or now, vm=vm, outcome=f"approved ({detail})", by="reconcile")
        rec.approval_attempts = [*rec.approval_attempts, attempt][-MAX_ATTEMPTS_KEPT:]
        return rec

    decision = record.decision
    audit = {
        "at": now,
        "rule": decision.rule if decision else "",
        "action": "approve",
        "outcome": f"approved via {path}",  # functions.pipeline.approval_record.approval_path
        "detail": detail,
        "by": "reconcile",
        "once": f"approval:approved:{vm}",
        "anchor": record.decided_at,
        "rank": 3,
    }
    return StateChange(change, audit)


def redeciding(load: PolicyLoad, now: datetime, me: str) -> Change:
    """Replace the fail-closed decision and claim its `decided` in one write, so a second
    reconcile racing for it finds nothing left to do; its approval is then due like any
    other (`due`)."""

    def change(rec: EventRecord | None) -> EventRecord | None:
        if rec is None or not should_redecide(rec, load, now):
            return None
        redecide(rec, load, now)
        claim_announcement(rec, Transition.DECIDED, now, me)
        return rec

    return change


def holds_approval(record: EventRecord, me: str) -> bool:
    """`me` holds the row's approval claim."""
    return bool(me) and claims.holder(record.approval_claim) == me


def claiming(
    transitions: tuple[Transition, ...],
    now: datetime,
    me: str,
    *,
    approve: bool,
    budget_seconds: float,
    relay: bool,
) -> Change:
    """Claim the announcements that are due and not claimed and, with `approve`, the
    approval (held for `approval_lease`; with `relay` among the approvers, its attempt
    recorded as sent: `note_sent`), in one write."""
    lease = approval_lease(budget_seconds)

    def change(rec: EventRecord | None) -> EventRecord | None:
        if rec is None:
            return None
        wanted = set(conditions(rec, now))
        took = [t for t in transitions if t in wanted and claim_announcement(rec, t, now, me)]
        free = rec.approval != "in_progress" or claims.is_free(rec.approval_claim, now, me)
        ready = not rec.ended and not rec.started and rec.approval != "approved"
        ready = ready and not unannounced_before(rec, now, me, claimed=True)
        if approve and free and ready and not holds_approval(rec, me):
            rec.approval = "in_progress"
            rec.approval_claim = claims.pending(now, lease, me)
            if relay:
                note_sent(rec, now, "")
            took.append(Transition.APPROVED)
        return rec if took else None

    return change


def noting_drain(outcome: str) -> Change:
    """Record the drain workflow's outcome (once)."""

    def change(rec: EventRecord | None) -> EventRecord | None:
        if rec is None or rec.drain_outcome == outcome:
            return None
        rec.drain_outcome = outcome
        return rec

    return change
