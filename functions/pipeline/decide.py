"""The pure steps of ingest: every decision one document makes, with no I/O and no clock.

- `is_stale`, `over_rate`: whether the document is processed at all (a redelivery, or a
  VM over its hourly bounds), from the VM row as read;
- `seen_by`: this VM's view of one event it lists (what the policy reads, its key, and
  the form the event row keeps it in);
- `decide_report`: one event the document lists, decided on this VM's own view;
- `next_vm_row`: the VM row after the document (sequence, hourly counts, its events,
  statuses and view keys, the end of an announced silence).
functions.pipeline.ingest reads the rows, calls these, and writes what they return with
conditional writes; on a conflict it reads again and calls them again.

`decide_report(row, event, vm, own, policy, now)` takes the event row as read (or None),
the event as this VM's IMDS showed it (its attested document), Azure's facts about the
VM, its view of the event (worked out once per document), the policy and the time, and
returns a `ReportPlan`: the event row to write (under the ETag it was read at), the
transitions that write claims, whether it made a decision, and this VM's own view and
decision. No I/O and no clock: the caller writes the plan with a
conditional write and, on a conflict (412), reads again and calls it again.

Each VM's view decides for that VM (docs/lifecycle.md, "Trust"). Azure lets any
VM named in an event's `Resources` approve it for all of them, and every VM of a set sees
its set-mates' events, so a VM's description of a shared event is an attacker's input
about every other VM. So:
- each distinct view of an EventId is kept on the event row with the decision made on it
  (`EventRecord.views`); genuine reporters see one event, so they share one entry and a
  report that repeats it writes nothing;
- a VM's own decision is the one made on its own view, whoever reported first;
- where views differ, that is recorded (`views_differ`: the fields), and the event's
  `decision` (what the announcements show and any action taken for the whole event
  follows) is the strictest of them (`stricter`).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Literal

from functions.ledger import measured
from functions.model.envelope import Envelope, LedgerEntry, ScheduledEvent, VmRef
from functions.model.event import Decision, Transition
from functions.model.policy import PolicyLoad, decide, rule_tags
from functions.model.view import VmView
from functions.pipeline.lifecycle import Observation, observe, observed
from functions.pipeline.redecide import redecide, should_redecide
from functions.pipeline.relay_recovery import claim_recovery
from functions.pipeline.views import TOO_MANY_VIEWS, differing_fields, stricter
from functions.settings import Settings
from functions.store import claims
from functions.store.recent import copy_record
from functions.store.records import MAX_VIEWS, EventRecord, ViewDecision, VmRecord


@dataclass
class ReportPlan:
    """What one VM's report of one event changes. `row` is the event row to write (None:
    nothing to write); it carries the ETag of the row it was computed from."""

    row: EventRecord | None
    made: bool = False  # this write made or changed the event's decision
    view: VmView | None = None
    key: str = ""
    decision: Decision | None = None  # this VM's own decision (None: the event ended)
    kept: bool = True  # the view is on the event row (False: beyond MAX_VIEWS)


def decide_report(
    row: EventRecord | None,
    event: ScheduledEvent,
    vm: VmRef,
    own: Seen,
    policy: PolicyLoad,
    now: datetime,
    repeated: bool = False,
    newcomer: bool = False,
    *,
    seen_at: datetime | None = None,
) -> ReportPlan:
    """The pure step for one event of one document (see the module docstring). `row` is
    never changed: the plan's row is a copy. `own`: this VM's view of the event
    (`seen_by`, worked out once per document). `repeated`: this VM's previous
    document showed the same view (its VM row says so), so a view the row could not keep
    (beyond MAX_VIEWS) is not counted again. `newcomer`: this VM had not listed the event
    before (an end the other reporters made reopens for it). `seen_at`: when the relay saw
    it. It records and decides; it claims nothing (only the reconcile by key claims and
    acts, functions.pipeline.reconcile)."""
    current = copy_record(row) if row is not None else None
    view, key = own.view, own.key
    seen = Observation(
        event,
        seen_at or now,
        vm=vm,
        describes=_describes(current, vm, key),
        newcomer=newcomer,
    )
    updated = observe(current, seen, now)
    target = updated if updated is not None else current
    if target is None or target.ended:
        return ReportPlan(row=updated, view=view, key=key)
    changed = updated is not None
    made = False
    entry = next((e for e in target.views if e.key == key), None)
    kept = True
    if entry is not None:
        if _moved_to(target, entry, vm.name):
            changed = True
        if target.decision is None:  # views kept by an older row without a decision
            made = _fold(target, entry.decision, now)
            changed = True
    else:
        entry = ViewDecision(
            key=key,
            view=own.kept,
            resources_digest=own.resources_digest,
            resources_count=own.resources_count,
            scale_set=vm.scale_set,
            tags=rule_tags(policy, vm.tags),
            decision=decide(
                policy, event, now, (vm.scale_set,) if vm.scale_set else (), tags=vm.tags
            ),
            decided_at=now,
            first_vm=vm.name,
        )
        full = len(target.views) >= MAX_VIEWS and all(e.first_vm != vm.name for e in target.views)
        if full and repeated:
            kept = False  # counted and folded in when this VM first showed it
        else:
            agreed = not target.views_differ
            kept = _keep(target, entry)
            changed = True
            made = _fold(target, entry.decision, now)
            if agreed and target.views_differ and not made:
                _note_difference(target, now)
    return ReportPlan(
        row=target if changed else None,
        made=made,
        view=view,
        key=key,
        decision=entry.decision,
        kept=kept,
    )


def _describes(row: EventRecord | None, vm: VmRef, key: str) -> bool:
    """Whether this report may move the row's description: the row shows the first view
    kept (or none yet), and only its own VM, or a VM with that same view, moves it."""
    if row is None or not row.views:
        return True
    first = row.views[0]
    return first.first_vm == vm.name or first.key == key


def _keep(record: EventRecord, entry: ViewDecision) -> bool:
    """Add a new view to the row: in place of the one its VM made before (its own view
    moved), else alongside the others while there is room. Returns whether it is kept."""
    own = next((i for i, e in enumerate(record.views) if e.first_vm == entry.first_vm), None)
    kept = True
    if own is not None:
        record.views[own] = entry
    elif len(record.views) < MAX_VIEWS:
        record.views.append(entry)
    else:
        record.views_dropped += 1
        kept = False
    record.views_differ = differing_fields(record.views)
    if record.views_dropped:
        record.views_differ.append(TOO_MANY_VIEWS)
    return kept


def _moved_to(record: EventRecord, entry: ViewDecision, vm: str) -> bool:
    """This VM now shows a view another VM showed first (Azure rescheduled the event and a
    set-mate reported it first): the entry this VM made for its old view goes, so the
    views do not look different for ever. Returns whether one went."""
    stale = [e for e in record.views if e.first_vm == vm and e.key != entry.key]
    if not stale:
        return False
    record.views = [e for e in record.views if e not in stale]
    record.views_differ = differing_fields(record.views)
    if record.views_dropped:
        record.views_differ.append(TOO_MANY_VIEWS)
    return True


def _note_difference(record: EventRecord, now: datetime) -> None:
    """Views of the event differ for the first time, and the event's decision stands (it
    was already the stricter): that is a fact the on-call must see, so the decision is
    announced again (once, as a re-decision with its own MessageId) saying so."""
    assert record.decision is not None
    fields = ", ".join(record.views_differ)
    record.decision = record.decision.model_copy(
        update={
            "reason": f"{record.decision.reason}; reporters' views differ ({fields}): "
            "the stricter decision applies to the whole event"
        }
    )
    if record.announced.pop(Transition.DECIDED.value, None) is not None:
        record.redecided_at = now


def _fold(record: EventRecord, decision: Decision, now: datetime) -> bool:
    """Make `decision` count for the whole event: the event's decision becomes the stricter
    of the two. A stricter decision after one was announced is announced again (as a
    re-decision, with its own MessageId). Returns whether the event's decision changed."""
    if record.decision is None:
        record.decision = decision
        record.decided_at = now
        return True
    strict = stricter(record.decision, decision)
    if strict is record.decision:
        return False
    fields = ", ".join(record.views_differ) or "their views"
    record.decision = strict.model_copy(
        update={
            "reason": f"{strict.reason}; reporters' views differ ({fields}): the stricter "
            "decision applies to the whole event"
        }
    )
    record.decided_at = now
    if record.announced.pop(Transition.DECIDED.value, None) is not None:
        record.redecided_at = now  # a new MessageId for the new `decided`
    if record.approval == "pending" and strict.action != "approve":
        # Not started yet: the approval the looser view asked for is withdrawn (one in
        # progress is the approver's to check: it asks only relays whose view approves).
        record.approval = ""
        record.approve_after = None
        record.approval_reason = f"withdrawn: reporters' views differ ({fields})"
    return True


