"""Reconcile one event by its key: read its rows, decide what is due, do it, record when
it is next due (docs/lifecycle.md).

Every entry point records what it saw and then reconciles the event by its key
(`reconcile_key`): ingest (a relay's document), Event Grid and a person's approval inline
(the caller waits), the sweep's workers and a document with many events through the work
queue. Only here are claims taken and effects done; what is due is decided by
functions.pipeline.due alone, from the rows `reconcile_key` reads itself (the event row;
its reporter rows and its reporters' VM rows when their silence can end it: `load_facts`,
below). Each effect is
idempotent and marked done in the row:

1. changes of state first, each followed by a fresh decision on the row it wrote: the end,
   the start derived from the reporters' own views, a fail-closed decision decided again,
   an approval that reached Azure but was never recorded (each a pure change of the row,
   functions.pipeline.lifecycle, written here under the row's ETag, as every claim is);
2. announcements, in the order a person reads them (claimed, published, marked done);
3. slots the row no longer entitles the event to, given back;
4. closing: out of the open index (after the undrain of a drained event);
5. the drain of a `drain` decision, from the row;
6. the approval (its capacity slots first), within its own budget;
7. when the event is next due, in the open index, so the sweep finds it then.
Raises when the topic or storage fails (the message is redelivered, or the next sweep
finds the event again); approval trouble is an outcome, never raised.
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from datetime import datetime, timedelta
from typing import Any

from functions.model.envelope import STARTED
from functions.model.event import Transition
from functions.pipeline import capacity
from functions.pipeline.announce import mark_done, publish_due
from functions.pipeline.approval_record import ApprovalResult
from functions.pipeline.approve import approve_claimed
from functions.pipeline.context import Pipeline
from functions.pipeline.due import ORDER, Due, Facts, due
from functions.pipeline.lifecycle import (
    change_of_state,
    claiming,
    holds_approval,
    noting_drain,
)
from functions.pipeline.results import Reconciled
from functions.store import claims
from functions.store.records import EventRecord
from functions.store.reporters import Reporter
from functions.store.rows import BadRow

log = logging.getLogger(__name__)

UNLISTED_AFTER = timedelta(minutes=10)  # an index row with no event row this old: dropped
# The drain workflow's outcomes: once one is recorded, the drain ran to its end (its steps'
# rows say what it did), and is not due from the row any more.
DRAIN_SETTLED = frozenset({"approved", "approval_failed", "held", "skipped"})


def _reconcile_row(
    pipeline: Pipeline,
    record: EventRecord,
    me: str,
    facts: Facts,
    worker: bool,
    rows: list[Reporter] | None,
) -> Reconciled:
    """Do what `due` says `record` still needs. `record` is the row as last read or
    written (its ETag guards every write: a stale copy costs a re-read, never a wrong
    write). `me`: the holder name of the caller's claims. `facts`: what reconcile_key read
    beside the row. `worker`: the caller is a unit of work of its own (the sweep's), which
    may run the drain workflow. `rows`: its reporter rows as read (the approver's own
    views come from them, no second query)."""
    out = Reconciled(record.event_id)
    try:
        return _reconcile(pipeline, record, out, me, facts, worker, rows)
    except Exception as exc:
        exc.reconciled = out  # type: ignore[attr-defined]  # what it did before it failed
        with contextlib.suppress(Exception):  # storage may be what failed
            # Due again at once: the next sweep finds what this one could not finish
            # (a redelivery of the message may come first; either way, nothing is lost).
            pipeline.store.set_due(record.event_id, pipeline.clock.now())
        raise


def _reconcile(
    pipeline: Pipeline,
    record: EventRecord,
    out: Reconciled,
    me: str,
    facts: Facts,
    worker: bool,
    rows: list[Reporter] | None,
) -> Reconciled:
    store, settings = pipeline.store, pipeline.settings
    now = pipeline.clock.now()
    limit = settings.eventgrid_end_after_seconds
    grid_end = timedelta(seconds=limit)
    plan = Due()
    starting: datetime | None = None
    for _ in range(5):  # each change of state, then a fresh decision on the row it wrote
        plan = _due(pipeline, record, facts, me, now, grid_end)
        starting = plan.start_at
        left_at = facts.left_at or now
        step = change_of_state(plan, record, left_at, now, me, settings.policy, limit)
        if step is None:
            break
        if step.audit is not None:
            store.audit(record.event_id, **step.audit)
        updated, won = store.mutate_event(record.event_id, step.change, known=record)
        changed = updated if won else None
        if plan.end:
            out.ended = plan.end if changed is not None and changed.ended else out.ended
            facts = Facts()
        out.redecided = out.redecided or (plan.redecide and changed is not None)
        out.settled = plan.settle if plan.settle and changed is not None else out.settled
        record = changed or store.get_event(record.event_id) or record
    go = plan.approve and not plan.release
    if go and plan.capacity:
        taken, out.waiting_for_capacity = capacity.take_slots(pipeline, record, now)
        if not taken:
            # Waiting for a slot (its set's, or a budget's): the row says for what before
            # the announcements go out, so the `decided` card says "waiting for budget".
            go = False
            record = store.recent_event(record.event_id) or record
    if plan.announce or go:
        # The announcements due and the approval (its slots taken first) in one write.
        relay, budget = "relay" in settings.approver_order, settings.approval_budget_seconds
        claim = claiming(plan.announce, now, me, approve=go, budget_seconds=budget, relay=relay)
        record = store.mutate_event(record.event_id, claim, known=record)[0] or record
        # The approval's claim taken:
        go = go and holds_approval(record, me) and record.approval == "in_progress"
    sending = [
        t
        for t in (*ORDER, *plan.publish)
        if (t in plan.publish or t in plan.announce)
        and claims.is_pending(record.announced.get(t.value))
        and claims.is_free(record.announced.get(t.value), now, me)
    ]
    sending = list(dict.fromkeys(sending))
    defer = tuple(sending) if go else ()  # marked done in the write recording the approval
    audited: list[dict[str, Any]] = []  # audit rows written with the announcements' mark
    if sending:
        holder = me if go else ""  # the approval's claim, claimed with them
        audited = publish_due(
            pipeline, record, sending, now, plan.overdue, deferred=bool(defer), approving=holder
        )
        out.published = sending
        if not defer:
            record = store.recent_event(record.event_id) or record
            waited, plan = plan.approve, _due(pipeline, record, Facts(), me, now, grid_end)
            if not waited and _due(pipeline, record, facts, me, now, grid_end).approve:
                enqueue(pipeline, [record.event_id], now)  # due since: a waiter's wake-up
    if plan.give_back or plan.count:  # count: never with plan.close (Started, not ended)
        # Given back the moment the row stops entitling it (every taker also checks each
        # holder's row, so a slot left behind by a crash is never held for good); the
        # events waiting for it are woken once it is, earliest NotBefore first.
        woken, counted = capacity.settle_slots(
            pipeline, record, now, give_back=plan.give_back, count=plan.count
        )
        enqueue(pipeline, woken, now)
        record = counted or record
    if plan.close:
        if plan.undrain and not _drain(pipeline, record, "undrain", worker):
            pipeline.store.set_due(record.event_id, now)  # the sweep's worker undrains it
            out.next_at = now
            return out
        store.close_event(record.event_id, record.ended_at or now)
        out.closed = True
        return out
    if plan.drain and worker and pipeline.drainer is not None:
        outcome = _drain(pipeline, record, "drain", worker)
        record = store.recent_event(record.event_id) or record
        recorded = record.drain_outcome == outcome
        if isinstance(outcome, str) and outcome in DRAIN_SETTLED and not recorded:
            record = (
                store.mutate_event(record.event_id, noting_drain(outcome), known=record)[0]
                or record
            )
    if go:
        by = plan.by or "policy"
        record = (
            _approve(pipeline, record, plan, me, by, now, (defer, audited), out, rows) or record
        )
    final = store.recent_event(record.event_id) or record
    if not final.ended or not out.closed:
        later = _due(pipeline, final, Facts(), me, pipeline.clock.now(), grid_end)
        at = later.next_at
        if starting is not None and not final.started:  # a reporter's Started, waiting
            at = min(at, starting) if at is not None else starting
        out.next_at = _schedule(pipeline, final, at, now)
    return out


def _due(
    pipeline: Pipeline,
    record: EventRecord,
    facts: Facts,
    me: str,
    now: datetime,
    grid_end: timedelta,
) -> Due:
    drained = record.drain_outcome in DRAIN_SETTLED if record.drain_outcome else None
    if pipeline.drainer is None:
        drained = True  # no drain workflow here: nothing is due of it from the row
    return due(
        record,
        pipeline.settings.policy,
        now,
        facts=facts,
        me=me,
        grid_end_after=grid_end,
        drain_settled=drained,
    )


# ------------------------------------------------------------------ what the decider reads

# Reporters whose VM rows a reconcile reads to tell whether all went silent: an event with
# more is ended by their documents (or Azure), never by reading a thousand rows.
MAX_SILENCE_READS = 100


def load_facts(
    pipeline: Pipeline, record: EventRecord, now: datetime, rows: list[Reporter] | None = None
) -> tuple[Facts, list[Reporter] | None]:
    """What the decider reads beside an open event's row: its reporter rows (one partition
    query: who still lists it, each one's own status, view and when its relay saw it; the
    approver uses the same rows) and, once it is past its start, whether every VM that
    still lists it went silent (their VM rows, up to MAX_SILENCE_READS, stopping at the
    first that was heard). The rows are None for an ended event (nothing read). `rows`:
    the reporter rows as the caller read them with the event row (one query for both:
    Store.event_and_reporters), not queried again."""
    if record.ended:
        return Facts(), None
    if rows is None:
        rows = pipeline.store.reporter_rows(record.event_id)
    current = {r.vm: r for r in rows if r.status}
    record.reporters = {vm: r.status for vm, r in current.items()}
    record.past_reporters = [r.vm for r in rows]
    reporting = bool(current)
    past = record.started or (record.not_before is not None and now >= record.not_before)
    silent: bool | None = None
    if past and reporting:
        silent = all_silent(pipeline, list(current), now)
    said_started = [r.seen or now for r in current.values() if r.status == STARTED]
    gone = [r.seen for r in rows if not r.status and r.seen is not None]
    known = {r.vm.casefold() for r in rows}
    facts = Facts(
        unreported=any(vm.casefold() not in known for vm in record.resources),
        reporting=reporting,
        reported=bool(rows),
        silent=silent,
        left_at=max(gone) if gone and not reporting else None,
        started_seen=min(said_started) if said_started else None,
        scheduled=any(r.status != STARTED for r in current.values()),
    )
    return facts, rows


def all_silent(pipeline: Pipeline, names: list[str], now: datetime) -> bool:
    """Every one of these VMs' relays was last heard (a message, a Service Bus heartbeat,
    its verified liveness row) longer than RELAY_SILENT_AFTER_SECONDS ago; False at the
    first that was heard since, or past MAX_SILENCE_READS VMs."""
    if not names or len(names) > MAX_SILENCE_READS:
        return False
    quiet = timedelta(seconds=pipeline.settings.relay_silent_after_seconds)
    verify = pipeline.liveness_verifier
    for name in names:
        vm = pipeline.store.get_vm(name)
        if vm is None:
            continue  # its row is gone (forgotten): nothing will be heard from it
        # Its last message, or its verified liveness hint if later.
        heard = pipeline.store.liveness.last_heard(
            vm.vm_id, vm.last_seen, verify, silent_after=quiet, now=pipeline.clock.now()
        )
        if heard is not None and now - heard <= quiet:
            return False
    return True


# ------------------------------------------------------------------ drain, approval


def _drain(pipeline: Pipeline, record: EventRecord, what: str, worker: bool) -> str | bool:
    """The drain workflow (functions.terminate) for this event, from the row. The
    undrain returns whether the event may close; the drain, its outcome."""
    if pipeline.drainer is None:
        return what == "undrain"  # no drain workflow here: nothing to put back from the row
    if not worker:
        # In a document's or a notification's processing: the sweep's unit of work
        # undrains, then closes the event (level-triggered: the end's notification may
        # never reach the drain's handler, which also undrains: each step runs once).
        return False
    try:
        outcome = pipeline.drainer(what, record)
    except Exception:
        log.exception("%s of %s failed; the next sweep tries again", what, record.event_id)
        return False
    return True if what == "undrain" else outcome


def _approve(
    pipeline: Pipeline,
    record: EventRecord,
    plan: Due,
    me: str,
    by: str,
    now: datetime,
    deferred: tuple[tuple[Transition, ...], list[dict[str, Any]]],
    out: Reconciled,
    rows: list[Reporter] | None,
) -> EventRecord | None:
    """Approve the event; `deferred`: the announcements published and left pending, and
    the audit rows that go with marking them done, both in the outcome's write."""
    store, settings = pipeline.store, pipeline.settings
    defer, audited = deferred
    if rows is None or not (holds_approval(record, me) and record.approval == "in_progress"):
        # Its claim lapsed in a long drain (or the row ended): the next reconcile claims
        # it again if it is still due; nothing is asked without this holder's claim.
        result = ApprovalResult(
            event_id=record.event_id, outcome="skipped", detail="its approval claim lapsed"
        )
    else:
        result = approve_claimed(
            pipeline,
            record,
            rows,
            by=by,
            give_up_at=now + timedelta(seconds=settings.approval_budget_seconds),
            settle=defer,
            settle_rows=audited,
        )
    if result.outcome == "skipped" and defer:
        mark_done(store, record.event_id, defer, with_rows=audited)
    if result.outcome in ("failed", "retry_later") and plan.capacity:
        # Nothing approved it (yet): its slots go back now, not when a lapse runs out,
        # unless its outcome is unknown (a relay's answer that never came).
        woken = capacity.release_slots(pipeline, record, now, after_attempt=True)
        enqueue(pipeline, woken, now)
    out.approval = result
    return store.recent_event(record.event_id)


