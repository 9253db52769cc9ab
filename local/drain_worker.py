"""The demo's `terminate` subscription: the drain workflow on a worker thread of its own.

In Azure it is its own function, so a drain that takes seconds never holds up ingest; the
worker thread keeps that true here.
"""

from __future__ import annotations

import queue
import threading
from datetime import datetime
from typing import TYPE_CHECKING, Any

import requests

if TYPE_CHECKING:
    from local.orchestration import Demo


def start_drain_worker(demo: Demo) -> None:
    """The `terminate` subscription: drain, then approve, on its own worker.

    In Azure it is its own function, so a drain that takes seconds never holds up
    ingest; the worker thread keeps that true here.
    """
    from functions.clock import SystemClock
    from functions.pipeline.approve import approve_event
    from functions.pipeline.context import Pipeline
    from functions.store.drains import DrainStore
    from functions.terminate.workflow import DrainContext, DrainSettings, run_drain, wants

    scale = demo.options.time_scale
    demo.drain_settings = DrainSettings(
        http_url=demo.receivers["drain"].url,
        relay_hook="drain",
        # The real-world defaults, scaled like the simulator's clock.
        step_timeout_seconds=max(1.0, 120 / scale),
        safety_margin_seconds=30 / scale,
        approve_reserve_seconds=max(0.5, 10 / scale),
        poll_seconds=0.1,
    )
    drains = DrainStore.from_connection_string(
        demo.connection_string, demo.settings.state_table_prefix
    ).ensure_table()
    session = requests.Session()
    demo.stack.callback(session.close)
    clock = SystemClock()

    pipeline = Pipeline(
        demo.store,
        demo.settings,
        demo.publisher,
        session,
        clock,
        demo.credential,
        admission=demo.admission,
    )

    def relay_target(vm: str) -> Any:
        """Where and with which key to call the VM's relay: Azure's address for its
        vmId, the key its relay sent in an attested message (None: not known yet)."""
        record = demo.store.get_vm(vm)
        return pipeline.relay_target(record) if record else None

    def approve(event_id: str, until: datetime) -> Any:
        return approve_event(event_id, pipeline, give_up_at=until, by="drain")

    ctx = DrainContext(
        store=drains,
        session=session,
        publish=demo.publisher.publish,
        approve=approve,
        relay_target=relay_target,
    )
    work: queue.SimpleQueue[Any] = queue.SimpleQueue()

    def worker() -> None:
        while True:
            note = work.get()
            if note is None:
                return
            try:
                result = run_drain(note, demo.drain_settings, ctx)
            except Exception as exc:
                demo.timeline.add("drain", "terminate", f"workflow failed: {exc}", ok=False)
                continue
            demo.drain_results.append(result)

    thread = threading.Thread(target=worker, name="terminate-workflow", daemon=True)
    thread.start()

    def stop() -> None:
        work.put(None)
        thread.join(timeout=10)

    demo.stack.callback(stop)
    demo.publisher.subscribe("terminate", lambda note: work.put(note) if wants(note) else None)
