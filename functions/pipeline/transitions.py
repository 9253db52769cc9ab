"""The decision's audit and what ends an event: shared by ingest, Event Grid and the
watchdog, which reach these points from different triggers and must act alike.
"""

from __future__ import annotations

from datetime import datetime

from functions.model.envelope import LedgerEntry, ScheduledEvent
from functions.model.event import Transition
from functions.model.policy import decide
from functions.pipeline.context import Pipeline
from functions.pipeline.lifecycle import end
from functions.pipeline.reconcile import reconcile
from functions.pipeline.redecide import redecide, should_redecide
from functions.store import claims
from functions.store.records import EventRecord
from functions.store.state import Store


def already_ended(store: Store, event_id: str) -> bool:
    """Whether the event is known to have ended, from the row as this Store last saw it,
    without a read: ending is final, so what was true then is true now."""
    seen = store.recent_event(event_id)
    return seen is not None and bool(seen.ended)


def end_event(
    event_id: str,
    vm: str,
    pipeline: Pipeline,
    now: datetime,
    detail: str = "",
    ledger: LedgerEntry | None = None,
) -> list[Transition]:
    """`vm` no longer reports the event (a later document without it, or silence): its
    reporter row says so (with `ledger`, its relay's measurements of the event, in the
    same write), and if no VM reports it any more the event ends. Returns the
    transitions this call claimed and announced (none if another caller did)."""
    store = pipeline.store
    # Own row first, then look for anyone else: of two last reporters leaving at once,
    # the later query sees both rows, so at least one of them ends the event.
    store.set_reporter(event_id, vm, "", now, ledger=ledger)
    if already_ended(store, event_id) and _still_ended(store, event_id):
        return []
    if store.anyone_reports(event_id):
        return []
    return finish_event(event_id, pipeline, now, detail)


def _still_ended(store: Store, event_id: str) -> bool:
    """An end remembered here may have been undone since (another VM's first report
    reopened it): one read says, and only for an event this worker saw end."""
    record = store.get_event(event_id)
    return record is None or bool(record.ended)


def finish_event(
    event_id: str, pipeline: Pipeline, now: datetime, detail: str = ""
) -> list[Transition]:
    """End the event (once: an ETag-guarded claim of `completed` / `cancelled`), free its
    capacity, announce, then move it from the open index to the ended-on-day index."""
    store = pipeline.store
    claimed: list[Transition] = []

    def change(rec: EventRecord | None) -> EventRecord | None:
        claimed.clear()
        if rec is None or rec.ended:
            return None
        end(rec, now, claimed)
        return rec

    record, won = store.mutate_event(event_id, change)
    if not won or record is None or not claimed:
        return []
    # Announce the end (and anything claimed before it and still pending, such as a
    # `started` whose host died), give back its capacity, then leave the open index:
    # reconcile does all three, in that order, so an end never hides what is still due.
    details = dict.fromkeys(claimed, detail) if detail else None
    reconcile(pipeline, record, claimed=claimed, details=details)
    return list(claimed)


def decide_once(
    target: EventRecord, event: ScheduledEvent, pipeline: Pipeline, now: datetime
) -> tuple[bool, Transition | None]:
    """Decide an event the first time any source reports it (or once more, after it failed
    closed on an invalid policy and this host's policy is valid), and claim the decision's
    announcement. Shared by relay documents and Event Grid so both sources decide and
    announce alike. The claim is taken again after a failed publish released it, so a
    redelivery announces what could not be announced before. Returns (decided now, the
    transition claimed or None)."""
    policy = pipeline.settings.policy
    decided = False
    if target.decision is None:
        target.decision = decide(policy, event, now, tuple(target.scale_sets))
        target.decided_at = now
        decided = True
    elif should_redecide(target, policy, now):
        redecide(target, event, policy, now)
        decided = True
    key = Transition.POLICY_INVALID if target.decision.policy_error else Transition.DECIDED
    return decided, key if claims.take(target.announced, key.value, now) else None
