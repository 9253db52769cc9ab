"""The demo's `terminate` subscription: the drain workflow on worker threads of its own.

Drains every event the policy drains (here: the scale-in Terminate, the app VM's reboot,
the Spot eviction) and undrains the VMs that come back, with the real-world times scaled
like the simulator's clock. As in Azure (functions.triggers.terminate), a run that raises
(storage down) is delivered again by the subscription (local/bus.py: the same message,
its DeliveryCount one higher, dead-lettered after servicebus.bicep's maxDeliveryCount),
and the one decider runs a drain still due from the event's row (`pipeline.drainer`, as
functions.triggers.terminate.wire_drainer sets it), so an outage longer than the
deliveries still ends with the event drained, then approved.
"""

from __future__ import annotations

import contextlib
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from local.demo_state import DemoState


def start_drain_worker(demo: DemoState) -> None:
    """The `terminate` subscription: drain, then approve; undrain when the VM is back.

    In Azure it is its own function, invoked once per message and many at once, so a drain
    that takes seconds never holds up ingest or another event's drain; a few worker
    threads keep that true here. Started once the host is built (its pipeline is the app's).
    """
    from datetime import UTC, datetime

    from azure.servicebus import ServiceBusMessage

    from functions.model.drains import RelayFacts
    from functions.model.envelope import PREEMPT
    from functions.model.event import Notification
    from functions.pipeline.publish import topic_message
    from functions.servicebus import locked
    from functions.store.drains import DrainStore
    from functions.terminate.wiring import pipeline_context, row_drainer
    from functions.terminate.workflow import (
        DrainSettings,
        UndrainSettings,
        run_drain,
        run_undrain,
        wants,
        wants_undrain,
    )
    from local.bus import LocalQueue, body_of

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

    # The function app's one pipeline (functions.triggers.core.pipeline): the drain's
    # context over the host's, as functions.triggers.terminate.build_context builds it.
    pipeline = demo.host.pipeline
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
    # As functions.triggers.terminate.wire_drainer: the sweep's workers drain from the row.
    from_row = row_drainer(
        pipeline, lambda: ctx, lambda: demo.drain_settings, lambda: demo.undrain_settings
    )

    def drainer(what: str, row: object) -> str:
        demo.stopping.check()  # the demo is stopping: no drain starts (local/stopping.py)
        return from_row(what, row)

    pipeline.drainer = drainer

    # The subscription (maxDeliveryCount as deployed); the topic's duplicate detection is
    # the publisher's (functions.pipeline.publish.LocalPublisher).
    subscription = LocalQueue("terminate", duplicate_detection=False)
    demo.terminate_subscription = subscription
    pool = ThreadPoolExecutor(4, thread_name_prefix="drain-workflow")

    def stop() -> None:
        # The runs in flight end at once (the host's clock and session raise Stopped once
        # the demo stops), the queued ones never start, and every thread is joined: none
        # outlives the demo to call its stopped Azurite.
        demo.stopping.set()
        pool.shutdown(wait=True, cancel_futures=True)

    demo.stack.callback(stop)

    def handle(message: ServiceBusMessage) -> None:
        # functions.triggers.terminate.terminate_drain: returning completes the message,
        # raising abandons it (the Functions host's autoCompleteMessages).
        if demo.stopping.is_set():
            return  # left unsettled, as a stopped host leaves its message
        try:
            note = Notification.from_json(body_of(message))
            if wants_undrain(note):
                result = run_undrain(note, demo.undrain_settings, ctx, drain_hook="drain")
            else:
                result = run_drain(note, demo.drain_settings, ctx)
        except Exception as exc:
            if demo.stopping.is_set():
                return  # cut by the stop, not a failure to deliver again
            count = subscription.delivery_count(message)
            error = f"{type(exc).__name__}: {exc}"
            if subscription.abandon(message, error):
                detail = f"dead-lettered after {count} deliveries; the sweep drains from the row"
            else:
                detail = f"delivery {count} failed, delivered again"
            demo.timeline.add("drain", "terminate", f"workflow failed: {error}: {detail}", False)
            return
        subscription.settled(message)
        demo.drain_results.append(result)

    def deliver(message: ServiceBusMessage) -> None:
        with contextlib.suppress(RuntimeError):  # shutting down: the demo is over
            pool.submit(handle, message)

    subscription.on_message(deliver)
    sender = locked(subscription)

    def take(note: Notification) -> None:
        # Only what the function would act on (it completes the rest unread).
        if wants(note) or wants_undrain(note):
            sender.send_messages(topic_message(note))

    demo.publisher.subscribe("terminate", take)
