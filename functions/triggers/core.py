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
import os
import threading
from collections.abc import Callable

import azure.functions as func
import requests

from functions import telemetry
from functions.approvers.arm import default_credential
from functions.clock import SystemClock
from functions.pipeline.admission import Admission
from functions.pipeline.context import Pipeline
from functions.pipeline.guest_time import enqueued_of
from functions.pipeline.heartbeats import ingest_heartbeats
from functions.pipeline.ingest import ingest_message
from functions.pipeline.publish import ServiceBusPublisher
from functions.pipeline.reconcile import reconcile_key
from functions.pipeline.watchdog import run_watchdog
from functions.pipeline.workqueue import ServiceBusWorkQueue
from functions.settings import check_for_azure, load_settings
from functions.settings_check import checked_settings
from functions.store.rows import BadRow
from functions.store.state import Store
from functions.triggers.later import MAX_RETRIES, ServiceBusLater, is_outage, retry_of
from functions.web.approval import FUNCTION_KEY_ACTOR, HTTP_STATUS, Refused, approve_by_hand
from functions.web.views import fleet_status

log = logging.getLogger(__name__)

bp = func.Blueprint()

_lock = threading.Lock()
_pipeline: Pipeline | None = None
# Body fields a caller might use to name who approved: never believed (approve below).
IDENTITY_FIELDS = frozenset({"by", "approved_by", "approver", "who", "user", "actor", "name"})


# Called with the pipeline once it is built: other blueprints add what they own to it
# (functions.triggers.terminate: the drain workflow, which the one decider runs from an
# event row), without this module importing them.
WIRING: list[Callable[[Pipeline], None]] = []


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
            # Every setting checked as `settings check` does: one it refuses makes the
            # host fail closed (nothing approved, policy_invalid announced, same message).
            settings = checked_settings(settings)
            if os.environ.get("RELAY_KEY") or os.environ.get("RELAY_KEY_PREVIOUS"):
                log.warning(
                    "RELAY_KEY / RELAY_KEY_PREVIOUS are no longer used (each relay has its own "
                    "key): remove them and the relay-key secret"
                )
            store = Store.from_settings(settings).ensure_tables()
            session = requests.Session()
            credential = default_credential()
            _pipeline = Pipeline(
                store=store,
                settings=settings,
                publisher=ServiceBusPublisher.from_settings(settings),
                session=session,
                clock=SystemClock(),
                credential=credential,
                admission=Admission.from_settings(settings, store, session, credential),
            )
            # The sweep hands due events to the `reconcile` queue (its own function below);
            # the one decider runs the drain from the row (functions.triggers.terminate).
            _pipeline.work_queue = ServiceBusWorkQueue.from_settings(settings)
            for wire in WIRING:
                wire(_pipeline)
        return _pipeline


@bp.function_name("ingest")
@bp.service_bus_queue_trigger(
    arg_name="msg",
    queue_name="%DOCUMENTS_QUEUE%",
    connection="ServiceBusConnection",
    is_sessions_enabled=True,
)
def ingest(msg: func.ServiceBusMessage) -> None:
    """Returning completes the message; raising abandons it for redelivery (then DLQ). A
    failure on an outage (storage, the topic) schedules a copy later instead
    (functions.triggers.later), so an outage burns no deliveries."""
    current = pipeline()
    try:
        result = ingest_message(
            msg.get_body(),
            current,
            message_id=msg.message_id or "",
            session_id=msg.session_id,
            enqueued_at=enqueued_of(msg.application_properties, msg.enqueued_time_utc),
        )
    except Exception as exc:
        if not later_instead(msg, exc, current, current.settings.documents_queue):
            raise
        return
    log.info(
        "ingest %s from %s: %s %s",
        msg.message_id,
        result.vm,
        result.outcome,
        " ".join(f"{e}:{t}" for e, t in result.transitions),
    )


_later: dict[str, ServiceBusLater] = {}


def later_instead(
    msg: func.ServiceBusMessage, exc: BaseException, current: Pipeline, queue: str
) -> bool:
    """On an outage: a copy of `msg` scheduled on `queue` for later (True: the original
    may be completed); anything else, or the last retry, is the caller's to raise."""
    retry = retry_of(msg.application_properties) + 1
    if not is_outage(exc) or retry > MAX_RETRIES:
        return False
    with _lock:
        sender = _later.get(queue) or ServiceBusLater.for_queue(current.settings, queue)
        _later[queue] = sender
    try:
        at = sender.schedule(
            msg.get_body(),
            session_id=msg.session_id,
            message_id=msg.message_id or "unnamed",
            retry=retry,
            now=current.clock.now(),
            enqueued=enqueued_of(msg.application_properties, msg.enqueued_time_utc),
        )
    except Exception:
        log.exception("could not schedule %s for later; abandoned instead", msg.message_id)
        return False
    log.warning(
        "%s: %s on an outage (%s); copy %d of %d scheduled for %s",
        queue,
        msg.message_id,
        type(exc).__name__,
        retry,
        MAX_RETRIES,
        at.isoformat(),
    )
    return True


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


