"""The capacity guard: at most N approved impactful events at once per scale set and per
availability set, so a maintenance wave never takes a whole set down together.

Slots are rows in the events table's capacity partition, taken all-or-nothing under ETags;
a slot whose holder ended is freed by the next taker, so a crash never leaks one for good.

A slot also lapses at the NotBefore it was taken for, plus the event's duration and
CAPACITY_GRACE, whatever the event's reporters say afterwards (issue 27): a VM that keeps
listing a made-up event, moving its NotBefore, cannot hold the slot its set-mates wait for.
A real event is done by then (Azure starts it at NotBefore at the latest; the duration is
its impact), so a genuine holder is not cut short.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from functions.model.envelope import TERMINATE, ScheduledEvent
from functions.model.event import Decision
from functions.model.policy import Policy, is_impactful
from functions.store.records import CapacityRecord, EventRecord
from functions.store.state import Store

CAPACITY_GRACE = timedelta(minutes=30)  # beyond NotBefore + duration, before a slot lapses


def slot_until(record: EventRecord, now: datetime) -> datetime:
    """When the slot `record` takes now lapses: its NotBefore as of now (now if none or
    past), plus its duration when known, plus CAPACITY_GRACE."""
    start = max(record.not_before or now, now)
    duration = record.duration_in_seconds
    impact = timedelta(seconds=duration) if duration is not None and duration > 0 else timedelta()
    return start + impact + CAPACITY_GRACE


def needs_capacity(event: ScheduledEvent | EventRecord) -> bool:
    """Only impactful events count, and Terminate does not: a deletion is what the scale
    set's owner asked for, and holding it back would only delay it to NotBefore."""
    if event.event_type.casefold() == TERMINATE.casefold():
        return False
    if isinstance(event, EventRecord):
        probe = ScheduledEvent(
            EventId=event.event_id,
            EventStatus=event.event_status,
            EventType=event.event_type,
            DurationInSeconds=event.duration_in_seconds,
        )
        return is_impactful(probe)
    return is_impactful(event)


def capacity_limit(policy: Policy | None) -> int:
    return policy.max_concurrent_per_set if policy else 1


def capacity_keys(record: EventRecord) -> list[str]:
    return [f"ss:{s}" for s in record.scale_sets] + [f"as:{a}" for a in record.availability_sets]


def acquire_capacity(
    store: Store, record: EventRecord, policy: Policy | None, now: datetime
) -> bool:
    """Take a slot in each of the event's sets, or none at all."""
    limit = capacity_limit(policy)
    taken: list[str] = []
    until = slot_until(record, now)
    for key in capacity_keys(record):
        if _take(store, key, record.event_id, limit, now, until):
            taken.append(key)
        else:
            for done in taken:
                _give_back(store, done, record.event_id)
            return False
    return True


def _take(
    store: Store, key: str, event_id: str, limit: int, now: datetime, until: datetime
) -> bool:
    # Holders whose slot lapsed, or whose event ended (or vanished), free their slot;
    # checked before the write (a lapsed one costs no read).
    current = store.get_capacity(key)
    holders = current.holders if current else []
    lapsed = {h for h in holders if current and h in current.until and current.until[h] <= now}
    dead = lapsed | {h for h in holders if h not in lapsed and not _holds(store, h)}

    def change(rec: CapacityRecord | None) -> CapacityRecord | None:
        rec = rec or CapacityRecord(key=key)
        if event_id in rec.holders:
            return None
        kept = [h for h in rec.holders if h not in dead]
        if len(kept) >= limit:
            raise _Full
        rec.holders = [*kept, event_id]
        rec.until = {h: t for h, t in rec.until.items() if h in kept} | {event_id: until}
        return rec

    try:
        store.mutate_capacity(key, change)
    except _Full:
        return False
    return True


class _Full(Exception):
    pass


def _holds(store: Store, event_id: str) -> bool:
    record = store.get_event(event_id)
    return record is not None and not record.ended


def _give_back(store: Store, key: str, event_id: str) -> None:
    def change(rec: CapacityRecord | None) -> CapacityRecord | None:
        if rec is None or event_id not in rec.holders:
            return None
        rec.holders = [h for h in rec.holders if h != event_id]
        rec.until.pop(event_id, None)
        return rec

    store.mutate_capacity(key, change)


def holds_capacity(record: EventRecord) -> bool:
    """Whether the event may hold a slot: an `approve` decision takes one (in ingest or the
    watchdog), a `drain` one before its drain (functions.terminate.workflow), so ending a
    held event need not read the slots. A slot left behind anyway (a crash) is freed by
    `_take`, which drops ended holders."""
    return record.decision is not None and record.decision.action in ("approve", "drain")


def release_capacity(store: Store, record: EventRecord) -> None:
    for key in capacity_keys(record):
        _give_back(store, key, record.event_id)


def decision_for(record: EventRecord) -> Decision | None:
    return record.decision


def take_capacity(store: Store, event_id: str, policy: Policy | None, now: datetime) -> bool:
    """The drain workflow's guard: its event's slots taken (all or none), or not needed (a
    Terminate, an event that is not impactful, an event with no row)."""
    record = store.get_event(event_id)
    if record is None or not needs_capacity(record):
        return True
    return acquire_capacity(store, record, policy, now)
