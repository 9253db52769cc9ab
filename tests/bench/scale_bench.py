"""Fleet-scale numbers for issue 11, and the per-operation counts the cost model reads.

Everything goes through the code's own entry points (ingest_message, run_watchdog) against
Azurite, with Table requests counted by a proxy in front of it (tests/bench/wire.py), so
the numbers follow whatever the store does on the wire: a layout change needs no change
here.

- set200: 200 VMs of one availability set (64-character names) report one event through
  Scheduled, Started and gone, 16 at a time: Table requests per document.
  A set of 20 gives the model's per-document counts and stored bytes.
- watchdog: 10,000 VMs heard recently, 1,000 events that ended before the retention, 5
  held events: Table requests of one sweep (and the next); steady sweeps of fleets with
  no history (2,000 and 10 VMs) give the model's base + per VM.
- heartbeats: what one heartbeat costs as the function app receives it (its batch
  handler where it has one, else one execution each on the session queue).

Fleets are seeded through the app's entry points too (ingest, the heartbeat handler), so
they follow the store's layout; seeding is not counted.
"""

from __future__ import annotations

import importlib
import json
import logging
import multiprocessing
import re
import statistics
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import requests
from azure.core.exceptions import ServiceRequestError, ServiceResponseError
from azure.data.tables import TableTransactionError
from pydantic import BaseModel

from functions.pipeline.publish import LocalPublisher
from tests.bench.wire import WireCounter

ROOT = Path(__file__).resolve().parents[2]

TRACE_ROW_BYTES = 250  # columns Application Insights stores around each log line (assumed)
JUNK_ROWS = 100_000  # issue 27: junk liveness rows beside the 10,000-VM fleet
PLATFORM_BYTES_PER_EXECUTION = 1000  # the host's request row and its two trace lines (assumed)


# --------------------------------------------------------------------------- helpers


class FixedClock:
    """Time that stands still unless the code sleeps: seeding in the past, sweeping later."""

    def __init__(self, at: datetime) -> None:
        self.at = at
        self._lock = threading.Lock()

    def now(self) -> datetime:
        with self._lock:
            return self.at

    def sleep(self, seconds: float) -> None:
        with self._lock:
            self.at += timedelta(seconds=max(0.0, seconds))


class LogMeter(logging.Handler):
    """Bytes logged at Information and above by anything in the process, as the Functions
    Python worker forwards them to Application Insights as traces: the app's lines, its
    telemetry lines, and the Azure SDK's (its HTTP logging policy logs each request and
    response at Information unless the app turns it down)."""

    def __init__(self) -> None:
        super().__init__(level=logging.INFO)
        self.records = 0
        self.bytes = 0
        self.by_source: Counter[str] = Counter()  # bytes by top-level logger name
        self._meter_lock = threading.Lock()

    def emit(self, record: logging.LogRecord) -> None:
        size = len(record.getMessage().encode("utf-8", "replace"))
        with self._meter_lock:
            self.records += 1
            self.bytes += size
            self.by_source[record.name.split(".")[0]] += size + TRACE_ROW_BYTES

    def reset(self) -> None:
        with self._meter_lock:
            self.records = self.bytes = 0
            self.by_source.clear()

    def telemetry_bytes(self) -> int:
        return self.bytes + self.records * TRACE_ROW_BYTES

    def __enter__(self) -> LogMeter:
        root = logging.getLogger()
        self._old_level = root.level
        root.setLevel(logging.INFO)  # the worker's level; host.json's default is Information
        root.addHandler(self)
        return self

    def __exit__(self, *exc: object) -> None:
        root = logging.getLogger()
        root.removeHandler(self)
        root.setLevel(self._old_level)


def name64(prefix: str, i: int) -> str:
    """A 64-character VM name, as long names are what fill a Table property."""
    base = f"{prefix}-{i:06d}-"
    return base + "x" * (64 - len(base))


def imds_time(at: datetime) -> str:
    return at.strftime("%a, %d %b %Y %H:%M:%S GMT")


def reboot(event_id: str, resources: list[str], status: str, not_before: datetime) -> dict:
    return {
        "EventId": event_id,
        "EventStatus": status,
        "EventType": "Reboot",
        "ResourceType": "VirtualMachine",
        "Resources": resources,
        "NotBefore": imds_time(not_before) if status == "Scheduled" else "",
        "Description": "Host server is undergoing maintenance.",
        "EventSource": "Platform",
        "DurationInSeconds": -1,
    }


