"""The two queues a message can arrive on, for tests that mix relays and Event Grid.

In Azure an Event Grid notification arrives on EVENTGRID_QUEUE (only the system topic can
send there) and a relay's envelope on the documents queue; the app refuses an Event Grid
body on the documents queue (tests/security). Tests that feed both kinds in one list
deliver each where Azure would.
"""

from __future__ import annotations

from functions.model.envelope import looks_like_event_grid
from functions.pipeline.context import Pipeline
from functions.pipeline.ingest import ingest_message
from functions.pipeline.results import IngestResult
from functions.pipeline.sources.eventgrid_ingest import ingest_event_grid


def deliver(body: bytes | str, pipeline: Pipeline, message_id: str = "") -> IngestResult:
    if looks_like_event_grid(body):
        return ingest_event_grid(body, pipeline, message_id)
    return ingest_message(body, pipeline, message_id)
