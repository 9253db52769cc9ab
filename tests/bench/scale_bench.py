"""Fleet-scale numbers for issue 11, and the per-operation counts the cost model reads.

Everything goes through the code's own entry points (ingest_message, run_watchdog) against
Azurite, with Table requests counted by a proxy in front of it (tests/bench/wire.py), so
the numbers follow whatever the store does on the wire: a layout change needs no change
here.

- set200: 200 VMs of one availability set (64-character names) report one event through
  Scheduled, Started and gone, 16 at a time: Table requests per document.
- watchdog: a fleet heard recently, events that ended before the retention, a few active
  events; Table requests of one sweep, then of a steady sweep at 10 and at that many VMs
  (the fit base + per-VM the model uses).
- heartbeats: what one heartbeat costs as the function app receives it.
"""

from __future__ import annotations

import logging
import multiprocessing
import statistics
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from typing import Any

import requests

from tests.bench.wire import WireCounter

TRACE_ROW_BYTES = 250  # columns Application Insights stores around each log line (assumed)
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
    """Bytes the app logs at Information and above (what reaches Log Analytics as traces)."""

    def __init__(self) -> None:
        super().__init__(level=logging.INFO)
        self.records = 0
        self.bytes = 0
        self._meter_lock = threading.Lock()

    def emit(self, record: logging.LogRecord) -> None:
        size = len(record.getMessage().encode("utf-8", "replace"))
        with self._meter_lock:
            self.records += 1
            self.bytes += size

    def reset(self) -> None:
        with self._meter_lock:
            self.records = self.bytes = 0

    def telemetry_bytes(self) -> int:
        return self.bytes + self.records * TRACE_ROW_BYTES

    def __enter__(self) -> LogMeter:
        logger = logging.getLogger("functions")
        self._old_level = logger.level
        logger.setLevel(logging.INFO)
        logger.addHandler(self)
        return self

    def __exit__(self, *exc: object) -> None:
        logger = logging.getLogger("functions")
        logger.removeHandler(self)
        logger.setLevel(self._old_level)


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
    from functions.model.envelope import Envelope, VmRef

    return Envelope(
        kind="heartbeat" if events is None else "document",
        vm=VmRef(name=vm, availability_set=aset),
        relay_version="bench",
        sequence=sequence,
        observed_at=observed_at,
        document=None if events is None else {"DocumentIncarnation": sequence, "Events": events},
    ).to_json()


def make_pipeline(connection_string: str, prefix: str, publisher: Any, clock: Any) -> Any:
    from functions.pipeline.context import Pipeline
    from functions.settings import load_settings
    from functions.store.tables import Store

    settings = load_settings(
        state_storage=connection_string, relay_key=uuid.uuid4().hex, state_table_prefix=prefix
    )
    store = Store.from_settings(settings).ensure_tables()
    return Pipeline(store, settings, publisher, requests.Session(), clock)


Row = tuple[str, str, str, str]  # (kind "vm" | "ended", table prefix, VM name, ISO time)


def seed(connection_string: str, rows: list[Row], processes: int = 2, threads: int = 8) -> None:
    """Write a fleet's rows through the store's own API (so they follow its layout), spread
    over processes and threads. Not counted: this is the state a sweep finds, not work."""
    if not rows:
        return
    context = multiprocessing.get_context("spawn")
    shares = [(connection_string, rows[i::processes], threads) for i in range(processes)]
    with ProcessPoolExecutor(max_workers=processes, mp_context=context) as pool:
        list(pool.map(_seed_worker, shares, timeout=900))