def envelope(
    vm: str,
    sequence: int,
    events: list[dict[str, Any]] | None,
    observed_at: datetime,
    aset: str | None = None,
) -> str:
    """A relay's message (a heartbeat when `events` is None), attested for its exact bytes
    (tests.bench.attested), as the app admits only those."""
    from functions.model.envelope import Envelope, VmRef
    from tests.bench.attested import attested

    return attested(
        Envelope(
            kind="heartbeat" if events is None else "document",
            vm=VmRef(name=vm, availability_set=aset),
            relay_version="bench",
            sequence=sequence,
            observed_at=observed_at,
            document=None
            if events is None
            else {"DocumentIncarnation": sequence, "Events": events},
        ).to_json()
    )


def make_pipeline(connection_string: str, prefix: str, publisher: Any, clock: Any) -> Any:
    from functions.pipeline.context import Pipeline
    from functions.settings import load_settings
    from functions.store.liveness import DictVerifier
    from functions.store.state import Store
    from tests.bench.attested import APP_SECRET, admission

    settings = load_settings(
        state_storage=connection_string, app_secret=APP_SECRET, state_table_prefix=prefix
    )
    store = Store.from_settings(settings).ensure_tables()
    # The watchdog reads the liveness table only with a verifier; the bench's relays write
    # no liveness rows (none is stale), so an empty one costs what a real one would.
    return Pipeline(
        store,
        settings,
        publisher,
        requests.Session(),
        clock,
        admission=admission(store),
        liveness_verifier=DictVerifier({}),
    )


# --------------------------------------------------------------------------- seeding


class SessionClock:
    """Each thread's own standing time, set per piece of work: one pipeline seeds both
    the past (events that ended 40 days ago) and the present (VMs heard just now)."""

    def __init__(self) -> None:
        self._local = threading.local()

    def set(self, at: datetime) -> None:
        self._local.at = at

    def now(self) -> datetime:
        return self._local.at

    def sleep(self, seconds: float) -> None:
        self._local.at += timedelta(seconds=max(0.0, seconds))


# (table prefix, ISO time of the pipeline's clock, "session" | "heartbeats", bodies): a
# session is one VM's documents, in order; heartbeats are one batch as the trigger gets it.
Work = tuple[str, str, str, list[str]]


def heartbeat_batch_size() -> int:
    """Heartbeats per execution as host.json delivers them on a queue without sessions
    (the trigger waits for minMessageBatchSize, the conservative end)."""
    bus = json.loads((ROOT / "host.json").read_text())["extensions"]["serviceBus"]
    return int(bus.get("minMessageBatchSize", 1))


def batch_handler() -> Callable[..., Any] | None:
    """The app's heartbeat batch handler, if it has one (issue 11 moves heartbeats off the
    session queue); None: heartbeats are documents-queue messages, one per execution."""
    try:
        module = importlib.import_module("functions.pipeline.heartbeats")
    except ImportError:
        return None
    return getattr(module, "ingest_heartbeats", None)


def receive_heartbeats(bodies: list[str], pipeline: Any) -> tuple[int, bool]:
    """Give heartbeats to the app as Azure would: through its batch handler where it has
    one (functions.pipeline.heartbeats), else one message per execution on the session
    queue. Returns (executions, whether they rode the session queue)."""
    ingest_heartbeats = batch_handler()
    if ingest_heartbeats is None:
        from functions.pipeline.ingest import ingest_message

        bad = [r.outcome for r in (ingest_message(b, pipeline) for b in bodies)]
        if any(outcome != "processed" for outcome in bad):
            raise RuntimeError(f"heartbeats not processed: {sorted(set(bad))}") from None
        return len(bodies), True
    size = max(1, heartbeat_batch_size())
    chunks = [bodies[i : i + size] for i in range(0, len(bodies), size)]
    for chunk in chunks:
        result = ingest_heartbeats(chunk, pipeline)
        if getattr(result, "rejected", 0):
            raise RuntimeError(f"heartbeats rejected: {result}")
    return len(chunks), False


def seed(connection_string: str, work: list[Work], processes: int = 2, threads: int = 8) -> None:
    """Run the work through the app's own entry points (ingest for documents, the
    heartbeat path for heartbeats), so the rows follow whatever layout the store has;
    spread over processes and threads as the function app would. Not counted."""
    if not work:
        return
    context = multiprocessing.get_context("spawn")
    shares = [(connection_string, work[i::processes], threads) for i in range(processes)]
    with ProcessPoolExecutor(max_workers=processes, mp_context=context) as pool:
        list(pool.map(_seed_worker, shares, timeout=900))


