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

from functions.approvers.relay import RelayTarget
from functions.model.event import Notification, Transition
from functions.notify.dispatch import record_rejection
from functions.notify.settings import channel_settings
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
    from functions.model.policy import transition_pages
    from functions.pipeline.approve import ApprovalResult, approve_event
    from functions.pipeline.capacity import take_capacity
    from functions.triggers.core import pipeline

    core = pipeline()
    store, settings = core.store, core.settings

    def approve(event_id: str, give_up_at: datetime) -> ApprovalResult:
        return approve_event(
            event_id,
            core,
            give_up_at=give_up_at,
            by="drain",
        )

    def relay_target(vm: str) -> RelayTarget | None:
        record = store.get_vm(vm)
        return core.relay_target(record) if record else None

    def pages(transition: Transition) -> bool:
        return transition_pages(settings.policy.policy, transition)

    def capacity(event_id: str) -> bool:
        return take_capacity(store, event_id, core.policy, core.clock.now())

    def audit(event_id: str, outcome: str, detail: str) -> None:
        record = store.get_event(event_id)
        decision = record.decision if record else None
        store.audit(
            event_id,
            at=core.clock.now(),
            rule=decision.rule if decision else "",
            action="undrain",
            outcome=outcome,
            detail=detail,
            by="drain",
        )

    secrets = channel_settings().webhook_secrets()
    return DrainContext(
        store=DrainStore.from_service(store.service, settings.state_table_prefix),
        session=core.session,
        publish=core.publisher.publish,
        approve=approve,
        relay_target=relay_target,
        clock=core.clock,
        webhook_secret=secrets or None,
        pages=pages,
        audit=audit,
        capacity=capacity,
    )


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
    from functions.triggers.core import pipeline

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
