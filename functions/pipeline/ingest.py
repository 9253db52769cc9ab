"""Ingest one envelope: VM state, event lifecycle, the decision, announcements, approval.

The Service Bus handler and the local host both call `ingest_message`; it takes every
collaborator as an argument. Its contract with the caller:
- it returns normally when the message is done with (processed, a stale duplicate, or
  rejected and recorded): complete the message;
- it raises when something transient failed (storage, the topic): abandon the message so
  it is redelivered; everything here is idempotent, so the redelivery is harmless.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

from azure.core.exceptions import HttpResponseError

from functions.model.envelope import (
    DocumentError,
    Envelope,
    LedgerEntry,
    ScheduledEvent,
    VmRef,
    looks_like_event_grid,
    parse_envelope,
)
from functions.pipeline.admission import NotAdmitted
from functions.pipeline.context import Pipeline
from functions.pipeline.decide import (
    EventStep,
    ReportPlan,
    decide_document,
    decide_report,
    next_vm_row,
)
from functions.pipeline.due import conditions
from functions.pipeline.guest_time import out_of_bounds, utc, vm_time
from functions.pipeline.reconcile import enqueue, reconcile_key
from functions.pipeline.redecide import should_redecide
from functions.pipeline.relay_recovery import announce_recovery
from functions.pipeline.results import IngestResult
from functions.store import claims
from functions.store.acks import acknowledge
from functions.store.records import EventRecord, VmRecord
from functions.store.rows import RowTooLarge
from functions.store.state import Store

log = logging.getLogger(__name__)


def ingest_message(
    body: bytes | str,
    pipeline: Pipeline,
    message_id: str = "",
    session_id: str | None = None,
    enqueued_at: datetime | None = None,
) -> IngestResult:
    """Process one message body from the documents queue (or the local inbox).

    A problem with the message itself is permanent: it is recorded in the rejected table
    with the reason and the message is completed, so a redelivery (and the VM's session)
    never waits on it. That is an envelope that does not validate, and a row Table
    storage refuses outright (400/413: a property or entity too large, a value out of
    range) for a message that validated; the bounds in functions.model.envelope keep the
    latter from happening for anything a relay sends. Everything else raises (transient).
    `session_id`: the message's Service Bus SessionId (None where there is none, as in the
    local inbox): it must name the sender's own vmId (the relay's, contract §1), or the
    message is refused, so no VM writes into another VM's session or spreads over many.
    `enqueued_at`: when Service Bus first enqueued it (None where unknown): the relay's
    time is taken as never later than that (functions.pipeline.guest_time).

    One that reached the lifecycle (or was refused for good) is acknowledged last
    (contract §11, functions.store.acks), with the key it carries: its attestation vouches
    for it, so a VM acknowledges only its own rows. Not one over a per-VM bound, from a
    clock ahead or with a NotBefore too far out: time heals those, and the relay resends.
    """
    try:
        result, acks = _ingest_message(body, pipeline, message_id, session_id, utc(enqueued_at))
    except _Refused as refused:
        # Recorded with its body and the reason, then completed.
        log.warning("rejected message %s: %s", message_id or "?", refused.reason)
        at = refused.now or pipeline.clock.now()
        pipeline.store.reject(at=at, reason=refused.reason, body=body, message_id=message_id)
        result = IngestResult(outcome="rejected", vm=refused.vm, reason=refused.reason)
        acks = refused.acks
    if acks is not None and acks.sequences:
        acknowledge(pipeline.store.liveness.table, bytes.fromhex(acks.secret), acks.sequences)
    return result


@dataclass(frozen=True)
class _Acks:
    """What acknowledging a document takes: the relay's callback key and the sequences."""

    secret: str
    sequences: list[int]


@dataclass(eq=False)
class _Refused(Exception):
    """A message refused for good: recorded with the reason, then completed; `acks`: what
    to acknowledge too (it reached the lifecycle)."""

    reason: str
    vm: str | None = None
    now: datetime | None = None
    acks: _Acks | None = None


