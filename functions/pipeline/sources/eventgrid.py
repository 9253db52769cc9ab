"""Scheduled Events as Event Grid delivers them: parse one Service Bus message body.

Azure publishes `ScheduledEventEmitted` on the `Microsoft.ResourceNotifications.
MaintenanceResources` system topic for VMs, scale sets and availability sets that opted in
(preview). Event Grid delivers them to Service Bus one event per message, in the Event Grid
schema or as CloudEvents 1.0, depending on the subscription; an array is accepted as well
(what an HTTP sink or a replay tool would hand over). `data.resourceInfo.properties` holds
the IMDS fields, so each event becomes the same `ScheduledEvent` a relay's document gives,
plus the ARM id of the resource that owns it (the acknowledge API's path) and Event Grid's
own `id` (the duplicate-detection key: Event Grid delivers at least once).

Pure parsing, no I/O: ingest (functions.pipeline.sources.eventgrid_ingest) applies the
result, and `python -m functions policy explain` decides on it.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from functions.model.arm import ArmError, ArmResource, parse_event_id
from functions.model.envelope import DocumentError, ScheduledEvent

EVENT_TYPE = "Microsoft.ResourceNotifications.MaintenanceResources.ScheduledEventEmitted"
TOPIC_TYPE = "Microsoft.ResourceNotifications.MaintenanceResources"
COMPLETED, CANCELED = "Completed", "Canceled"
STATUSES = ("Scheduled", "Started", COMPLETED, CANCELED)  # in lifecycle order

# The IMDS field names, by their case-folded spelling: the properties are IMDS's, but a
# consumer must not break if a producer camel-cases them.
_IMDS_NAMES = {
    name.casefold(): name
    for name in (
        "EventId",
        "EventStatus",
        "EventType",
        "ResourceType",
        "Resources",
        "NotBefore",
        "Description",
        "EventSource",
        "DurationInSeconds",
    )
}


class GridEvent(BaseModel):
    """One Event Grid notification about one Scheduled Event."""

    model_config = ConfigDict(frozen=True)

    grid_id: str  # Event Grid's id of this notification (not the EventId)
    schema_name: str  # "EventGridSchema" | "CloudEvents"
    time: datetime | None
    owner: ArmResource  # the VM, scale set or availability set the event belongs to
    event: ScheduledEvent

    @property
    def status(self) -> str:
        return self.event.event_status

    @property
    def ends(self) -> bool:
        return self.status in (COMPLETED, CANCELED)


class Rejected(BaseModel):
    """One element of a message that is not a usable notification, and why."""

    reason: str
    raw: Any = None


def parse_message(
    body: bytes | str | list[Any] | dict[str, Any],
) -> tuple[list[GridEvent], list[Rejected]]:
    """All notifications of one message, and the elements rejected (each with a reason).

    Raises DocumentError only when nothing in the message can be used at all (not JSON,
    not an object or array, an empty array)."""
    data: Any = body
    if isinstance(body, bytes | str):
        try:
            data = json.loads(body)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise DocumentError(f"not JSON: {exc}") from None
    items = data if isinstance(data, list) else [data]
    if not items:
        raise DocumentError("an empty Event Grid array")
    if not all(isinstance(item, dict) for item in items):
        raise DocumentError("not Event Grid events: every element must be a JSON object")
    events: list[GridEvent] = []
    rejected: list[Rejected] = []
    for item in items:
        try:
            events.append(parse_event(item))
        except DocumentError as exc:
            rejected.append(Rejected(reason=str(exc), raw=item))
    return events, rejected


def parse_event(item: dict[str, Any]) -> GridEvent:
    """One event in the Event Grid schema or CloudEvents 1.0; DocumentError says what is wrong."""
    if "specversion" in item:
        if str(item.get("specversion")) != "1.0":
            raise DocumentError(f"CloudEvents specversion {item.get('specversion')!r} is not 1.0")
        schema, kind, when = "CloudEvents", item.get("type"), item.get("time")
    else:
        schema, kind, when = "EventGridSchema", item.get("eventType"), item.get("eventTime")
    grid_id = item.get("id")
    if not isinstance(grid_id, str) or not grid_id.strip():
        raise DocumentError(f"{schema} event without an id")
    if kind != EVENT_TYPE:
        raise DocumentError(f"event {grid_id}: type {kind!r} is not {EVENT_TYPE}")
    data = item.get("data")
    info = data.get("resourceInfo") if isinstance(data, dict) else None
    if not isinstance(info, dict):
        raise DocumentError(f"event {grid_id}: data.resourceInfo is missing")
    props = info.get("properties")
    if not isinstance(props, dict):
        raise DocumentError(f"event {grid_id}: data.resourceInfo.properties is missing")
    arm_id = item.get("subject") or info.get("id")
    try:
        owner, event_id = parse_event_id(arm_id)
    except ArmError as exc:
        raise DocumentError(f"event {grid_id}: subject: {exc}") from None
    if info.get("id") and str(info["id"]).casefold() != str(arm_id).casefold():
        raise DocumentError(
            f"event {grid_id}: subject {arm_id!r} and resourceInfo.id {info['id']!r} differ"
        )
    fields = {_IMDS_NAMES.get(k.casefold(), k): v for k, v in props.items()}
    fields.setdefault("EventId", event_id)
    if str(fields["EventId"]).casefold() != event_id.casefold():
        raise DocumentError(
            f"event {grid_id}: EventId {fields['EventId']!r} is not the one in its ARM id "
            f"({event_id})"
        )
    status = fields.get("EventStatus")
    canonical = next(
        (s for s in STATUSES if isinstance(status, str) and s.casefold() == status.casefold()), None
    )
    if canonical is None:
        raise DocumentError(
            f"event {grid_id}: EventStatus {status!r} is not one of {', '.join(STATUSES)}"
        )
    fields["EventStatus"] = canonical
    try:
        event = ScheduledEvent.model_validate(fields)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'event'}: {e['msg']}"
            for e in exc.errors(include_url=False)
        )
        raise DocumentError(f"event {grid_id}: properties: {problems}") from None
    return GridEvent(
        grid_id=grid_id.strip(),
        schema_name=schema,
        time=_time(when),
        owner=owner,
        event=event,
    )


def _time(value: Any) -> datetime | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)
