"""Apply Event Grid notifications to the event rows, through the same stages as a document.

An event reported by relays and by Event Grid is one event: the row is keyed by EventId
whatever the source, so the `scheduled`/`decided`/`approved` claims in that row make it
announced, decided and approved once. What differs from a relay's document:

- the end is explicit (`Completed`, `Canceled`) instead of implied by absence, and it ends
  the event at once (Azure itself says so), whoever else still reports it;
- Event Grid is no VM: it is not a reporter (it never goes silent, and a relay's later
  document without the event may still end it), but the row learns the ARM id of the
  event's owner, which is what the ARM approver needs;
- delivery is at least once and in any order: a notification whose Event Grid `id` was
  seen is dropped by one conditional insert (a Table request, no read), and the lifecycle
  only moves forward (Scheduled < Started < ended), so a late `Scheduled` after
  `Completed` changes nothing.
"""

from __future__ import annotations

import contextlib
import json
import logging
from datetime import datetime, timedelta

from azure.core.exceptions import ResourceNotFoundError

from functions.model.envelope import STARTED
from functions.model.event import Transition
from functions.pipeline.announce import publish_claimed
from functions.pipeline.capacity import holds_capacity, release_capacity
from functions.pipeline.context import Pipeline
from functions.pipeline.lifecycle import _add, _claim, intend_approval, own_claim
from functions.pipeline.reconcile import reconcile
from functions.pipeline.results import IngestResult
from functions.pipeline.sources.eventgrid import COMPLETED, GridEvent, parse_message
from functions.pipeline.transitions import decide_once
from functions.store import claims
from functions.store.records import EventRecord
from functions.store.state import Store

log = logging.getLogger(__name__)

SEEN_PREFIX = "eventgrid:"


def ingest_event_grid(body: bytes | str, pipeline: Pipeline, message_id: str = "") -> IngestResult:
    """One message from Event Grid (one event or an array). Same contract as ingest_message:
    returns when done (bad elements rejected and recorded), raises on transient trouble."""
    store, now = pipeline.store, pipeline.clock.now()
    try:
        events, rejected = parse_message(body)
    except Exception as exc:  # DocumentError, or anything a hostile body provokes
        reason = f"not an Event Grid message: {exc}"
        log.warning("rejected message %s: %s", message_id or "?", reason)
        store.reject(at=now, reason=reason, body=body, message_id=message_id)
        return IngestResult(outcome="rejected", reason=reason)
    for bad in rejected:
        log.warning("rejected Event Grid event in %s: %s", message_id or "?", bad.reason)
        store.reject(at=now, reason=bad.reason, body=_text(bad.raw, body), message_id=message_id)
    if not events:
        return IngestResult(outcome="rejected", reason="; ".join(r.reason for r in rejected))
    result = IngestResult(outcome="processed", reason="; ".join(r.reason for r in rejected))
    fresh = 0
    for grid in events:
        # The same notification again (Event Grid delivers at least once, and Service Bus
        # redelivers a message whose host died): applied again, which changes nothing it
        # changed before (ended stays ended, statuses only move on) and writes what a
        # host that died after the marker never wrote; its event is reconciled from the
        # row (level-triggered).
        if not store.claim_once(SEEN_PREFIX + grid.grid_id, now):
            apply_grid_event(grid, pipeline, result)  # idempotent; reconciles what is due
            continue
        fresh += 1
        try:
            apply_grid_event(grid, pipeline, result)
        except Exception:
            _forget(store, grid.grid_id)  # let the redelivery do it again
            raise
    if fresh == 0:
        result.outcome = "stale"
        result.reason = result.reason or "Event Grid notification(s) already processed"
    return result


def _text(raw: object, body: bytes | str) -> str:
    """The rejected element alone (not the whole array), as JSON."""
    try:
        return json.dumps(raw)
    except (TypeError, ValueError):
        return body.decode("utf-8", "replace") if isinstance(body, bytes) else body


def _forget(store: Store, grid_id: str) -> None:
    with contextlib.suppress(ResourceNotFoundError):
        store.forget_once(SEEN_PREFIX + grid_id)