@bp.function_name("reconcile")
@bp.service_bus_queue_trigger(
    arg_name="msg",
    queue_name="%RECONCILE_QUEUE%",
    connection="ServiceBusConnection",
)
def reconcile(msg: func.ServiceBusMessage) -> None:
    """One due event, found by the sweep: reconciled on its own (with its own deadline),
    as one of `maxConcurrentCalls` at once per instance. Returning completes it; raising
    abandons it for redelivery, which takes over the claims this delivery held (their
    holder is the MessageId). A row that is not a record is permanent: logged, completed."""
    key = msg.get_body().decode("utf-8", "replace")[:1024]
    try:
        done = reconcile_key(pipeline(), key, me=f"work:{msg.message_id or key}")
    except BadRow as exc:
        log.warning("reconcile %.200r: skipped %s", key, exc)
        return
    telemetry.reconciled(done)  # what the sweep's line cannot say: it only hands keys over


@bp.function_name("watchdog")
@bp.timer_trigger(arg_name="timer", schedule="0 * * * * *", run_on_startup=False)
def watchdog(timer: func.TimerRequest) -> None:
    current = pipeline()
    report = run_watchdog(current)
    log.info("watchdog: %s", report.model_dump_json())
    telemetry.watchdog_run(report)  # the "watchdog not running" alert looks for this line
    if current.admission is not None:  # admission's counts of a quiet minute still go out
        current.admission.tally.flush_due(current.clock.now())


def _json(data: object, status: int = 200) -> func.HttpResponse:
    return func.HttpResponse(
        json.dumps(data, default=str), status_code=status, mimetype="application/json"
    )


@bp.function_name("status")
@bp.route(route="status", methods=["GET"], auth_level=func.AuthLevel.FUNCTION)
def status(req: func.HttpRequest) -> func.HttpResponse:
    """Current fleet events and their decisions; `?all=true` includes ended ones."""
    include_ended = (req.params.get("all") or "").lower() in ("1", "true", "yes")
    return _json(fleet_status(pipeline(), include_ended))


@bp.function_name("ledger")
@bp.route(route="events/{event_id}/ledger", methods=["GET"], auth_level=func.AuthLevel.FUNCTION)
def ledger(req: func.HttpRequest) -> func.HttpResponse:
    """The event's impact ledger for a support case (functions/ledger.py): JSON, or CSV
    with `?format=csv` (the same as `python -m functions ledger EVENT_ID [--csv]`)."""
    return ledger_export(
        pipeline(), req.route_params.get("event_id", ""), req.params.get("format") or "json"
    )


def ledger_export(p: Pipeline, event_id: str, form: str) -> func.HttpResponse:
    from functions.ledger import as_csv, as_json, read_ledger
    from functions.store.rows import BadRow

    if form not in ("json", "csv"):
        return _json({"error": f"format must be json or csv, not {form[:20]!r}"}, 400)
    skipped: list = []
    try:
        record, lines = read_ledger(p.store, event_id, skipped)
    except BadRow as exc:  # named, not a stack trace
        return _json({"error": f"the event's row cannot be read: {exc}"}, 500)
    if record is None:
        return _json({"error": f"no event {event_id[:128]!r}"}, 404)
    if form == "json":
        return func.HttpResponse(as_json(record, lines, skipped), mimetype="application/json")
    name = "".join(c for c in record.event_id if c.isalnum() or c == "-")[:64] or "event"
    return func.HttpResponse(
        as_csv(lines),
        mimetype="text/csv",
        headers={"Content-Disposition": f'attachment; filename="ledger-{name}.csv"'},
    )


@bp.function_name("approve")
@bp.route(route="events/{event_id}/approve", methods=["POST"], auth_level=func.AuthLevel.FUNCTION)
def approve(req: func.HttpRequest) -> func.HttpResponse:
    """Approve by hand with a function key, e.g. a Reboot the policy holds.

    Audited as `manual:function-key`: a function key says nothing about who holds it, so
    the caller cannot name who approved. A `by` (or `approved_by`, `who`, ...) in the body
    or an X-MS-CLIENT-PRINCIPAL-* header is ignored, and the answer says so in `note`.
    People who must be named approve on the operators' pages (Entra sign-in)."""
    status, data = approve_with_key(pipeline(), req.route_params.get("event_id", ""), req)
    return _json(data, status)


def approve_with_key(p: Pipeline, event_id: str, req: func.HttpRequest) -> tuple[int, dict]:
    try:
        body = req.get_json() if req.get_body() else {}
    except ValueError:
        return 400, {"error": "body must be empty or a JSON object"}
    if body is not None and not isinstance(body, dict):
        return 400, {"error": "body must be empty or a JSON object"}
    claimed = sorted(k for k in body or {} if k.casefold() in IDENTITY_FIELDS)
    claimed += sorted(h for h in req.headers if h.lower().startswith("x-ms-client-principal"))
    note = None
    if claimed:
        note = (
            f"ignored {', '.join(claimed)}: the function-key API cannot say who approved; "
            f"recorded as {FUNCTION_KEY_ACTOR!r} (approve on the operators' pages to be named)"
        )
        log.warning("approve %s: %s", event_id[:128], note)
    try:
        result = approve_by_hand(p, event_id, FUNCTION_KEY_ACTOR)
    except Refused as exc:
        return exc.status, {"error": str(exc), **({"note": note} if note else {})}
    data = result.model_dump(mode="json")
    if note:
        data["note"] = note
    return HTTP_STATUS[result.outcome], data
