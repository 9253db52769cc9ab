"""Event Grid notifications as Azure writes them, built by hand (independent of the simulator)."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from tests.functions.conftest import T0, event

SUB = "11111111-2222-3333-4444-555555555555"
EVENT_TYPE = "Microsoft.ResourceNotifications.MaintenanceResources.ScheduledEventEmitted"


def owner_id(kind: str = "virtualMachines", name: str = "vm1", rg: str = "rg1") -> str:
    return f"/subscriptions/{SUB}/resourceGroups/{rg}/providers/Microsoft.Compute/{kind}/{name}"


def grid_event(
    props: dict[str, Any],
    *,
    owner: str | None = None,
    grid_id: str | None = None,
    schema: str = "eventgrid",
    at: datetime = T0,
) -> dict[str, Any]:
    """One ScheduledEventEmitted notification; `props` are the IMDS fields (tests' `event()`)."""
    subject = (
        f"{owner or owner_id()}/providers/microsoft.maintenance/scheduledevents/{props['EventId']}"
    )
    data = {
        "resourceInfo": {
            "id": subject,
            "name": props["EventId"],
            "type": "microsoft.maintenance/scheduledEvents",
            "location": "westeurope",
            "properties": {**props, "ScheduledEventApiVersion": "2020-07-01"},
        },
        "operationalInfo": {"resourceEventTime": at.isoformat()},
        "apiVersion": "2020-07-01",
    }
    gid = grid_id or str(uuid.uuid4())
    if schema == "cloudevents":
        return {
            "specversion": "1.0",
            "id": gid,
            "source": f"/subscriptions/{SUB}",
            "subject": subject,
            "type": EVENT_TYPE,
            "time": at.isoformat(),
            "data": data,
        }
    return {
        "id": gid,
        "topic": f"/subscriptions/{SUB}",
        "subject": subject,
        "eventType": EVENT_TYPE,
        "eventTime": at.isoformat(),
        "data": data,
        "dataVersion": "3.0",
        "metadataVersion": "1",
    }


__all__ = ["SUB", "event", "grid_event", "owner_id"]