def _seed_worker(args: tuple[str, list[Work], int]) -> None:
    from functions.pipeline.ingest import ingest_message
    from functions.pipeline.publish import LocalPublisher
    from tests.bench.attested import learn

    connection_string, work, threads = args
    learn(body for _, _, _, bodies in work for body in bodies)  # Resource Graph's answers
    clock = SessionClock()
    pipelines = {
        prefix: make_pipeline(connection_string, prefix, LocalPublisher(), clock)
        for prefix in {prefix for prefix, _, _, _ in work}
    }

    def once(piece: Work) -> None:
        prefix, at, kind, bodies = piece
        clock.set(datetime.fromisoformat(at))
        if kind == "heartbeats":
            receive_heartbeats(bodies, pipelines[prefix])
            return
        for body in bodies:
            outcome = ingest_message(body, pipelines[prefix]).outcome
            if outcome not in ("processed", "stale"):
                raise RuntimeError(f"seeding: a document was {outcome}")

    def run(piece: Work) -> None:
        # Azurite on 2 busy cores sometimes resets a connection; the app's entry points are
        # idempotent (a redelivery is what Service Bus would do), so the piece is redone.
        for attempt in range(5):
            try:
                once(piece)
                return
            except (ServiceRequestError, ServiceResponseError):
                if attempt == 4:
                    raise
                time.sleep(0.5 * (attempt + 1))

    try:
        with ThreadPoolExecutor(max_workers=threads) as pool:
            list(pool.map(run, work))
    except Exception as exc:
        # Azure SDK exceptions carry tracebacks that cannot cross the process boundary.
        raise RuntimeError(f"seeding failed: {type(exc).__name__}: {exc}") from None


def _timed(call: Callable[[], Any]) -> tuple[Any, float]:
    began = time.perf_counter()
    value = call()
    return value, time.perf_counter() - began


# --------------------------------------------------------------------------- set200


def set200(connection_string: str) -> dict[str, Any]:
    """The issue's key (200 reporters), and the model's per-document counts from a set of
    20 (the model's default set size). A failure at 200 (a Table limit) is reported as
    such, not raised: the rest of the bench still measures."""
    out: dict[str, Any] = {}
    try:
        big = reporters(connection_string, 200)
        out["table_requests_per_doc_set200"] = big["table_requests_per_doc"]
        out["identity_requests_per_doc_set200"] = big["identity_requests_per_doc"]
        out["set200_requests_by_kind"] = big["requests_by_kind"]
    except Exception as exc:
        out["table_requests_per_doc_set200"] = None
        code = getattr(exc, "error_code", None) or str(exc).splitlines()[0][:100]
        out["set200_error"] = f"{type(exc).__name__}: {code}"
    small = reporters(connection_string, 20)
    out["table_requests_per_doc_set20"] = small["table_requests_per_doc"]
    out["log_bytes_per_doc_by_logger"] = small["log_bytes_per_doc_by_logger"]
    out["_counts"] = small["_counts"]
    return out


