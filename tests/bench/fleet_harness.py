"""What the fleet-scale benches share (tests/bench/scale_bench.py, watchdog_bench.py):
the clocks, the log meter, the messages a relay sends (attested, 64-character VM names),
a pipeline over Azurite, and seeding a fleet through the app's own entry points.

Everything goes through the code's own entry points (ingest_message, run_watchdog, the
heartbeat handler) against Azurite, with Table requests counted by a proxy in front of it
(tests/bench/wire.py), so the numbers follow whatever the store does on the wire: a layout
change needs no change here. Fleets are seeded through those entry points too, so they
follow the store's layout; seeding is not counted.
"""

from __future__ import annotations

import importlib
import json
import logging
import multiprocessing
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import requests
from azure.core.exceptions import ServiceRequestError, ServiceResponseError

ROOT = Path(__file__).resolve().parents[2]

TRACE_ROW_BYTES = 250  # columns Application Insights stores around each log line (assumed)


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


def time_call(call: Callable[[], Any]) -> tuple[Any, float]:
    """`call`'s value, and how many seconds it took."""
    began = time.perf_counter()
    value = call()
    return value, time.perf_counter() - began