# ------------------------------------------------------------------ the VM's own row


def is_stale(vm: VmRecord | None, envelope: Envelope) -> bool:
    """Older than what we have: a redelivery or an out-of-order message.

    Both the sequence and the relay's observation time must be no newer: a relay whose
    state was wiped restarts its sequence, but its clock still moves forward.
    """
    if vm is None or vm.last_observed_at is None:
        return False
    return envelope.sequence <= vm.last_sequence and envelope.observed_at <= vm.last_observed_at


RATE_WINDOW = timedelta(hours=1)


def rate_window(vm: VmRecord | None, now: datetime) -> tuple[int, int]:
    """(messages, new events) this VM sent in its current hour, or (0, 0) for a new hour."""
    if vm is None or vm.window_start is None or now - vm.window_start >= RATE_WINDOW:
        return 0, 0
    return vm.window_messages, vm.window_new_events


def new_events(vm: VmRecord | None, events: list[ScheduledEvent]) -> int:
    """Events this VM had not listed before (each can create rows: its event and more)."""
    known = set(vm.event_statuses) | set(vm.late_event_ids) if vm else set()
    return sum(1 for e in events if e.event_id.casefold() not in known)


def over_rate(
    vm: VmRecord | None, events: list[ScheduledEvent], now: datetime, settings: Settings
) -> str:
    """Why this message is over what one VM may send in an hour, or "" when it is not.

    A genuine relay sends a message when its IMDS document changes (a few a day) and sees
    a handful of new events a month; a hostile one could create rows without end (a new
    EventId each message). The bounds are far above the first and far below the second."""
    messages, added = rate_window(vm, now)
    if messages >= settings.max_messages_per_vm_hour:
        return (
            f"more than {settings.max_messages_per_vm_hour} messages from this VM within an "
            "hour (MAX_MESSAGES_PER_VM_HOUR)"
        )
    if added + new_events(vm, events) > settings.max_new_events_per_vm_hour:
        return (
            f"more than {settings.max_new_events_per_vm_hour} new EventIds from this VM within "
            "an hour (MAX_NEW_EVENTS_PER_VM_HOUR)"
        )
    return ""