def reporters(connection_string: str, vms: int, workers: int = 16) -> dict[str, Any]:
    """`vms` VMs of one availability set (64-character names) report one event naming them
    all through Scheduled, Started and gone, `workers` documents at a time."""
    from functions.pipeline.ingest import ingest_message
    from functions.pipeline.publish import LocalPublisher

    run_id = uuid.uuid4().hex[:6]
    names = [name64(f"s{run_id}", i) for i in range(vms)]
    aset = f"bigset{run_id}"
    event_id = str(uuid.uuid4()).upper()
    now = datetime.now(UTC)
    not_before = now + timedelta(hours=1)
    publisher = LocalPublisher()
    with WireCounter(connection_string) as wire, LogMeter() as meter:
        pipeline = make_pipeline(
            wire.connection_string, f"benchset{run_id}", publisher, FixedClock(now)
        )
        first = [envelope(n, 1, [], now, aset) for n in names]  # the set is known already
        with ThreadPoolExecutor(max_workers=workers) as pool:
            list(pool.map(lambda body: ingest_message(body, pipeline), first))
        vm_bytes, vm_rows = wire.stored("vms")
        # Each VM's identities row too (Azure's facts and its wrapped callback keys, written
        # by the admission on the VM's first message): stored per VM like its VM row.
        identity_bytes, _ = wire.stored("identities")
        wire.reset()
        meter.reset()
        durations: list[float] = []
        outcomes: list[str] = []
        steps = (("Scheduled", 2), ("Started", 3), (None, 4))
        for status, sequence in steps:
            events = [] if status is None else [reboot(event_id, names, status, not_before)]
            observed = now + timedelta(seconds=sequence)
            bodies = [envelope(n, sequence, events, observed, aset) for n in names]
            with ThreadPoolExecutor(max_workers=workers) as pool:
                timed = list(
                    pool.map(lambda b: _timed(lambda: ingest_message(b, pipeline)), bodies)
                )
            outcomes += [result.outcome for result, _ in timed]
            durations += [seconds for _, seconds in timed]
        documents = len(steps) * vms
        requests_total = wire.total()
        entities = wire.entities()
        # The admission's read of the VM's identities row (per-VM identity): one a document,
        # part of the total above (the model prices the measured total).
        identity_reads = wire.entities_in("identities")
        event_bytes, _ = wire.stored("events")  # the event's rows, indexes, capacity slots
        audit_bytes, _ = wire.stored("audit")
        log_bytes = meter.telemetry_bytes()
        log_sources = {k: round(v / (len(steps) * vms)) for k, v in meter.by_source.items()}
        by_kind = wire.by_kind()
    if outcomes.count("processed") != len(outcomes):
        raise RuntimeError(f"not every document was processed: {sorted(set(outcomes))}")
    return {
        "table_requests_per_doc": round(requests_total / documents, 2),
        "identity_requests_per_doc": round(identity_reads / documents, 2),
        "requests_by_kind": by_kind,
        "log_bytes_per_doc_by_logger": log_sources,
        "_counts": {
            "table_requests_per_document": requests_total / documents,
            "table_entities_per_document": entities / documents,
            "seconds_per_document": statistics.fmean(durations),
            "log_bytes_per_document": log_bytes / documents,
            "notifications_per_event": len(publisher.transitions(event_id)),
            "table_bytes_per_vm": (vm_bytes + identity_bytes) / vm_rows if vm_rows else 0.0,
            "table_bytes_per_event": event_bytes + audit_bytes,
        },
    }


# --------------------------------------------------------------------------- watchdog


def watchdog(connection_string: str, fleets: Fleets, junk_rows: int = JUNK_ROWS) -> dict[str, Any]:
    """The issue's sweep: the big fleet heard recently, its ended events 40 days old
    (before a 30-day retention), 5 events held; and the sweep after it. Then steady sweeps
    of two fleets with no history (2,000 VMs and 10), for the model's base + per VM, which
    a retention backlog must not skew; then heartbeats of the big fleet."""
    sweep_at = fleets.now + timedelta(minutes=2)  # every VM heard 2 minutes ago: none silent
    first, first_s, after, _ = _sweeps(connection_string, fleets.big, sweep_at)
    _, _, quiet, quiet_s = _sweeps(connection_string, fleets.quiet, sweep_at, after=5)
    _, _, small, small_s = _sweeps(connection_string, fleets.small, sweep_at, after=5)
    span = fleets.quiet_vms - 10
    per_vm = max(0.0, (quiet - small) / span) if span > 0 else 0.0
    per_vm_s = max(0.0, (quiet_s - small_s) / span) if span > 0 else 0.0
    heartbeat = heartbeats(
        connection_string, fleets.big, fleets.vms, fleets.now + timedelta(minutes=1)
    )
    junk = junk_sweep(connection_string, fleets.big, sweep_at, junk_rows)
    return {
        **junk,
        "watchdog_requests_10k": first,
        "watchdog_fleet": fleets.vms,
        "watchdog_sweep_s": round(first_s, 2),
        "watchdog_requests_next_sweep": after,
        f"watchdog_requests_quiet_{fleets.quiet_vms}": quiet,
        "watchdog_requests_quiet_10": small,
        **{k: v for k, v in heartbeat.items() if not k.startswith("_")},
        "_counts": {
            "watchdog_requests_per_sweep_base": max(0.0, small - per_vm * 10),
            "watchdog_requests_per_sweep_per_vm": per_vm,
            "watchdog_seconds_per_sweep_base": max(0.0, small_s - per_vm_s * 10),
            "watchdog_seconds_per_sweep_per_vm": per_vm_s,
            **heartbeat["_counts"],
        },
    }