def _ingest_message(
    body: bytes | str,
    pipeline: Pipeline,
    message_id: str,
    session_id: str | None,
    enqueued: datetime | None,
) -> tuple[IngestResult, _Acks | None]:
    """The result, and what to acknowledge (None: nothing). Raises _Refused."""
    if looks_like_event_grid(body):
        # Only the system topic can send to EVENTGRID_QUEUE; every relay can send here. An
        # Event Grid body on this queue is a VM posing as Azure (it would end or cancel any
        # event fleet-wide), so it is refused, with the reason.
        raise _Refused(EVENT_GRID_HERE)
    now = pipeline.clock.now()
    try:
        envelope = parse_envelope(body)
    except DocumentError as exc:
        raise _Refused(str(exc)) from None
    if pipeline.admission is None:
        raise _Refused("no identity check configured: refused")
    try:
        ref = pipeline.admission.admit(body, envelope, now)
    except NotAdmitted as exc:
        raise _Refused(str(exc)) from None
    # FactsUnavailable propagates: Resource Graph may not show a new VM for a minute, so
    # the message is abandoned and redelivered, not rejected.
    if session_id is not None and session_id.casefold() not in _own_sessions(ref):
        # Refused loudly (recorded with the reason), never left to dead-letter: a VM's
        # messages in another VM's session would hold up that VM's documents.
        raise _Refused(
            f"SessionId {session_id[:128]!r} is not the sender's vmId ({ref.vm_id}): a relay "
            "sends in its own VM's session only",
            vm=ref.name,
            now=now,
        )
    envelope = envelope.model_copy(update={"vm": ref})
    name = ref.name
    if envelope.kind == "preflight":
        # The relay's `check` (relay/preflight.py): admitted is all it asks; no VM or event
        # row is touched.
        log.info("relay preflight from %s (vmId %s): admitted", name, ref.vm_id)
        return IngestResult(outcome="preflight", vm=name, reason="relay preflight: admitted"), None
    if envelope.kind == "unforwardable":
        facts = envelope.unforwardable
        assert facts is not None
        reason = (
            f"relay on {name} could not forward IMDS document incarnation "
            f"{facts.incarnation} ({facts.bytes} bytes): {facts.reason}"
        )
        raise _Refused(reason, vm=name, now=now)
    problem = out_of_bounds(envelope, now, pipeline.settings.max_not_before_days, enqueued)
    if problem:
        # Not acknowledged: time heals both bounds (a clock ahead, a NotBefore too far),
        # and the relay sends the same document again (contract §11).
        raise _Refused(problem, vm=name, now=now)
    # From here the relay's time is Azure's where its clock runs ahead (guest_time).
    envelope = envelope.model_copy(update={"observed_at": vm_time(envelope.observed_at, enqueued)})
    key = envelope.callback_key
    acks = _Acks(key.secret, list(envelope.acks)) if key is not None and envelope.acks else None
    try:
        result = ingest_envelope(envelope, pipeline)
        if result.outcome == "rejected":  # over a per-VM bound: recorded with its body
            # Not acknowledged: it may pass once the VM is within the bound again.
            pipeline.store.reject(at=now, reason=result.reason, body=body, message_id=message_id)
            log.warning("rejected message %s: %s", message_id or "?", result.reason)
            return result, None
    except RowTooLarge as exc:
        # Bounded pieces make this unreachable for anything IMDS sends; if it happens the
        # message is kept with the reason instead of failing until it dead-letters.
        reason = f"state would exceed a Table size limit: {exc}"
        raise _Refused(reason, vm=name, now=now, acks=acks) from None
    except HttpResponseError as exc:
        if exc.status_code not in REFUSED_BY_TABLES:
            raise
        code = getattr(exc, "error_code", None) or f"HTTP {exc.status_code}"
        reason = f"Table storage refused a row for this message ({code}): {_first_line(exc)}"
        raise _Refused(reason, vm=name, now=now, acks=acks) from None
    return result, acks


