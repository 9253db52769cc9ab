"""Azure handlers for the core: ingest, watchdog, manual approval, fleet status.

Thin: each parses its trigger, calls the plain functions with the shared `Pipeline`, and
returns. The pipeline (settings, Table store, topic publisher, HTTP session) is built at
the first invocation, not at import: the Functions host must be able to import
function_app.py to index the functions even while a setting is wrong, and the first
invocation then fails with one clear SettingsInvalid line in the logs.
"""

from __future__ import annotations

import json
import logging
import threading

import azure.functions as func
import requests

from functions.clock import SystemClock
from functions.pipeline.approve import approve_event
from functions.pipeline.context import Pipeline
from functions.pipeline.heartbeats import ingest_heartbeats
from functions.pipeline.ingest import ingest_message
from functions.pipeline.publish import ServiceBusPublisher
from functions.pipeline.watchdog import run_watchdog
from functions.settings import check_for_azure, load_settings
from functions.store import claims
from functions.store.records import EventRecord
from functions.store.tables import Store

log = logging.getLogger(__name__)

bp = func.Blueprint()

_lock = threading.Lock()
_pipeline: Pipeline | None = None


def use_pipeline(pipeline: Pipeline | None) -> None:
    """Replace the pipeline the handlers use (tests, a local host); None to rebuild."""
    global _pipeline
    with _lock:
        _pipeline = pipeline


def pipeline() -> Pipeline:
    global _pipeline
    with _lock:
        if _pipeline is None:
            settings = load_settings()
            check_for_azure(settings)
            if settings.relay_key is None:
                log.error("RELAY_KEY is not set: approvals will fail and be announced")
            store = Store.from_settings(settings).ensure_tables()
            _pipeline = Pipeline(
                store=store,
                settings=settings,
                publisher=ServiceBusPublisher.from_settings(settings),
                session=requests.Session(),
                clock=SystemClock(),
            )
            settings.policy  # noqa: B018 - read now so an invalid policy is logged at start
        return _pipeline


@bp.function_name("ingest")
@bp.service_bus_queue_trigger(
    arg_name="msg",
    queue_name="%DOCUMENTS_QUEUE%",
    connection="ServiceBusConnection",
    is_sessions_enabled=True,
)
def ingest(msg: func.ServiceBusMessage) -> None:
    """Returning completes the message; raising abandons it for redelivery (then DLQ)."""
    result = ingest_message(msg.get_body(), pipeline(), message_id=msg.message_id or "")
    log.info(
        "ingest %s from %s: %s %s",
        msg.message_id,
        result.vm,
        result.outcome,
        " ".join(f"{e}:{t}" for e, t in result.transitions),
    )


@bp.function_name("heartbeats")
@bp.service_bus_queue_trigger(
    arg_name="msgs",
    queue_name="%HEARTBEATS_QUEUE%",
    connection="ServiceBusConnection",
    cardinality="many",
)
def heartbeats(msgs: list[func.ServiceBusMessage]) -> None:
    """A batch of heartbeats (host.json `maxMessageBatchSize`) in one execution; returning
    completes them all, raising abandons them all (the writes are idempotent)."""
    result = ingest_heartbeats(
        [m.get_body() for m in msgs], pipeline(), [m.message_id or "" for m in msgs]
    )
    log.info("heartbeats: %s", result.model_dump_json())


@bp.function_name("watchdog")
@bp.timer_trigger(arg_name="timer", schedule="0 * * * * *", run_on_startup=False)
def watchdog(timer: func.TimerRequest) -> None:
    report = run_watchdog(pipeline())
    log.info("watchdog: %s", report.model_dump_json())


def _json(data: object, status: int = 200) -> func.HttpResponse:
    return func.HttpResponse(
        json.dumps(data, default=str), status_code=status, mimetype="application/json"
    )


def event_view(record: EventRecord) -> dict[str, object]:
    decision = record.decision
    return {
        **record.snapshot().imds_fields(),
        "first_seen": record.first_seen.isoformat(),
        "reporters": record.reporters,
        "ended": record.ended or None,
        "decision": decision.model_dump(mode="json") if decision else None,
        "approval": record.approval or None,
        "approval_reason": record.approval_reason or None,
        "approved_by": record.approved_by,
        "approve_after": record.approve_after.isoformat() if record.approve_after else None,
        "approval_attempts": len(record.approval_attempts),
        "announced": sorted(k for k, v in record.announced.items() if v == claims.DONE),
    }


@bp.function_name("status")
@bp.route(route="status", methods=["GET"], auth_level=func.AuthLevel.FUNCTION)
def status(req: func.HttpRequest) -> func.HttpResponse:
    """Current fleet events and their decisions; `?all=true` includes ended ones."""
    p = pipeline()
    include_ended = (req.params.get("all") or "").lower() in ("1", "true", "yes")
    events = p.store.list_events(include_ended=include_ended)
    for record in events:
        p.store.load_reporters(record)
    events.sort(key=lambda r: (r.not_before is None, r.not_before or r.first_seen))
    load = p.settings.policy
    return _json(
        {
            "generated_at": p.clock.now().isoformat(),
            "policy": {
                "valid": load.policy is not None,
                "error": load.error,
                "dry_run": bool(load.policy and load.policy.dry_run),
            },
            "events": [event_view(r) for r in events],
        }
    )


@bp.function_name("approve")
@bp.route(route="events/{event_id}/approve", methods=["POST"], auth_level=func.AuthLevel.FUNCTION)
def approve(req: func.HttpRequest) -> func.HttpResponse:
    """An operator approves by hand, e.g. a Reboot the policy holds. Audited with `by`."""
    p = pipeline()
    event_id = req.route_params.get("event_id", "")
    try:
        body = req.get_json() if req.get_body() else {}
    except ValueError:
        return _json({"error": 'body must be JSON, e.g. {"by": "alice"}'}, 400)
    by = str((body or {}).get("by") or req.headers.get("x-ms-client-principal-name") or "unknown")
    record = p.store.get_event(event_id)
    if record is None:
        return _json({"error": f"unknown event {event_id}"}, 404)
    load = p.settings.policy
    if load.policy is not None and load.policy.dry_run:
        p.store.audit(
            record.event_id,
            at=p.clock.now(),
            rule="manual",
            action="approve",
            outcome="refused: dry run",
            by=f"manual:{by}",
        )
        return _json({"error": "POLICY__DRY_RUN is on: nothing is approved"}, 409)
    result = approve_event(
        record.event_id,
        p,
        by=f"manual:{by}",
        force=True,
    )
    if result.outcome == "skipped":
        p.store.audit(
            record.event_id,
            at=p.clock.now(),
            rule="manual",
            action="approve",
            outcome=f"skipped: {result.detail}",
            by=f"manual:{by}",
        )
    code = {"approved": 200, "failed": 502, "retry_later": 503, "skipped": 409}[result.outcome]
    return _json(result.model_dump(mode="json"), code)