def _seed_worker(args: tuple[str, list[Row], int]) -> None:
    from functions.model.event import Decision
    from functions.store.records import EventRecord, VmRecord
    from functions.store.tables import Store

    connection_string, rows, threads = args
    stores = {
        prefix: Store.from_connection_string(connection_string, prefix).ensure_tables()
        for prefix in {prefix for _, prefix, _, _ in rows}
    }

    def write(row: Row) -> None:
        kind, prefix, name, at_text = row
        store, at = stores[prefix], datetime.fromisoformat(at_text)
        if kind == "vm":  # heard at `at`, as a relay's document would leave it
            vm = VmRecord(name=name, last_sequence=3, last_observed_at=at, last_seen=at)
            store.mutate_vm(name, lambda current: vm if current is None else None, known=None)
            return
        # An event on this VM that was held, then cancelled at `at` (before the retention).
        event_id = str(uuid.uuid5(uuid.NAMESPACE_URL, f"{prefix}/{name}")).upper()
        decision = Decision(action="hold", rule="default-hold", reason="bench")
        record = EventRecord(
            event_id=event_id,
            event_type="Reboot",
            event_status="Scheduled",
            event_source="Platform",
            resources=[name],
            not_before=at + timedelta(minutes=15),
            first_seen=at - timedelta(minutes=5),
            past_reporters=[name],
            ended="cancelled",
            ended_at=at,
            decision=decision,
            decided_at=at - timedelta(minutes=5),
            announced={"scheduled": "done", "decided": "done", "cancelled": "done"},
        )
        store.mutate_event(event_id, lambda current: record if current is None else None, None)
        store.audit(
            event_id,
            at=at - timedelta(minutes=5),
            rule="default-hold",
            action="hold",
            outcome="held",
        )

    with ThreadPoolExecutor(max_workers=threads) as pool:
        list(pool.map(write, rows))


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
        out["set200_requests_by_kind"] = big["requests_by_kind"]
    except Exception as exc:
        out["table_requests_per_doc_set200"] = None
        code = getattr(exc, "error_code", None) or str(exc).splitlines()[0][:100]
        out["set200_error"] = f"{type(exc).__name__}: {code}"
    small = reporters(connection_string, 20)
    out["table_requests_per_doc_set20"] = small["table_requests_per_doc"]
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
        first = [
            envelope(n, 1, [], now, aset) for n in names
        ]  # the set is known, as in steady state
        with ThreadPoolExecutor(max_workers=workers) as pool:
            list(pool.map(lambda body: ingest_message(body, pipeline), first))
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
        vm_bytes, vm_writes = wire.bytes_written("vms")
        event_bytes, event_writes = wire.bytes_written("events")
        audit_bytes, _ = wire.bytes_written("audit")
        log_bytes = meter.telemetry_bytes()
        by_kind = wire.by_kind()
    if outcomes.count("processed") != len(outcomes):
        raise RuntimeError(f"not every document was processed: {sorted(set(outcomes))}")
    return {
        "table_requests_per_doc": round(requests_total / documents, 2),
        "requests_by_kind": by_kind,
        "_counts": {
            "table_requests_per_document": requests_total / documents,
            "table_entities_per_document": entities / documents,
            "seconds_per_document": statistics.fmean(durations),
            "log_bytes_per_document": log_bytes / documents,
            "notifications_per_event": len(publisher.transitions(event_id)),
            "table_bytes_per_vm": vm_bytes / vm_writes if vm_writes else 0.0,
            "table_bytes_per_event": (event_bytes / event_writes if event_writes else 0.0)
            + audit_bytes,
        },
    }


# --------------------------------------------------------------------------- watchdog


def watchdog(
    connection_string: str, vms: int = 10_000, ended: int = 1_000, active: int = 5
) -> dict[str, Any]:
    """One sweep with `vms` VMs heard recently, `ended` events ended 40 days ago (before a
    30-day retention) and `active` events held; then a steady sweep; then the same at 10
    VMs, for the fit. Seeding goes through ingest, so it follows the store's layout."""
    run_id = uuid.uuid4().hex[:6]
    now = datetime.now(UTC).replace(microsecond=0)
    big, small = f"benchwd{run_id}", f"benchws{run_id}"
    seed(connection_string, _fleet(big, vms, ended, now) + _fleet(small, 10, 0, now))
    for prefix, size in ((big, vms), (small, 10)):
        _hold_events(connection_string, prefix, size, active, now + timedelta(seconds=1))
    sweep_at = now + timedelta(minutes=2)  # every VM heard 2 minutes ago: none is silent
    first, first_s, steady, steady_s = _sweeps(connection_string, big, sweep_at)
    _, _, small_steady, small_s = _sweeps(connection_string, small, sweep_at)
    per_vm = max(0.0, (steady - small_steady) / (vms - 10))
    per_vm_s = max(0.0, (steady_s - small_s) / (vms - 10))
    heartbeat = heartbeats(connection_string, big, vms, now + timedelta(minutes=1))
    return {
        "watchdog_requests_10k": first,
        "watchdog_fleet": vms,
        "watchdog_sweep_s": round(first_s, 2),
        "watchdog_requests_steady": steady,
        "watchdog_requests_10_vms": small_steady,
        **{k: v for k, v in heartbeat.items() if not k.startswith("_")},
        "_counts": {
            "watchdog_requests_per_sweep_base": max(0.0, small_steady - per_vm * 10),
            "watchdog_requests_per_sweep_per_vm": per_vm,
            "watchdog_seconds_per_sweep_base": max(0.0, small_s - per_vm_s * 10),
            "watchdog_seconds_per_sweep_per_vm": per_vm_s,
            **heartbeat["_counts"],
        },
    }