def _own_sessions(ref: VmRef) -> set[str]:
    """The SessionIds the sender may use: its vmId (a relay of before contract 2 without
    one used its name, relay/models.py `session_id`)."""
    return {value.casefold() for value in (ref.vm_id, ref.name) if value}


REFUSED_BY_TABLES = frozenset({400, 413})
EVENT_GRID_HERE = (
    "an Event Grid event on the documents queue: Event Grid events are accepted only from "
    "EVENTGRID_QUEUE, which only the system topic can send to"
)


def _first_line(exc: Exception) -> str:
    return (str(exc).splitlines() or [""])[0][:300]


def ingest_envelope(envelope: Envelope, pipeline: Pipeline) -> IngestResult:
    """One admitted message: `envelope.vm` is Azure's description of its sender."""
    store, clock = pipeline.store, pipeline.clock
    name = envelope.vm.name
    tag = message_tag(envelope)
    result = IngestResult(outcome="processed", vm=name)
    document = envelope.scheduled_events
    # At most MAX_EVENTS events (functions.model.envelope rejects more with the reason).
    # A VM speaks only for itself: an event whose Resources do not name it is not its
    # report to make (an old relay forwards its whole set's events; a hostile one could
    # report any). Its absence from later documents then ends nothing of another VM's.
    listed: list[ScheduledEvent] = list(document.events) if document else []
    current = [e for e in listed if e.affects(name)]
    result.ignored_events = len(listed) - len(current)
    # Event rows written (or due a retry), kept across attempts: a write of an earlier
    # attempt whose VM row moved still holds the claims it took (claims name this message
    # as their holder, so its reconcile acts on them at once).
    touched: dict[str, EventRecord] = {}
    for attempt in range(20):
        # Read: the VM row (or a safe guess of it) and the event rows as remembered.
        vm, guessed = _vm_row(store, envelope, current, first=attempt == 0)
        now = clock.now()
        remembered = {e.event_id.casefold(): store.recent_event(e.event_id) for e in current}
        # Decide: every change of this document, in one pure step.
        plan = decide_document(
            vm, remembered, envelope, current, pipeline.settings.policy, pipeline.settings, now
        )
        if plan.refused == "stale" and vm is not None and envelope.sequence == vm.last_sequence:
            # The last document processed, delivered again: the host that took it may have
            # died after saving the VM row. What its events still need is in their rows.
            _reconcile_listed(pipeline, tag, current, result)
        if plan.refused:
            return result.model_copy(update={"outcome": plan.refused, "reason": plan.reason})
        # Write: event rows first, VM row last: if we crash in between, the redelivery is
        # not "stale" and redoes the (idempotent) event updates.
        late: set[str] = set()  # events this VM lists only after they ended
        for step in plan.steps:
            _write_step(step, envelope.vm, tag, plan.seen_at, pipeline, now, result, touched, late)
        for old in plan.absent:
            _absent(old, plan.left.get(old), envelope, tag, pipeline, now, result, plan.seen_at)
        recovered: list[str] = []  # the silence this document ends, if announced
        saved = _save_vm(
            store,
            vm,
            envelope,
            current if document is not None else None,
            now,
            late,
            recovered,
            plan.views,
        )
        if saved:
            # After the VM row, so this VM's callback URL is known to the approver. Each
            # event written is reconciled by its key (level-triggered: a redelivery or the
            # sweep would find the same): here while the document has one, through the
            # work queue when it has more, so each costs its own unit of work and budget,
            # never one approval after another in this message's time.
            if len(touched) > INLINE_EVENTS:
                enqueue(pipeline, [r.event_id for r in touched.values()], now)
            for record in touched.values() if len(touched) <= INLINE_EVENTS else ():
                _reconcile(pipeline, record.event_id, result, tag, record)
            for mark in recovered:
                # After the document's own work: a topic failure here must not redeliver a
                # document that is already processed (it would be stale); the watchdog
                # publishes it later.
                try:
                    announce_recovery(store, pipeline.publisher, name, mark, now)
                except Exception:
                    log.exception("relay_recovered for %s not published; watchdog retries", name)
            return result
        if not guessed:
            log.info("VM row %s changed concurrently; re-reading", name)
    raise RuntimeError(f"VM row {name} kept changing; giving up this delivery")


