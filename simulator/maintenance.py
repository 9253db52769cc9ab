"""Resource Graph's `maintenanceresources` for the simulated events: Azure's own view.

With `eventGridAndResourceGraph` opted in, Azure publishes each scheduled event to Resource
Graph as a `microsoft.maintenance/scheduledevents` row (SPEC.md, "Scheduled Events in
Azure Resource Graph"): `id` is the event's ARM id under its owner (the VM, scale set or
availability set, as Event Grid's subject names it), `name` the EventId, `properties` the
IMDS fields (EventStatus may also be Completed or Canceled). The function app's ARM
approver reads it (functions.approvers.arm.lookup) to acknowledge only events Azure
itself reports as decided, never on a relay's word.

The rows join simulator.arm's inventory (table `maintenanceresources`), so the query
limits, paging and quota of simulator.resource_graph apply to them too.
"""

from __future__ import annotations

from typing import Any

from functions.model.envelope import SCHEDULED_EVENTS_API_VERSION
from simulator import instance
from simulator.engine import Simulator
from simulator.eventgrid import arm_owner_id

TABLE = "maintenanceresources"
TYPE = "microsoft.maintenance/scheduledevents"


def scheduled_event_rows(sim: Simulator) -> list[dict[str, Any]]:
    """Every event the simulator holds (ended ones as Completed or Canceled), one row each."""
    rows = []
    with sim._lock:  # the engine's own lock: the events and their owners, read at once
        events = list(sim._events.values())
        for event in events:
            rendered = event.render(SCHEDULED_EVENTS_API_VERSION)
            if rendered is None:
                continue
            owner = arm_owner_id(*sim.owner_of(event))
            rows.append(
                {
                    "_table": TABLE,
                    "id": f"{owner}/providers/microsoft.maintenance/scheduledevents/"
                    f"{event.event_id}",
                    "name": event.event_id,
                    "type": TYPE,
                    "subscriptionId": instance.SUBSCRIPTION_ID,
                    "resourceGroup": instance.RESOURCE_GROUP.lower(),
                    "properties": {
                        **rendered,
                        "EventStatus": sim.grid_status(event),
                        "ScheduledEventApiVersion": SCHEDULED_EVENTS_API_VERSION,
                    },
                }
            )
    return rows