def fleet(prefix: str, vms: int, ended: int, now: datetime) -> tuple[list[Work], list[Work]]:
    """(first, then): `ended` VMs each report an event 40 days ago and then its end; then
    every VM's heartbeat `now`, in batches as the trigger gets them."""
    long_ago = now - timedelta(days=40)
    names = [name64(prefix, i) for i in range(vms)]
    past: list[Work] = []
    for name in names[:ended]:
        event = [reboot(str(uuid.uuid4()).upper(), [name], "Scheduled", long_ago)]
        bodies = [
            envelope(name, 1, event, long_ago - timedelta(minutes=10)),
            envelope(name, 2, [], long_ago),
        ]
        past.append((prefix, long_ago.isoformat(), "session", bodies))
    size = max(1, heartbeat_batch_size())
    beats = [envelope(n, 3, None, now) for n in names]
    present: list[Work] = [
        (prefix, now.isoformat(), "heartbeats", beats[i : i + size])
        for i in range(0, len(beats), size)
    ]
    return past, present


class Fleets(BaseModel):
    big: str
    quiet: str
    small: str
    quiet_vms: int
    vms: int
    ended: int
    now: datetime


def seed_fleets(connection_string: str, vms: int, ended: int, active: int = 5) -> Fleets:
    """The watchdog's fleets, seeded and ready to sweep: the issue's (`vms` VMs, `ended`
    old events) and two without history (2,000 VMs and 10), each with `active` held events."""
    run_id = uuid.uuid4().hex[:6]
    now = datetime.now(UTC).replace(microsecond=0)
    sizes = {
        f"benchwd{run_id}": (vms, ended),
        f"benchwq{run_id}": (min(2000, vms), 0),
        f"benchws{run_id}": (10, 0),
    }
    past: list[Work] = []
    present: list[Work] = []
    for prefix, (size, old) in sizes.items():
        earlier, later = fleet(prefix, size, old, now)
        past += earlier
        present += later
    seed(connection_string, past)  # the past first: ended, then heard
    seed(connection_string, present)
    for prefix, (size, _) in sizes.items():
        _hold_events(connection_string, prefix, size, active, now + timedelta(seconds=1))
    big, quiet, small = sizes
    return Fleets(
        big=big, quiet=quiet, small=small, quiet_vms=sizes[quiet][0], vms=vms, ended=ended, now=now
    )


def _hold_events(connection_string: str, prefix: str, vms: int, active: int, at: datetime) -> None:
    """`active` events held until an hour from now, each reported by one VM through ingest
    (decided, audited and announced as for real)."""
    from functions.pipeline.ingest import ingest_message
    from functions.pipeline.publish import LocalPublisher

    pipeline = make_pipeline(connection_string, prefix, LocalPublisher(), FixedClock(at))
    for k in range(min(active, vms)):
        name = name64(prefix, vms - 1 - k)
        held = [reboot(str(uuid.uuid4()).upper(), [name], "Scheduled", at + timedelta(hours=1))]
        if ingest_message(envelope(name, 4, held, at), pipeline).outcome != "processed":
            raise RuntimeError(f"seeding: the held event of {name} was not processed")


def _sweeps(
    connection_string: str, prefix: str, at: datetime, after: int = 1
) -> tuple[int, float, int, float]:
    """(requests, seconds) of a first sweep and of the sweep after it. With `after` > 1,
    that many sweeps follow the first and the fastest is reported: a steady sweep's time
    feeds the model's per-VM fit, a difference of a few milliseconds that one sample on
    a busy machine can swamp."""
    from functions.pipeline.publish import LocalPublisher
    from functions.pipeline.watchdog import run_watchdog

    with WireCounter(connection_string) as wire:
        pipeline = make_pipeline(wire.connection_string, prefix, LocalPublisher(), FixedClock(at))
        # The sweep finds and hands each due event to the work queue (issue 37): its own
        # requests are what is counted here; each event's reconcile is a unit of work of
        # its own, counted per event by the wave phase (wave_table_requests_per_event).
        pipeline.work_queue = Handed()
        out: list[tuple[int, float]] = []
        for _ in range(1 + after):
            wire.reset()
            report, seconds = _timed(lambda: run_watchdog(pipeline))
            if report.silent or report.overdue or report.ended:
                raise RuntimeError(f"watchdog: the seeded fleet should be quiet: {report}")
            out.append((wire.total(), seconds))
    (first, first_s), steady = out[0], out[1:]
    return first, first_s, steady[0][0], min(seconds for _, seconds in steady)