# Events one document reconciles itself; a document with more hands them all to the work
# queue (functions.pipeline.workqueue): each then costs its own unit of work, in parallel.
INLINE_EVENTS = 1


def _reconcile(
    pipeline: Pipeline,
    event_id: str,
    result: IngestResult,
    me: str,
    row: EventRecord | None = None,
) -> None:
    """Reconcile one event by its key, here (the document's processing is its unit of
    work: its claims are held by this message, `me`)."""
    done = reconcile_key(pipeline, event_id, me, row=row, worker=False)
    result.transitions.extend((event_id, t.value) for t in done.published)
    if done.approval is not None:
        result.approvals.append(done.approval)


def _reconcile_listed(
    pipeline: Pipeline, tag: str, events: list[ScheduledEvent], result: IngestResult
) -> None:
    """A redelivered document: each event it lists, by its key (only the last document of
    a VM is reconciled this way, so an old message replayed costs nothing)."""
    for event in events:
        _reconcile(pipeline, event.event_id, result, tag)


def message_tag(envelope: Envelope) -> str:
    """Which message took an approval claim: a relay numbers its messages, and Service Bus
    hands a VM's session to one host at a time, so no live host processes the same one."""
    return f"doc:{envelope.vm.name}:{envelope.sequence}"


# How far apart in the relay's own time two documents may be for the second to start from
# the row the first left: a relay heartbeats every 300 s by default, and a heartbeat takes
# a sequence number of its own, so a longer gap could never pass the sequence test anyway.
FOLLOW_WINDOW = timedelta(minutes=10)


def _vm_row(
    store: Store, envelope: Envelope, events: list[ScheduledEvent], *, first: bool
) -> tuple[VmRecord | None, bool]:
    """The VM row to process this document against, and whether it is a guess.

    A guess saves the read: the conditional VM write at the end checks it, and if the row
    moved, the document is processed again from a fresh read (everything before that
    write is idempotent). Two guesses are taken on the first attempt only:
    - a relay's first message with no events: no row yet (`_first_and_idle`);
    - the very next document of a relay whose row this Store last read or wrote
      (`_follows`): the row is then what that document left, as a fresh read would find.
    """
    if first:
        if _first_and_idle(envelope, events):
            return None, True
        recent = store.recent_vm(envelope.vm.name)
        if recent is not None and _follows(recent, envelope):
            return recent, True
    return store.get_vm(envelope.vm.name), False


def _follows(row: VmRecord, envelope: Envelope) -> bool:
    """Whether `envelope` is the relay's next message after the one that left `row`.

    Why this makes the remembered row as good as a fresh read for the facts ingest reads
    before its guarded write (the stale test, the statuses this VM last reported, its
    event list): only ingest of this VM's documents writes those, and the relay numbers
    every message, heartbeats included. Any other instance that wrote this VM's row since
    processed this same message (a redelivery: the same idempotent writes) or a later one,
    which Service Bus sessions hand out only after this one was taken, and then a fresh
    read taken when this delivery began would have missed it as well. A relay that was
    reinstalled restarts its numbers; the time window keeps an old row from matching its
    new numbers by chance. Other writers (heartbeats, the watchdog) change the ETag, so
    the guarded write catches them."""
    if row.last_observed_at is None or envelope.sequence != row.last_sequence + 1:
        return False
    return row.last_observed_at < envelope.observed_at <= row.last_observed_at + FOLLOW_WINDOW


def _first_and_idle(envelope: Envelope, events: list[ScheduledEvent]) -> bool:
    """A relay's first message (sequence 1: a new VM, or a reimaged one) with no events.

    Such a VM usually has no row yet, so the read that would find none is skipped: the
    row is inserted straight away. Nothing is written before that insert (no events, and
    no row means no old events to end), so if a row does exist the insert fails, nothing
    has changed, and the document is processed again from a fresh read, as any document
    whose VM row moved under it."""
    return envelope.sequence <= 1 and not events


