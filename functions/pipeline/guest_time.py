"""A relay's `observed_at` in Azure's time: bounded by when Service Bus enqueued it.

A relay dates each document by its VM's clock. A guest clock 400 s fast (time sync off, a
bad NTP source: issue 46, finding 7a) made every document of that VM "from the future"
against the app's clock, and the VM was off the bridge until its clock came back. The
message itself carries a time no VM sets: Service Bus stamps `EnqueuedTimeUtc` when it
stores the message, and a relay observes a document before it sends it. So the VM's
time is taken as `min(observed_at, enqueued)`:
- a VM whose clock is right (or behind) keeps its own time, as before;
- a VM whose clock is ahead gets Azure's, and its time never runs ahead of Azure's, so it
  cannot make its own later documents look stale (functions.pipeline.decide.is_stale);
- the same message always gets the same time: Service Bus keeps `EnqueuedTimeUtc` on a
  redelivery, and a copy scheduled for later (functions.triggers.later) carries the
  original's (ENQUEUED_PROPERTY), so a redelivered older document stays stale after a newer
  one (the app's clock at processing time would not: a redelivery is processed later);
- it is this VM's own time only: each message is judged by its own enqueue time, and no
  VM's clock moves the app's or another VM's.
A document dated more than MAX_AHEAD after Service Bus enqueued it is refused, saying so:
that is not drift but a clock set wrong (a local time taken for UTC), for its operator to
fix; like every clock refusal it is not acknowledged, and the relay sends it again.
Without an enqueue time (a caller that has none) the app's clock is the bound, as before.
The other time a VM claims, an event's NotBefore, is bounded here too (`out_of_bounds`).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from functions.model.envelope import Envelope

# A relay's clock may run a little ahead of the app's (checked where no enqueue time is
# known, and of the time taken: an app clock far behind Azure's refuses too).
MAX_FUTURE = timedelta(minutes=5)
# How far ahead of its enqueue time a document may be dated and still be taken.
MAX_AHEAD = timedelta(hours=1)
# A copy scheduled for later carries its original's enqueue time (ISO 8601) under this.
ENQUEUED_PROPERTY = "bridge_enqueued"


def utc(value: datetime | None) -> datetime | None:
    """`value` as an aware UTC time; a naive one is UTC (azure.functions parses some
    trigger metadata to naive times)."""
    if value is None:
        return None
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def enqueued_of(properties: Mapping[Any, Any] | None, enqueued: datetime | None) -> datetime | None:
    """When Service Bus first enqueued this message: its own `EnqueuedTimeUtc`, or the
    original's for a copy scheduled later. Never later than its own: a relay can set
    application properties too, and may only date its own messages earlier by them."""
    own = utc(enqueued)
    value = (properties or {}).get(ENQUEUED_PROPERTY)
    if isinstance(value, bytes):
        value = value.decode("ascii", "replace")
    try:
        original = utc(datetime.fromisoformat(value)) if isinstance(value, str) else None
    except ValueError:
        original = None
    if original is None or own is None:
        return own or original
    return min(own, original)


def vm_time(observed_at: datetime, enqueued: datetime | None) -> datetime:
    """The time ingest keeps for a document: its relay's, never after Azure enqueued it."""
    return observed_at if enqueued is None else min(observed_at, enqueued)


def too_far_ahead(observed_at: datetime, enqueued: datetime | None, now: datetime) -> str:
    """Why a document's date is refused, or "" when it is taken."""
    if enqueued is not None and observed_at > enqueued + MAX_AHEAD:
        return (
            f"observed_at {observed_at.isoformat()} is more than "
            f"{int(MAX_AHEAD.total_seconds() // 60)} min after Service Bus enqueued it "
            f"({enqueued.isoformat()}): the VM's clock is wrong (a local time taken for UTC?)"
        )
    if vm_time(observed_at, enqueued) > now + MAX_FUTURE:
        return (
            f"observed_at {observed_at.isoformat()} is more than "
            f"{int(MAX_FUTURE.total_seconds() // 60)} min ahead of the app's clock"
        )
    return ""


def out_of_bounds(
    envelope: Envelope, now: datetime, not_before_days: int, enqueued: datetime | None = None
) -> str:
    """Why a message's times are beyond what one VM may claim, or "" when they are within
    bounds. A time from the future would make the VM's later genuine documents look stale
    (functions.pipeline.decide.is_stale); a NotBefore too far out would hold capacity."""
    ahead = too_far_ahead(envelope.observed_at, enqueued, now)
    if ahead:
        return ahead
    document = envelope.scheduled_events
    horizon = now + timedelta(days=not_before_days)
    for event in document.events if document else ():
        if event.not_before is not None and event.not_before > horizon:
            return (
                f"event {event.event_id[:128]}: NotBefore {event.not_before.isoformat()} is "
                f"more than {not_before_days} days ahead (MAX_NOT_BEFORE_DAYS): no Azure "
                "maintenance is announced that far ahead, and it would hold capacity"
            )
    return ""
