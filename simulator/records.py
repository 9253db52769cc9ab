"""What the simulator keeps per VM and per event, and how an event is written on the wire."""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel, ConfigDict

from functions.model.envelope import PREEMPT, SCHEDULED, TERMINATE, format_not_before
from simulator.faults import Enablement

# The version that introduced each optional field or event type (SPEC.md "The endpoint").
FIELD_SINCE = {
    "Description": "2019-04-01",
    "EventSource": "2019-08-01",
    "DurationInSeconds": "2020-07-01",
}
TYPE_SINCE = {PREEMPT: "2017-11-01", TERMINATE: "2019-01-01"}


class Approval(BaseModel):
    """One StartRequest as IMDS received it. `counted` is False when the approving VM is not in
    the event's Resources (it can see the event through its set but cannot speak for it)."""

    model_config = ConfigDict(frozen=True)

    vm: str
    event_id: str
    at: datetime
    counted: bool = True


@dataclass
class Vm:
    name: str
    availability_set: str | None = None
    scale_set: str | None = None
    spot: bool = False
    # Where Azure places it (Resource Graph's `zones` and `tags`): what budgets group by.
    zone: str | None = None
    tags: dict[str, str] = field(default_factory=dict)
    incarnation: int = 1
    events: list[dict[str, Any]] = field(default_factory=list)  # newest-version rendering
    history: list[dict[str, Any]] = field(default_factory=list)
    enablement: Enablement = field(default_factory=Enablement)
    requests: Counter[str] = field(default_factory=Counter)
    recent_requests: deque[float] = field(default_factory=deque)  # for the rate limit

    @property
    def group(self) -> tuple[str, str] | None:
        if self.availability_set:
            return ("availability-set", self.availability_set.casefold())
        if self.scale_set:
            return ("scale-set", self.scale_set.casefold())
        return None


@dataclass
class Event:
    event_id: str
    event_type: str
    resources: list[str]
    source: str
    duration: int
    description: str
    resource_type: str
    created_at: float
    not_before: float | None
    impact: float  # scaled seconds from Started to removal
    cancel_at: float | None
    status: str
    scenario: str | None = None
    started_at: float | None = None
    ended_at: float | None = None
    end_reason: str | None = None  # completed | cancelled | removed
    approved_by: list[str] = field(default_factory=list)
    follow: list[str] = field(default_factory=list)  # rolling: VMs still to get this scenario

    @property
    def active(self) -> bool:
        return self.ended_at is None

    def render(self, api_version: str) -> dict[str, Any] | None:
        """The event as IMDS of that version would write it, or None if it did not know it."""
        since = TYPE_SINCE.get(self.event_type)
        if since and api_version < since:
            return None
        wire: dict[str, Any] = {
            "EventId": self.event_id,
            "EventStatus": self.status,
            "EventType": self.event_type,
            "ResourceType": self.resource_type,
            "Resources": list(self.resources),
            "NotBefore": (
                format_not_before(datetime.fromtimestamp(self.not_before, UTC))
                if self.status == SCHEDULED and self.not_before is not None
                else ""
            ),
            "Description": self.description,
            "EventSource": self.source,
            "DurationInSeconds": self.duration,
        }
        for name, version in FIELD_SINCE.items():
            if api_version < version:
                del wire[name]
        return wire