def _save_vm(
    store: Store,
    vm: VmRecord | None,
    envelope: Envelope,
    events: list[ScheduledEvent] | None,
    now: datetime,
    late: set[str],
    recovered: list[str] | None = None,
    views: dict[str, str] | None = None,
) -> bool:
    """Write the VM row only if nobody else did since we read it (else the caller redoes).

    The write starts from the row read at the top of ingest (its ETag guards it), so a
    document costs one read of the VM row, not two. A silence announced for this VM ends
    here: its mark goes to `recovered` for the caller to announce (once: only one writer
    of the row sees it)."""
    expected = vm.etag if vm else None
    claimed: list[str] = []

    def change(current: VmRecord | None) -> VmRecord | None:
        claimed.clear()
        if (current.etag if current else None) != expected:
            raise _Moved
        record, mark = next_vm_row(current, envelope, events, now, late, views or {})
        if mark is not None:
            claimed.append(mark)
        return record

    try:
        store.mutate_vm(envelope.vm.name, change, known=vm)
    except _Moved:
        return False
    if recovered is not None:
        recovered.extend(claimed)
    return True


class _Moved(Exception):
    pass


def _write_step(
    step: EventStep,
    ref: VmRef,
    tag: str,
    seen_at: datetime | None,
    pipeline: Pipeline,
    now: datetime,
    result: IngestResult,
    touched: dict[str, EventRecord],
    late: set[str],
) -> None:
    """Write what `decide_document` decided for one listed event; the event row under
    its ETag, deciding again (`decide_report`) on fresh reads when it moved. Nothing is
    announced or approved here: the row written holds the intent (claims), and the
    caller reconciles it once the VM row is saved."""
    store = pipeline.store
    name = ref.name
    event, said_before, newcomer = step.event, step.said_before, step.newcomer
    if step.late:
        # Its reporter row already says past reporter, and the event stays ended.
        late.add(event.event_id.casefold())
        return
    if step.open_index:
        # Listed before its row can exist, so the watchdog never misses an event; once per
        # event and Store (an event seen here before is listed already, or ended).
        store.open_event(event.event_id, now)
    if step.ended:
        _late_report(event, name, said_before, store, now, late)
        return
    own, repeated = step.seen, step.repeated
    assert own is not None  # decide_document saw every event it did not settle as ended
    view, seen_as = own.view, own.key
    ledger = step.ledger
    if step.reporter:
        # This VM's own reporter row, with its own view, before the event row: an end
        # decided from now on sees it (functions.pipeline.transitions.end_event). A VM
        # new to the event inserts it: a row already there says it reported it before.
        fresh = store.set_reporter(
            event.event_id,
            name,
            event.event_status,
            now,
            view=view,
            key=seen_as,
            first=newcomer,
            ledger=ledger,
            seen=seen_at,
            vm_id=ref.vm_id or "",
        )
        if step.reopens and not fresh:
            # It reported the event before it ended: a late report, not a reopening.
            store.set_reporter(event.event_id, name, "", now)
            late.add(event.event_id.casefold())
            return
        newcomer = newcomer and fresh
    if step.settled:
        remembered = store.recent_event(event.event_id) if step.starts else None
        if remembered is not None:
            touched[remembered.event_id.casefold()] = remembered
        return
    plans: list[ReportPlan] = []

    def change(rec: EventRecord | None) -> EventRecord | None:
        plan = decide_report(
            rec, event, ref, own, pipeline.settings.policy, now, repeated, newcomer, seen_at=seen_at
        )
        plans[:] = [plan]
        return plan.row

    record, won = store.mutate_event(event.event_id, change)
    plan = plans[0]
    overflow = not plan.kept and not repeated and plan.decision is not None
    if record is not None and not record.ended and overflow:
        # Beyond MAX_VIEWS the event row does not keep this view: its decision stays with
        # this VM's own reporter row (one more write, only for an event with that many).
        store.set_reporter(
            event.event_id,
            name,
            event.event_status,
            now,
            view=view,
            key=seen_as,
            decision=plan.decision,
            ledger=ledger,
            vm_id=ref.vm_id or "",
        )
    if record is not None and record.ended and newcomer:
        # A late report after the event ended: remember the VM as a past reporter only.
        _late_report(event, name, said_before, store, now, late)
    if record is None or (record.ended and not won):
        return
    pending = any(claims.is_pending(m) for m in record.announced.values())
    unannounced = any(t.value not in record.announced for t in conditions(record, now))
    if (
        won
        or pending  # claimed and not done: reconcile republishes what expired
        or unannounced  # written by a delivery whose host died before reconciling it
        or (newcomer and _may_retry(record))
        or (event.is_started and not record.started)  # the decider derives the start
        or should_redecide(record, pipeline.settings.policy, now)  # the policy is valid again
    ):
        # A named VM (every event ingest decides names its VM) whose relay was not known
        # when the approval was last tried may still approve it now: reconciled too.
        touched[record.event_id.casefold()] = record


