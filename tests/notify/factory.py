"""Notifications as ingest would publish them, for the channel and terminate tests."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from functions.model.event import Decision, EventSnapshot, Links, Notification, Transition

NOW = datetime(2026, 11, 21, 10, 0, 0, tzinfo=UTC)
LINKS = Links(
    status_url="https://bridge.example/api/status",
    approve_url="https://bridge.example/api/approve?event=E",
)


def event(event_id: str = "EV-1", **fields: Any) -> EventSnapshot:
    values: dict[str, Any] = {
        "event_id": event_id,
        "event_type": "Reboot",
        "event_status": "Scheduled",
        "event_source": "Platform",
        "resources": ("web_0", "web_1"),
        "not_before": NOW + timedelta(minutes=12),
        "description": "Virtual machine is going to be restarted as requested by authorized user.",
        "duration_in_seconds": -1,
        "scale_sets": ("web",),
        "reported_by": ("web_0", "web_1"),
        "first_seen": NOW,
    }
    values.update(fields)
    return EventSnapshot(**values)


def decision(**fields: Any) -> Decision:
    values: dict[str, Any] = {
        "action": "hold",
        "rule": "reboot-window",
        "reason": "outside the maintenance window",
        "severity": "warning",
        "page": True,
    }
    values.update(fields)
    return Decision(**values)


def note(
    transition: Transition,
    snapshot: EventSnapshot | None = None,
    choice: Decision | None = None,
    **fields: Any,
) -> Notification:
    values: dict[str, Any] = {
        "transition": transition,
        "occurred_at": NOW,
        "event": snapshot,
        "decision": choice,
        "links": LINKS,
    }
    values.update(fields)
    return Notification(**values)
