"""The demo's `terminate` subscription: the drain workflow on worker threads of its own.

Drains every event the policy drains (here: the scale-in Terminate, the app VM's reboot,
the Spot eviction) and undrains the VMs that come back, with the real-world times scaled
like the simulator's clock.
"""

from __future__ import annotations

import contextlib
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import requests

if TYPE_CHECKING:
    from local.demo_state import DemoState


def start_drain_worker(demo: DemoState) -> None:
    """The `terminate` subscription: drain, then approve; undrain when the VM is back.

    In Azure it is its own function, invoked once per message and many at once, so a drain
    that takes seconds never holds up ingest or another event's drain; a few worker
    threads keep that true here.
    """
    from datetime import UTC, datetime

    from functions.clock import SystemClock
    from functions.model.drains import RelayFacts
    from functions.model.envelope import PREEMPT
    from functions.pipeline.context import Pipeline
    from functions.store.drains import DrainStore
    from functions.terminate.wiring import pipeline_context
    from functions.terminate.workflow import (
        DrainSettings,
        UndrainSettings,
        run_drain,
        run_undrain,
        wants,
        wants_undrain,
    )

    scale = demo.options.time_scale
    preempt_scale = demo.options.type_scales.get(PREEMPT, scale)
    url = demo.receivers["drain"].url
    demo.drain_settings = DrainSettings(
        http_url=url,
        relay_hook="drain",
        # The real-world defaults, scaled like the simulator's clock (a Preempt's like its
        # own: it plays at its own time scale).
        step_timeout_seconds=max(1.0, 120 / scale),
        safety_margin_seconds=30 / scale,
        approve_reserve_seconds=max(0.5, 10 / scale),
        preempt_safety_margin_seconds=5 / preempt_scale,
        preempt_approve_reserve_seconds=2 / preempt_scale,
        poll_seconds=0.1,
        # A VM without the `drain` script (the scale set's, as a first deploy leaves it)
        # is drained through its readiness probe: 503, then this long, then approved.
        readiness_seconds=30 / scale,
    )
    # The same receiver takes the undrain (its body says "action": "undrain").
    demo.undrain_settings = UndrainSettings(
        http_url=url,
        relay_hook="undrain",
        step_timeout_seconds=max(1.0, 120 / scale),
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

    # The deployed app's wiring: only VMs whose own view decided drain are drained.
    ctx = pipeline_context(pipeline, drains)
    heartbeat_facts = ctx.relay_facts

    def relay_facts(vm: str) -> RelayFacts | None:
        # The demo plays each drained VM's load balancer (local.demo_ready.ProbeWatcher
        # asks its /readyz from this machine, not from Azure's 168.63.129.16): those VMs
        # are behind a load balancer, as the relay's heartbeat would say in Azure.
        if any(w.vm == vm for w in getattr(demo, "ready_probes", [])):
            now = datetime.now(UTC)
            return RelayFacts(heard=now, contract=2, probe_at=now)
        return heartbeat_facts(vm) if heartbeat_facts else None

    ctx.relay_facts = relay_facts

    def handle(note: Any) -> None:
        try:
            if wants_undrain(note):
                result = run_undrain(note, demo.undrain_settings, ctx, drain_hook="drain")
            else:
                result = run_drain(note, demo.drain_settings, ctx)
        except Exception as exc:
            demo.timeline.add("drain", "terminate", f"workflow failed: {exc}", ok=False)
            return
        demo.drain_results.append(result)

    pool = ThreadPoolExecutor(4, thread_name_prefix="drain-workflow")
    demo.stack.callback(pool.shutdown)

    def take(note: Any) -> None:
        if wants(note) or wants_undrain(note):
            with contextlib.suppress(RuntimeError):  # shutting down: the demo is over
                pool.submit(handle, note)

    demo.publisher.subscribe("terminate", take)