class Handed:
    """A work queue that keeps the keys the sweep hands it (functions.pipeline.workqueue)."""

    def __init__(self) -> None:
        self.keys: list[str] = []

    def enqueue(self, keys: list[str], now: datetime, *, sweep: bool = False) -> int:
        self.keys += keys
        return len(keys)


def junk_sweep(
    connection_string: str, prefix: str, at: datetime, rows: int = JUNK_ROWS
) -> dict[str, Any]:
    """Issue 27: `rows` well-formed liveness rows no VM's key made (random vmIds, an
    attacker's key, key-derived-looking RowKeys, all silent) added to the big fleet's
    liveness table, then one sweep with the real verifier (the identities table the
    fleet's enrolment wrote): its Table requests, and how many junk rows it deleted."""
    import hashlib
    import secrets

    from azure.data.tables import EdmType, EntityProperty, TableClient

    from functions.identity.keys import liveness_signature
    from functions.identity.registry import IdentityStore
    from functions.pipeline.liveness_verifier import RegistryVerifier
    from functions.pipeline.watchdog import run_watchdog
    from tests.bench.attested import APP_SECRET

    key = b"junk" * 8
    kid = hashlib.sha256(key).hexdigest()[:16]
    unix = int((at - timedelta(hours=1)).timestamp())
    by_partition: dict[str, list[dict[str, Any]]] = {}
    for _ in range(rows):
        vm_id, row = str(uuid.uuid4()), secrets.token_hex(32)
        pk = f"lv{int(row[:8], 16) % 8:02d}"
        by_partition.setdefault(pk, []).append(
            {
                "PartitionKey": pk,
                "RowKey": row,
                "vm_id": vm_id,
                "seen": datetime.fromtimestamp(unix, UTC),
                "at": EntityProperty(unix, EdmType.INT64),
                "relay_version": "junk",
                "key_id": kid,
                "sig": liveness_signature(key, vm_id, unix, "junk"),
            }
        )
    table = TableClient.from_connection_string(connection_string, f"{prefix}liveness")
    # Inserts, not upserts: Azurite (LokiJS) looks each entity up by scanning its
    # partition, once for an insert and twice for an upsert, so 100,000 rows in 8
    # partitions cost it time quadratic in the rows; the RowKeys are random (no conflict).
    batches = [
        [("create", r) for r in chunk[i : i + 100]]
        for chunk in by_partition.values()
        for i in range(0, len(chunk), 100)
    ]

    def insert(batch: list[Any]) -> None:
        for attempt in range(5):  # Azurite resets a connection now and then under load
            try:
                table.submit_transaction(batch)
                return
            except (ServiceRequestError, ServiceResponseError):
                if attempt == 4:
                    raise
                time.sleep(0.5)
            except TableTransactionError as exc:
                # A transaction whose answer the reset lost was applied: its rows exist.
                if attempt == 0 or exc.error_code != "EntityAlreadyExists":
                    raise
                return

    with ThreadPoolExecutor(max_workers=4) as pool:
        list(pool.map(insert, batches))
    with WireCounter(connection_string) as wire:
        pipeline = make_pipeline(wire.connection_string, prefix, LocalPublisher(), FixedClock(at))
        secret = APP_SECRET.encode() if isinstance(APP_SECRET, str) else APP_SECRET
        registry = IdentityStore.from_service(pipeline.store.service, secret, prefix)
        pipeline.liveness_verifier = RegistryVerifier(registry)
        pipeline.work_queue = Handed()  # the sweep's own requests (as in _sweeps)
        wire.reset()
        report, seconds = _timed(lambda: run_watchdog(pipeline))
        requests_total = wire.total()
        by_kind = wire.by_kind()
    left = sum(1 for _ in table.list_entities(select=["RowKey"]))
    # The key is the sweep's own cost, as WatchdogReport counts it: the retention deletes
    # of the fleet's 40-day-old events (bounded by RETENTION_EVENTS_PER_SWEEP, whatever
    # the liveness table holds) are reported beside it.
    return {
        "watchdog_requests_10k_junk": requests_total - report.retention_requests,
        "watchdog_junk_sweep_total_requests": requests_total,
        "watchdog_junk_retention_requests": report.retention_requests,
        "watchdog_junk_rows": rows,
        "watchdog_junk_deleted_per_sweep": rows - left,
        "watchdog_junk_sweep_s": round(seconds, 2),
        "watchdog_junk_silent": len(report.silent),
        "watchdog_junk_requests_by_kind": by_kind,
    }


