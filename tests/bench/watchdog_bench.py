"""The watchdog at fleet scale for issue 11 and 27, and what a heartbeat costs.

- watchdog: 10,000 VMs heard recently, 1,000 events that ended before the retention, 5
  held events: Table requests of one sweep (and the next); steady sweeps of fleets with
  no history (2,000 and 10 VMs) give the model's base + per VM; then one sweep over
  100,000 junk liveness rows (junk_sweep).
- heartbeats: what one heartbeat costs as the function app receives it (its batch
  handler where it has one, else one execution each on the session queue).

The fleets are seeded (seed_fleets) before the sweeps, beside other phases; the shared
harness is tests/bench/fleet_harness.py, and the counts these give the cost model are
assembled in tests/bench/scale_bench.py.
"""

from __future__ import annotations

import statistics
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from typing import Any

from azure.core.exceptions import ServiceRequestError, ServiceResponseError
from azure.data.tables import TableTransactionError
from pydantic import BaseModel

from functions.pipeline.publish import LocalPublisher
from tests.bench.documents import reboot
from tests.bench.fleet_harness import (
    FixedClock,
    LogMeter,
    Work,
    batch_handler,
    envelope,
    heartbeat_batch_size,
    make_pipeline,
    name64,
    receive_heartbeats,
    seed,
    time_call,
)
from tests.bench.wire import WireCounter
from tests.functions.conftest import Handed

JUNK_ROWS = 100_000  # issue 27: junk liveness rows beside the 10,000-VM fleet


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
            report, seconds = time_call(lambda: run_watchdog(pipeline))
            if report.silent or report.overdue or report.ended:
                raise RuntimeError(f"watchdog: the seeded fleet should be quiet: {report}")
            out.append((wire.total(), seconds))
    (first, first_s), steady = out[0], out[1:]
    return first, first_s, steady[0][0], min(seconds for _, seconds in steady)


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
        report, seconds = time_call(lambda: run_watchdog(pipeline))
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
                pool.map(lambda b: time_call(lambda: receive_heartbeats(b, pipeline)), batches)
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