def _late_report(
    event: ScheduledEvent,
    name: str,
    said_before: str | None,
    store: Store,
    now: datetime,
    late: set[str],
) -> None:
    """A report of an event known to have ended (ending is final, so no read is needed):
    the VM's own row only. A VM new to the event is only a past reporter (status ""),
    written once: it joins `late`, which its VM row keeps, so its later documents write
    nothing for it. One that reported it before keeps its status."""
    if said_before is None:
        store.set_reporter(event.event_id, name, "", now)
        late.add(event.event_id.casefold())
    elif said_before != event.event_status:
        store.set_reporter(event.event_id, name, event.event_status, now)


def _may_retry(record: EventRecord) -> bool:
    return (
        record.approval == "pending"
        and record.approve_after is None
        and record.approval_reason != "capacity"
    )


def _absent(
    event_id: str,
    ledger: LedgerEntry | None,
    envelope: Envelope,
    tag: str,
    pipeline: Pipeline,
    now: datetime,
    result: IngestResult,
    seen_at: datetime | None,
) -> None:
    """This VM no longer lists the event: its reporter row says so (with when its relay
    saw it go (`seen_at`), and its relay's measurements of the event, in the same write); then the
    event is reconciled by its key, where the decider reads every reporter row: nobody
    lists it any more (it ends, as of when the last relay saw it go), or the others went
    silent. While a few others still list an event before its start, nothing can end."""
    store, vm = pipeline.store, envelope.vm.name
    # Own row first, then look for anyone else: of two last reporters leaving at once,
    # the later query sees both rows, so at least one of them ends the event.
    store.set_reporter(event_id, vm, "", now, ledger=ledger, seen=seen_at or now)
    seen = store.recent_event(event_id)
    if seen is not None and seen.ended and _still_ended(store, event_id):
        return  # ending is final: nothing more to do for a late leaver
    others = store.active_reporters(event_id, SILENCE_CHECK_AT_LEAVE)
    past = seen is None or seen.started or (seen.not_before is not None and now >= seen.not_before)
    if others and (not past or len(others) > SILENCE_CHECK_AT_LEAVE):
        return  # others list it: their documents (or the sweep) end it
    record = seen or store.get_event(event_id)  # a remembered row: its ETag guards the end
    if record is None or record.ended:
        return
    _reconcile(pipeline, event_id, result, tag, record)


# Others still listing an event a VM left whose silence that VM's document checks (their
# VM rows, stopping at the first heard): beyond this many, their own documents (or the
# sweep, which looks at every open event at least hourly) end it.
SILENCE_CHECK_AT_LEAVE = 8


def _still_ended(store: Store, event_id: str) -> bool:
    """An end remembered here may have been undone since (another VM's first report
    reopened it): one read says, and only for an event this worker saw end."""
    record = store.get_event(event_id)
    return record is None or bool(record.ended)
