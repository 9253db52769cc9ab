"""Fleet-scale numbers for issue 11, and the per-operation counts the cost model reads.

- set200: 200 VMs of one availability set (64-character names) report one event through
  Scheduled, Started and gone, 16 at a time: Table requests per document.
  A set of 20 gives the model's per-document counts and stored bytes.
- the counts (build_counts) gather these, the watchdog's and the heartbeats'
  (tests/bench/watchdog_bench.py) and the relays' with what is assumed, and cost_keys is
  the model's verdict on them.

Everything goes through the code's own entry points against Azurite, with Table requests
counted on the wire (tests/bench/fleet_harness.py, the harness the fleet benches share).
"""

from __future__ import annotations

import re
import statistics
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from typing import Any

from tests.bench.documents import reboot
from tests.bench.fleet_harness import (
    ROOT,
    TRACE_ROW_BYTES,
    FixedClock,
    LogMeter,
    envelope,
    make_pipeline,
    name64,
    time_call,
)
from tests.bench.wire import WireCounter

PLATFORM_BYTES_PER_EXECUTION = 1000  # the host's request row and its two trace lines (assumed)


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
                    pool.map(lambda b: time_call(lambda: ingest_message(b, pipeline)), bodies)
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