def report_grid(
    record: EventRecord | None, grid: GridEvent, now: datetime
) -> tuple[EventRecord | None, list[Transition]]:
    """The pure step, like lifecycle.report: the new row (None: unchanged) and the
    transitions this write claims."""
    claimed: list[Transition] = []
    event = grid.event
    if record is None:
        record = EventRecord(
            event_id=event.event_id,
            event_type=event.event_type,
            event_status=STARTED if event.event_status == STARTED else "Scheduled",
            event_source=event.event_source,
            resource_type=event.resource_type,
            resources=list(event.resources),
            not_before=event.not_before,
            description=event.description,
            duration_in_seconds=event.duration_in_seconds,
            first_seen=now,
        )
        before = ""
    else:
        before = record.model_dump_json()
    if record.ended:
        return None, claimed  # ended stays ended: a late or reordered notification
    if not record.arm_resource:
        record.arm_resource = grid.owner.id
    for name in event.resources:
        _add(record.resources, name)
    if grid.owner.resource_type == "virtualMachineScaleSets":
        _add(record.scale_sets, grid.owner.name)
    elif grid.owner.resource_type == "availabilitySets":
        _add(record.availability_sets, grid.owner.name)
    if event.not_before is not None and not record.started:
        record.not_before = event.not_before
    if event.description and not record.description:
        record.description = event.description
    if event.duration_in_seconds is not None:
        record.duration_in_seconds = event.duration_in_seconds
    if grid.ends:
        record.ended = "completed" if grid.status == COMPLETED else "cancelled"
        record.ended_at = now
        record.ended_by = "azure"
        _claim(
            record,
            Transition.COMPLETED if grid.status == COMPLETED else Transition.CANCELLED,
            now,
            claimed,
        )
    else:
        if event.event_status == STARTED and not record.started:
            record.started = True
            record.event_status = STARTED
        _claim(record, Transition.STARTED if record.started else Transition.SCHEDULED, now, claimed)
    if claimed or record.model_dump_json() != before:
        return record, claimed
    return None, claimed


def apply_grid_event(grid: GridEvent, pipeline: Pipeline, result: IngestResult) -> None:
    """Write one notification to its event row (the decision and its intent in the same
    write, as ingest does for a document), then reconcile it: announce, approve."""
    store, now, event = pipeline.store, pipeline.clock.now(), grid.event
    mine: list[str] = []
    claimed: list[Transition] = []
    learnt_owner: list[bool] = []
    dry = pipeline.policy is not None and pipeline.policy.dry_run
    tag = f"grid:{grid.grid_id}"[:300]

    def change(rec: EventRecord | None) -> EventRecord | None:
        mine.clear()
        learnt_owner[:] = [rec is not None and not rec.arm_resource]
        updated, transitions = report_grid(rec, grid, now)
        claimed[:] = transitions
        target = updated if updated is not None else rec
        if target is None or target.ended:
            return updated
        decided, announce = decide_once(target, event, pipeline, now)
        if decided:
            mine.append(intend_approval(target, dry, now))
            if mine[-1]:
                target.approval_claimed_by = tag
        elif own_claim(target, tag):
            # This notification took the claim on a delivery whose host died: its own.
            mine.append(target.approval_claim)
        if announce is not None:
            claimed.append(announce)
        if announce is not None or decided:
            return target
        return updated

    if store.recent_event(event.event_id) is None:
        store.open_event(event.event_id, now)  # the watchdog's index (functions.store)
    record, won = store.mutate_event(event.event_id, change)
    if record is None:
        return
    own = own_claim(record, tag)
    pending = any(claims.is_pending(m) for m in record.announced.values())
    if not won and not own and not pending and not (learnt_owner and learnt_owner[0]):
        return
    if won and record.ended and holds_capacity(record):
        release_capacity(store, record)
    # A relay-reported event whose owner is known now (the ARM approver can do what no
    # relay could) is due another try, which reconcile sees in the row.
    mine_now = record.approval_claim if own else (mine[0] if mine and won else "")
    done = reconcile(pipeline, record, mine=mine_now, claimed=claimed if won else ())
    result.transitions.extend((record.event_id, t.value) for t in done.published)
    if done.approval is not None:
        result.approvals.append(done.approval)  # type: ignore[arg-type]


def end_unheard(record: EventRecord, pipeline: Pipeline, now: datetime) -> bool:
    """The watchdog's step for events only Event Grid reported: no relay's silence can end
    them, so if their `Completed`/`Canceled` never arrives (dead-lettered, a subscription
    deleted) they would stay open and keep a capacity slot forever. Past
    EVENTGRID_END_AFTER_SECONDS beyond NotBefore (or first sight, for one that came
    Started), the event is ended: completed, announced with why. True if this call ended it."""
    if record.ended or record.past_reporters or not record.arm_resource:
        return False
    since = record.not_before or record.first_seen
    limit = timedelta(seconds=pipeline.settings.eventgrid_end_after_seconds)
    if now - since < limit:
        return False
    claimed: list[Transition] = []

    def change(rec: EventRecord | None) -> EventRecord | None:
        claimed.clear()
        if rec is None or rec.ended or rec.past_reporters:
            return None
        rec.ended = (
            "completed"
            if rec.started or rec.approval == "approved" or rec.not_before
            else "cancelled"
        )
        rec.ended_at = now
        rec.ended_by = "azure"
        _claim(
            rec,
            Transition.COMPLETED if rec.ended == "completed" else Transition.CANCELLED,
            now,
            claimed,
        )
        return rec

    updated, won = pipeline.store.mutate_event(record.event_id, change, known=record)
    if not won or updated is None or not claimed:
        return False
    if holds_capacity(updated):
        release_capacity(pipeline.store, updated)
    detail = f"no Event Grid notification of its end within {int(limit.total_seconds())} s"
    publish_claimed(pipeline, updated, claimed, now, dict.fromkeys(claimed, detail))
    return True
