"""Azure handler for agentless mode: Event Grid notifications from their own queue.

Event Grid delivers `ScheduledEventEmitted` to the `%EVENTGRID_QUEUE%` queue (no sessions:
Event Grid sets no SessionId, and notifications have no per-VM order to keep). The
Event Grid source (`ingest_event_grid`) handles them, with the documents queue's contract:
returning completes the message, raising abandons it for redelivery (then the DLQ).
"""

from __future__ import annotations

import logging

import azure.functions as func

from functions.pipeline.sources.eventgrid_ingest import ingest_event_grid as ingest_grid
from functions.triggers.core import later_instead, pipeline

log = logging.getLogger(__name__)

bp = func.Blueprint()


@bp.function_name("ingest_event_grid")
@bp.service_bus_queue_trigger(
    arg_name="msg", queue_name="%EVENTGRID_QUEUE%", connection="ServiceBusConnection"
)
def ingest_event_grid(msg: func.ServiceBusMessage) -> None:
    current = pipeline()
    try:
        result = ingest_grid(msg.get_body(), current, message_id=msg.message_id or "")
    except Exception as exc:
        # An outage: tried again later, not ten times in seconds (functions.triggers.later).
        if not later_instead(msg, exc, current, current.settings.eventgrid_queue):
            raise
        return
    log.info(
        "event grid %s: %s %s",
        msg.message_id,
        result.outcome,
        " ".join(f"{e}:{t}" for e, t in result.transitions),
    )