# ------------------------------------------------------------------ when next due


def _schedule(
    pipeline: Pipeline, record: EventRecord, at: datetime | None, now: datetime
) -> datetime | None:
    """Tell the open index when the event is next due, only when that changed in a way
    that matters: sooner than the index says, or the index says "now" and it is not (what
    this Store last wrote there; unknown: written). An index that says "sooner than
    needed" is left: the sweep finds it, and its reconcile puts it right."""
    if record.ended:
        return at
    known, current = pipeline.store.due_written(record.event_id)
    if known:
        if at is None:
            stale = current is not None and current <= now
        elif current is None:
            stale = True
        else:
            stale = at < current or current <= now
        if not stale:
            return at
    pipeline.store.set_due(record.event_id, at)
    return at


# ------------------------------------------------------------------ by key


def reconcile_key(
    pipeline: Pipeline,
    event_id: str,
    me: str = "",
    *,
    row: EventRecord | None = None,
    worker: bool = True,
) -> Reconciled:
    """Reconcile one event by its key: its rows read afresh (its row, its reporter rows,
    and the VM rows of its reporters when their silence can end it), what is due decided,
    and done. The only place that claims and acts. `me`: the holder of its claims (the
    work item, the message, the person's request), so a redelivery takes over its own
    claims at once. `row`: the event row as the caller just wrote it (saves a read; its
    ETag guards every write, so a stale copy costs a re-read, never a wrong write).
    `worker`: a unit of work of its own (not a document's processing): it may run the
    drain workflow."""
    store, now = pipeline.store, pipeline.clock.now()
    rows: list[Reporter] | None = None
    record: EventRecord | None
    if row is not None:
        record = row
    else:
        # The event row and its reporter rows in one partition query (issue 47).
        record, rows = store.event_and_reporters(event_id)
    if record is None:
        listed = store.listed_at(event_id)
        if listed is None or now - listed > UNLISTED_AFTER:
            store.drop_open(event_id)  # its first write never happened
        else:
            store.set_due(event_id, listed + UNLISTED_AFTER)
        return Reconciled(event_id)
    facts, rows = load_facts(pipeline, record, now, rows)
    return _reconcile_row(pipeline, record, me, facts, worker, rows)