# --------------------------------------------------------------------------- heartbeats


def heartbeats(
    connection_string: str, prefix: str, vms: int, at: datetime, sample: int = 400
) -> dict[str, Any]:
    """Heartbeats of `sample` known VMs, received as the app receives them (see
    receive_heartbeats), 16 executions at a time."""
    names = [name64(prefix, i) for i in range(min(sample, vms))]
    bodies = [envelope(n, 10, None, at) for n in names]
    size = 1
    with WireCounter(connection_string) as wire, LogMeter() as meter:
        pipeline = make_pipeline(wire.connection_string, prefix, LocalPublisher(), FixedClock(at))
        on_sessions = batch_handler() is None
        size = 1 if on_sessions else max(1, heartbeat_batch_size())
        batches = [bodies[i : i + size] for i in range(0, len(bodies), size)]
        wire.reset()
        meter.reset()
        with ThreadPoolExecutor(max_workers=16) as pool:
            timed = list(
                pool.map(lambda b: _timed(lambda: receive_heartbeats(b, pipeline)), batches)
            )
        executions = sum(result[0] for result, _ in timed)
        count = len(bodies)
        return {
            "table_requests_per_heartbeat": round(wire.total() / count, 3),
            "_counts": {
                "heartbeats_per_execution": count / executions,
                "heartbeats_on_sessions": on_sessions,
                "table_requests_per_heartbeat": wire.total() / count,
                "table_entities_per_heartbeat": wire.entities() / count,
                "seconds_per_heartbeat_execution": statistics.fmean(s for _, s in timed),
                "log_bytes_per_heartbeat_execution": meter.telemetry_bytes() / executions,
                "hot_partition_share": wire.hottest_partition_share(),
            },
        }


# --------------------------------------------------------------------------- counts


def topic_subscriptions() -> list[str]:
    """The notifications topic's subscriptions, as the Bicep creates them."""
    bicep = (ROOT / "infra" / "modules" / "servicebus.bicep").read_text()
    block = re.search(r"var subscriptionNames = \[(.*?)\]", bicep, re.DOTALL)
    if block is None:
        raise RuntimeError("servicebus.bicep: no subscriptionNames list")
    return re.findall(r"'([^']+)'", block.group(1))


ASSUMED = {
    "topic_subscriptions": "read from infra/modules/servicebus.bicep (subscriptionNames)",
    "servicebus_operations_per_message": "send, receive and complete are each an operation "
    "(https://azure.microsoft.com/pricing/details/service-bus/: any API call); not measurable "
    "without Service Bus",
    "servicebus_credits_per_message": "a send and a receive cost 1 credit each "
    "(https://learn.microsoft.com/azure/service-bus-messaging/service-bus-throttling)",
    "platform_log_bytes_per_execution": "the host's request row and its Executing/Executed "
    "traces (sampling excludes Request in host.json); not measurable without Azure",
    "log_bytes": f"the app's log lines at Information and above, measured, plus "
    f"{TRACE_ROW_BYTES} bytes of columns per line (assumed)",
}


def build_counts(measured: dict[str, Any], measured_by: str) -> Any:
    from functions.cost.counts import Counts

    return Counts(
        measured_at=datetime.now(UTC).replace(microsecond=0),
        measured_by=measured_by,
        topic_subscriptions=len(topic_subscriptions()),
        servicebus_operations_per_message=3,
        servicebus_credits_per_message=2,
        platform_log_bytes_per_execution=PLATFORM_BYTES_PER_EXECUTION,
        assumed=ASSUMED,
        **measured,
    )


def cost_keys(counts: Any) -> dict[str, Any]:
    """The model's verdict on the counts just measured: 10,000 VMs, default workload."""
    from functions.cost.model import Workload, estimate, load_deployment
    from functions.cost.prices import load_prices

    result = estimate(Workload(vms=10_000), load_deployment(), counts, load_prices())
    return {
        "cost_usd_per_vm_month_10k": round(result.usd_per_vm_month, 4),
        "capacity_vms": int(min(result.capacity_vms, 10**9)),
        "capacity_bound_by": result.bound_by,
    }
