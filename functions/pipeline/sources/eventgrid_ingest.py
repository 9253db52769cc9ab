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
from datetime import datetime

from azure.core.exceptions import ResourceNotFoundError

from functions.pipeline.context import Pipeline
from functions.pipeline.decide import decide_grid
from functions.pipeline.due import conditions
from functions.pipeline.lifecycle import Observation, Owner, observe, observed
from functions.pipeline.reconcile import reconcile_key
from functions.pipeline.results import IngestResult
from functions.pipeline.sources.eventgrid import COMPLETED, GridEvent, parse_message
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


def observation(grid: GridEvent, now: datetime) -> Observation:
    """The notification as an observation, the same shape a relay's document gives
    (functions.pipeline.lifecycle): seen when Event Grid says it happened, bounded by the
    app's clock."""
    seen_at = observed(grid.time, now) if grid.time is not None else now
    owner = Owner(grid.owner.id, grid.owner.resource_type, grid.owner.name)
    ends = ""
    if grid.ends:
        ends = "completed" if grid.status == COMPLETED else "cancelled"
    return Observation(grid.event, seen_at, owner=owner, ends=ends)


def apply_grid_event(grid: GridEvent, pipeline: Pipeline, result: IngestResult) -> None:
    """Write what one notification says to its event row (Azure's facts, and the decision
    the first time), then reconcile the event by its key: only that claims and acts."""
    store, now, event = pipeline.store, pipeline.clock.now(), grid.event
    tag = f"grid:{grid.grid_id}"[:300]
    seen = observation(grid, now)
    learnt_owner: list[bool] = []

    def change(rec: EventRecord | None) -> EventRecord | None:
        learnt_owner[:] = [rec is not None and not rec.arm_resource]
        updated = observe(rec, seen, now)
        target = updated if updated is not None else rec
        if target is None or target.ended:
            return updated
        if decide_grid(target, event, pipeline.settings.policy, now):
            return target
        return updated

    if store.recent_event(event.event_id) is None:
        store.open_event(event.event_id, now)  # the sweep's index (functions.store)
    record, won = store.mutate_event(event.event_id, change)
    if record is None:
        return
    pending = any(claims.is_pending(m) for m in record.announced.values())
    unannounced = any(t.value not in record.announced for t in conditions(record, now))
    if not won and not pending and not unannounced and not (learnt_owner and learnt_owner[0]):
        return
    # A relay-reported event whose owner is known now (the ARM approver can do what no
    # relay could) is due another try, which reconcile sees in the row.
    done = reconcile_key(pipeline, record.event_id, tag, row=record, worker=False)
    result.transitions.extend((record.event_id, t.value) for t in done.published)
    if done.approval is not None:
        result.approvals.append(done.approval)
