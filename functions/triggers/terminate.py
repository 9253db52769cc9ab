"""Azure handler for the drain workflow: the `terminate` subscription of the topic (named
for its first use, the scale-in Terminate; it drains every event type a rule drains).

A `decided` drain runs the drain (run_drain); a drained event that ended with its VM
still there (cancelled, or a completed Freeze, Reboot or Redeploy) runs the undrain
(run_undrain). Approvals and undrain audit rows say `by: drain`. Wires them to the core's
shared pipeline (functions.triggers.core.pipeline: settings, Table store, topic publisher,
HTTP session, clock) and to functions.pipeline.approve.approve_event.
Returning completes the message (a body that is not a notification is recorded in the
deliveries table first, as channel `terminate`); an exception (Table storage or Service Bus
trouble) abandons it, and the redelivery resumes the workflow from the drains table.
Register with `app.register_functions(functions.triggers.terminate.bp)`.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from functools import lru_cache

import azure.functions as func
from pydantic import ValidationError

from functions.model.event import Notification, Transition
from functions.notify.dispatch import record_rejection
from functions.notify.settings import channel_settings
from functions.pipeline.context import Pipeline
from functions.store.drains import DrainStore
from functions.terminate.workflow import (
    DrainContext,
    DrainSettings,
    UndrainSettings,
    run_drain,
    run_undrain,
    wants,
    wants_undrain,
)
from functions.triggers import core as core_trigger
from functions.triggers import notify as notify_trigger

log = logging.getLogger(__name__)

bp = func.Blueprint()


@lru_cache(maxsize=1)
def drain_settings() -> DrainSettings:
    return DrainSettings()


@lru_cache(maxsize=1)
def undrain_settings() -> UndrainSettings:
    return UndrainSettings()


def build_context() -> DrainContext:
    """The drain's context over the core's shared pipeline (functions.terminate.wiring)."""
    from functions.terminate.wiring import pipeline_context

    pipeline = core_trigger.pipeline

    core = pipeline()
    secrets = channel_settings().webhook_secrets()
    drains = DrainStore.from_service(core.store.service, core.settings.state_table_prefix)
    return pipeline_context(core, drains, secrets or None)


@bp.function_name("terminate_drain")
@bp.service_bus_topic_trigger(
    arg_name="msg",
    topic_name="%NOTIFICATIONS_TOPIC%",
    subscription_name="terminate",
    connection="ServiceBusConnection",
)
def terminate_drain(msg: func.ServiceBusMessage) -> None:
    try:
        note = Notification.from_json(msg.get_body())
    except ValidationError as exc:
        # Permanent, and this binding cannot dead-letter: recorded with the reason, completed.
        reason = f"not a notification ({exc.error_count()} errors): {exc.errors()[0]['msg']}"
        log.error("terminate: message %s %s", msg.message_id or "?", reason)
        record_rejection(
            notify_trigger.ledger(),
            "terminate",
            msg.message_id or "unnamed",
            reason,
            datetime.now(UTC),
        )
        return
    if wants_undrain(note):
        undrain(note)
        return
    if not wants(note):
        return
    try:
        settings = drain_settings()
    except ValidationError as exc:
        # Fail closed and say so: nothing is drained or approved, NotBefore will arrive.
        announce_invalid_settings(note, exc)
        return
    result = run_drain(note, settings, build_context())
    log.info(
        "drain %s %s: %s (drained=%s) %s",
        note.event.event_type if note.event else "-",
        result.event_id,
        result.outcome,
        result.drained,
        "; ".join(f"{name}={step.status}" for name, step in result.steps.items()),
    )


def undrain(note: Notification) -> None:
    try:
        settings = undrain_settings()
        hook = drain_settings().relay_hook
    except ValidationError as exc:
        announce_invalid_settings(note, exc, Transition.UNDRAIN_FAILED, "UNDRAIN__")
        return
    result = run_undrain(note, settings, build_context(), drain_hook=hook)
    log.info("undrain %s: %s %s", result.event_id, result.outcome, result.detail)


def announce_invalid_settings(
    note: Notification,
    exc: ValidationError,
    transition: Transition = Transition.DRAIN_FAILED,
    prefix: str = "DRAIN__",
) -> None:
    pipeline = core_trigger.pipeline

    problems = "; ".join(
        f"{prefix}{'.'.join(str(p) for p in error['loc']).upper()}: {error['msg']}"
        for error in exc.errors()
    )
    if transition is Transition.DRAIN_FAILED:
        detail = f"drain settings invalid ({problems}): nothing drained or approved, holding"
    else:
        detail = f"settings invalid ({problems}): nothing undrained; undrain by hand"
    log.error("terminate %s: %s", note.event.event_id if note.event else "-", detail)
    pipeline().publisher.publish(
        Notification(
            transition=transition,
            occurred_at=datetime.now(UTC),
            event=note.event,
            decision=note.decision,
            detail=detail,
            links=note.links,
        )
    )


def wire_drainer(core: Pipeline) -> None:
    """The drain workflow as the one decider runs it from an event row (the sweep's
    workers: a drain whose `decided` notification never came, an undrain before close)."""
    from functions.terminate.wiring import row_drainer

    core.drainer = row_drainer(core, build_context, drain_settings, undrain_settings)


core_trigger.WIRING.append(wire_drainer)