class InlineQueue:
    """The work queue of a pipeline that has none (the single-threaded tests): each key
    reconciled here, in turn, at once; `results` keeps what each did (or the row it could
    not read), for the sweep's report."""

    def __init__(self, pipeline: Pipeline) -> None:
        self.pipeline = pipeline
        self.results: list[Any] = []

    def enqueue(self, keys: list[str], now: datetime, *, sweep: bool = False) -> int:
        for key in keys:
            try:
                # Each its own holder: two sweeps reconciling the same key here at once
                # are two units of work, never one (only a redelivery is the same one).
                me = f"inline:{uuid.uuid4().hex}"
                self.results.append(reconcile_key(self.pipeline, key, me=me))
            except BadRow as exc:
                log.warning("reconcile of %.200r: skipped %s", key, exc)
                self.results.append(exc)
            except Exception as exc:
                log.exception("reconcile of %.200r failed; the next sweep finds it again", key)
                partial = getattr(exc, "reconciled", None)  # what it did before it failed
                if partial is not None:
                    self.results.append(partial)
        return len(keys)


def work_queue(pipeline: Pipeline) -> Any:
    """Where due keys go: the pipeline's work queue, or an InlineQueue."""
    return pipeline.work_queue if pipeline.work_queue is not None else InlineQueue(pipeline)


def enqueue(pipeline: Pipeline, keys: list[str], now: datetime) -> None:
    """Hand `keys` to the work queue (woken waiters, a leaver's event)."""
    keys = list(dict.fromkeys(keys))
    if keys:
        work_queue(pipeline).enqueue(keys, now)