def next_vm_row(
    current: VmRecord | None,
    envelope: Envelope,
    events: list[ScheduledEvent] | None,
    now: datetime,
    late: set[str],
    views: dict[str, str],
) -> tuple[VmRecord, str | None]:
    """The VM row after this document (pure: `current` is not changed), and the mark of
    an announced silence this document ends (the caller announces its recovery).

    `events`: what the document lists for this VM (None for a message without a
    document); `late`: EventIds it lists only after they ended; `views`: EventId ->
    the key of its view of each (`view_key`)."""
    record = copy_record(current) if current is not None else VmRecord(name=envelope.vm.name)
    messages, added = rate_window(record, now)
    if messages == 0 and added == 0:
        record.window_start = now
    record.window_messages = messages + 1
    record.window_new_events = added + (new_events(record, events) if events is not None else 0)
    mark = claim_recovery(record, now)
    record.last_sequence = max(record.last_sequence, envelope.sequence)
    if record.last_observed_at is None or envelope.observed_at > record.last_observed_at:
        record.last_observed_at = envelope.observed_at
    record.last_seen = now
    ref = envelope.vm
    record.vm_id = ref.vm_id or record.vm_id
    record.callback_url = ref.callback_url or record.callback_url
    record.scale_set = ref.scale_set or record.scale_set
    record.availability_set = ref.availability_set or record.availability_set
    record.resource_id = ref.resource_id or record.resource_id
    record.relay_version = envelope.relay_version
    document = envelope.scheduled_events
    if document is not None and events is not None:
        record.last_incarnation = document.document_incarnation
        record.event_ids = [e.event_id for e in events]
        record.event_statuses = {e.event_id.casefold(): e.event_status for e in events}
        record.late_event_ids = sorted(late)
        record.event_views = dict(views)
        # `unstarted` stays: a Started this VM lists is its own word (relay_phase.suspect).
    return record, mark