def _fleet(prefix: str, vms: int, ended: int, now: datetime) -> list[Row]:
    """Every VM heard `now`; `ended` events (one per VM) ended 40 days ago."""
    long_ago = (now - timedelta(days=40)).isoformat()
    names = [name64(prefix, i) for i in range(vms)]
    return [("vm", prefix, n, now.isoformat()) for n in names] + [
        ("ended", prefix, n, long_ago) for n in names[:ended]
    ]


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


def _sweeps(connection_string: str, prefix: str, at: datetime) -> tuple[int, float, int, float]:
    """(requests, seconds) of a first sweep and of the sweep after it."""
    from functions.pipeline.publish import LocalPublisher
    from functions.pipeline.watchdog import run_watchdog

    with WireCounter(connection_string) as wire:
        pipeline = make_pipeline(wire.connection_string, prefix, LocalPublisher(), FixedClock(at))
        out: list[float] = []
        for _ in range(2):
            wire.reset()
            report, seconds = _timed(lambda: run_watchdog(pipeline))
            if report.silent or report.overdue or report.ended:
                raise RuntimeError(f"watchdog: the seeded fleet should be quiet: {report}")
            out += [wire.total(), seconds]
    return int(out[0]), out[1], int(out[2]), out[3]


# --------------------------------------------------------------------------- heartbeats


def heartbeats(
    connection_string: str, prefix: str, vms: int, at: datetime, sample: int = 400
) -> dict[str, Any]:
    """Heartbeats of `sample` known VMs, received as the app receives them today: one
    message per execution on the documents queue (sessions on)."""
    from functions.pipeline.ingest import ingest_message
    from functions.pipeline.publish import LocalPublisher

    names = [name64(prefix, i) for i in range(min(sample, vms))]
    bodies = [envelope(n, 10, None, at) for n in names]
    with WireCounter(connection_string) as wire, LogMeter() as meter:
        pipeline = make_pipeline(wire.connection_string, prefix, LocalPublisher(), FixedClock(at))
        wire.reset()
        with ThreadPoolExecutor(max_workers=16) as pool:
            timed = list(pool.map(lambda b: _timed(lambda: ingest_message(b, pipeline)), bodies))
        if any(result.outcome != "processed" for result, _ in timed):
            raise RuntimeError("heartbeats: not every heartbeat was processed")
        count = len(bodies)
        executions = count  # one message, one execution
        return {
            "table_requests_per_heartbeat": round(wire.total() / count, 2),
            "_counts": {
                "heartbeats_per_execution": count / executions,
                "heartbeats_on_sessions": True,
                "table_requests_per_heartbeat": wire.total() / count,
                "table_entities_per_heartbeat": wire.entities() / count,
                "seconds_per_heartbeat_execution": statistics.fmean(s for _, s in timed),
                "log_bytes_per_heartbeat_execution": meter.telemetry_bytes() / executions,
                "hot_partition_share": wire.hottest_partition_share(),
            },
        }


# --------------------------------------------------------------------------- counts


ASSUMED = {
    "topic_subscriptions": "infra/modules/servicebus.bicep: teams, pagerduty, webhook, terminate",
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
        topic_subscriptions=4,
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