# ------------------------------------------------------------------ a VM's view of an event

# Resources an event row keeps with each view (their digest and count beyond).
VIEW_RESOURCE_CHARS = 4000


def view_of(event: ScheduledEvent, vm: str) -> VmView:
    """`vm`'s view of `event`, as its own IMDS showed it."""
    return VmView.of(vm, event)


@dataclass(frozen=True)
class Seen:
    """One VM's view of one event, worked out once per document: the view, its key, and
    the form the event row keeps it in (`kept_view`)."""

    view: VmView
    key: str
    kept: VmView
    resources_digest: str
    resources_count: int


def seen_by(event: ScheduledEvent, vm: str, scale_set: str | None) -> Seen:
    """`vm`'s view of `event` (its reporter in scale set `scale_set`, Azure's fact)."""
    view = view_of(event, vm)
    kept, digest, count = kept_view(view)
    return Seen(view, view_key(view, scale_set), kept, digest, count)


def view_key(view: VmView, scale_set: str | None) -> str:
    """What makes two reports decide alike: the view's fields (not who saw it) and the
    reporter's scale set (Azure's fact), which a policy rule may match."""
    return view.digest() + ("|" + scale_set.casefold() if scale_set else "")


def resources_digest(names: tuple[str, ...]) -> str:
    return hashlib.sha256("\n".join(names).encode()).hexdigest()[:16]


def kept_view(view: VmView) -> tuple[VmView, str, int]:
    """The view as the event row keeps it: its Resources only while they are short
    (VIEW_RESOURCE_CHARS), so MAX_VIEWS views of 1,000 long names still fit the row;
    their digest and count always."""
    names = view.resources
    short = sum(len(n) for n in names) <= VIEW_RESOURCE_CHARS
    kept = view if short else view.model_copy(update={"resources": ()})
    return kept, resources_digest(names), len(names)


# ------------------------------------------------------------------ the whole document


@dataclass
class EventStep:
    """What one event the document lists asks of the store, decided before any write."""

    event: ScheduledEvent
    said_before: str | None  # the status this VM's previous document gave it (None: new)
    late: bool = False  # the VM row says it listed this only after it ended: nothing to do
    ended: bool = False  # the row as remembered has ended (final): a late report only
    open_index: bool = False  # no row remembered: list it in the open index first
    seen: Seen | None = None  # this VM's view of it (`seen_by`)
    ledger: LedgerEntry | None = None  # for its reporter row (functions.ledger.measured)
    repeated: bool = False  # the VM's previous document showed this same view
    reporter: bool = False  # write its reporter row (status or view changed)
    settled: bool = False  # the remembered row needs nothing from this report
    # The row as remembered was ended by its reporters, and this VM's row does not list
    # the event: if the VM never reported it, its report reopens the event for it; if it
    # did (its reporter row says so), it is a late report as before.
    reopens: bool = False
    # It says Started and the row as remembered has not started: a VM's Started is its
    # own word, and the decider derives the event's start from every reporter's view, so
    # the event is reconciled even when the row needs no write.
    starts: bool = False

    @property
    def newcomer(self) -> bool:
        return self.said_before is None


@dataclass
class DocumentPlan:
    """Everything one document changes, as decided from the rows read (`decide_document`).
    `refused` is "stale" or "rejected" (with `reason`) for a document not processed."""

    refused: Literal["", "stale", "rejected"] = ""
    reason: str = ""
    steps: list[EventStep] = field(default_factory=list)
    absent: list[str] = field(default_factory=list)  # EventIds this VM no longer lists
    left: dict[str, LedgerEntry | None] = field(default_factory=dict)  # for each of those
    views: dict[str, str] = field(default_factory=dict)  # EventId (folded) -> view key
    seen_at: datetime | None = None  # when the relay saw it, bounded by the app's clock


def decide_document(
    vm: VmRecord | None,
    remembered: dict[str, EventRecord | None],
    envelope: Envelope,
    events: list[ScheduledEvent],
    policy: PolicyLoad,
    settings: Settings,
    now: datetime,
) -> DocumentPlan:
    """The pure step for one document: from the VM row as read (`vm`), the event rows as
    this worker remembers them (`remembered`, by case-folded EventId; unverified, so an
    event row is written under its ETag and decided again by `decide_report` on a
    conflict), the events the document lists for this VM (those whose Resources name it),
    the policy and the time."""
    if is_stale(vm, envelope):
        return DocumentPlan(refused="stale", reason="sequence already processed")
    too_many = over_rate(vm, events, now, settings)
    if too_many:
        return DocumentPlan(refused="rejected", reason=too_many)
    plan = DocumentPlan()
    for event in events:
        folded = event.event_id.casefold()
        said = vm.event_statuses.get(folded) if vm else None
        if vm is not None and folded in vm.late_event_ids:
            plan.steps.append(EventStep(event, said, late=True))
            continue
        recent = remembered.get(folded)
        step = EventStep(event, said, open_index=recent is None)
        plan.steps.append(step)
        reopens = said is None and recent is not None and recent.ended_by == "reporters"
        if recent is not None and recent.ended and not reopens:
            step.ended = True
            continue
        step.open_index = step.open_index or reopens
        step.reopens = reopens
        step.seen = seen = seen_by(event, envelope.vm.name, envelope.vm.scale_set)
        plan.views[folded] = seen.key
        step.repeated = (vm.event_views.get(folded) if vm else None) == seen.key
        step.reporter = said != event.event_status or not step.repeated
        step.settled = recent is not None and settled(
            recent, event, envelope.vm, seen, policy, now, step.newcomer, step.repeated
        )
        step.starts = event.is_started and recent is not None and not recent.started
    if envelope.scheduled_events is not None and vm is not None:
        listed = {e.event_id.casefold() for e in events}
        for old in vm.event_ids:
            folded = old.casefold()
            if folded not in listed and folded not in vm.late_event_ids:
                plan.absent.append(old)
    plan.seen_at = observed(envelope.observed_at, now)
    # The impact ledger (functions/ledger.py): when this VM's relay saw an event Started,
    # or saw it go, with its polling since the previous document.
    at, polls = envelope.observed_at, envelope.polls
    for step in plan.steps:
        if step.seen is not None:
            event = step.event
            started = event.is_started and step.said_before != event.event_status
            step.ledger = measured(event.event_id, at, polls, started=started, new=step.newcomer)
    plan.left = {old: measured(old, at, polls, left=True) for old in plan.absent}
    return plan


def settled(
    recent: EventRecord,
    event: ScheduledEvent,
    vm: VmRef,
    own: Seen,
    policy: PolicyLoad,
    now: datetime,
    newcomer: bool,
    repeated: bool,
) -> bool:
    """Whether this report needs nothing from the event row, judged from the row as this
    worker last saw it (not ended), without reading it again. Only facts that do not
    change back are relied on: a decision announced stays announced, its views and
    resources and sets only grow, Started stays Started. A change, a pending claim, a
    re-decision or a possible approval retry goes the read-and-write way."""
    decision = recent.decision
    if decision is None or should_redecide(recent, policy, now):
        return False
    if any(mark != claims.DONE for mark in recent.announced.values()):
        return False
    if newcomer:
        # The approval may be waiting for this VM's relay (the event names it, as every
        # event decide_document is given does): only a final state is safe.
        final = recent.approval in ("approved", "failed") or (
            recent.approval == "" and decision.action != "approve"
        )
        if not final:
            return False
    plan = decide_report(recent, event, vm, own, policy, now, repeated, newcomer)
    return plan.row is None


def decide_grid(
    target: EventRecord, event: ScheduledEvent, policy: PolicyLoad, now: datetime
) -> bool:
    """Decide an event the first time Event Grid reports it (or once more, after it failed
    closed on an invalid policy and this host's policy is valid), in place. Returns
    whether it decided now (its announcement is the decider's to claim)."""
    if target.decision is None:
        target.decision = decide(policy, event, now, tuple(target.scale_sets))
        target.decided_at = now
        return True
    if should_redecide(target, policy, now):
        redecide(target, policy, now, event)
        return True
    return False
