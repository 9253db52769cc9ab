"""Phase `fleet`: issue 11's keys at fleet scale (tests/bench/scale_bench.py,
watchdog_bench.py, set_relays.py, relay_heartbeats.py): Table requests per document at 200
reporters, documents per event across a 20-VM set of real relays, the watchdog's sweeps at
10,000 VMs, heartbeats; from these the counts the cost model reads
(functions/cost/counts.json, rewritten by a full run), the model's cost per VM-month at
10,000 VMs and its capacity ceiling."""

from __future__ import annotations

import argparse
import json
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from functions.cost.counts import COUNTS_FILE
from tests.bench.runner import Bench, Phase, progress


def seed_fleet(connection_string: str, args: argparse.Namespace) -> tuple[Any, Any]:
    """The phase's setup, measuring nothing timed (so run_phases runs it beside the crash
    points): the watchdog's fleets seeded, and the 20-VM set of real relays, whose count
    of documents does not depend on timing. Seeding is Azurite-bound and the relays
    mostly wait for their polls, so the two overlap."""
    from tests.bench import set_relays, watchdog_bench

    vms, ended = args.watchdog_vms, args.watchdog_ended
    with ThreadPoolExecutor(max_workers=1) as background:
        progress(f"watchdog: seeding {vms} VMs heard now and {ended} events ended long ago")
        fleets = background.submit(watchdog_bench.seed_fleets, connection_string, vms, ended)
        progress("documents per event: a 20-VM availability set of real relays, one event")
        relays = set_relays.run(20)
        return fleets.result(), relays


def fleet_scale(
    connection_string: str, args: argparse.Namespace, seeded_fleet: tuple[Any, Any]
) -> dict[str, Any]:
    """Issue 11's keys, and the counts the cost model reads, all from this one run, on
    the fleet `seed_fleet` seeded."""
    from tests.bench import relay_heartbeats, scale_bench, watchdog_bench

    out: dict[str, Any] = {}
    counts: dict[str, Any] = {}
    vms, ended = args.watchdog_vms, args.watchdog_ended
    seeded, relays = seeded_fleet
    out["documents_per_event_set20"] = relays.total
    counts["documents_per_event_named_vm"] = relays.per_vm[relays.named]
    counts["documents_per_event_per_setmate"] = relays.per_setmate
    progress("heartbeats: 8 real relays write signed ones into the liveness table, one a second")
    beats = relay_heartbeats.run(connection_string)
    counts.update(beats.pop("_counts"))
    out.update(beats)
    progress("reporters: 200 VMs (64-character names) of one set report one event")
    reporters = scale_bench.set200(connection_string)
    progress(f"watchdog: one sweep over {vms} VMs, {ended} events ended before the retention")
    sweep = watchdog_bench.watchdog(connection_string, seeded, args.junk_rows)
    for part in (reporters, sweep):
        counts.update(part.pop("_counts"))
        out.update(part)
    measured = scale_bench.build_counts(
        counts, "make bench --quick" if args.quick else "make bench"
    )
    out.update(scale_bench.cost_keys(measured))
    target = args.counts_out or (None if args.quick else str(COUNTS_FILE))
    if target:
        from functions.cost.counts import write_counts

        progress(f"counts written to {write_counts(measured, target)}")
    out["counts"] = json.loads(measured.model_dump_json())
    return out


def _fleet_phase(bench: Bench) -> dict[str, Any]:
    return fleet_scale(bench.azurite("state"), bench.args, bench.prepared(PHASE))


PHASE = Phase(
    "fleet",
    lambda a: "fleet scale: relays, heartbeats, 200 reporters, the watchdog's sweeps",
    _fleet_phase,
    azurite="state",
    # Issue 47: the seeding (100 s of the phase's 240 s here) runs beside the crash
    # points, which count and do not time, once the end-to-end approvals are done.
    prepare=lambda b: seed_fleet(b.azurite("state"), b.args),
    prepare_beside="crash",
    targets={
        "table_requests_per_doc_set200": ("<=", 4),
        "documents_per_event_set20": ("<=", 3),
        "watchdog_requests_10k": ("<=", 30),
        "watchdog_requests_10k_junk": ("<=", 30),  # issue 27: 100,000 junk liveness rows
        "cost_usd_per_vm_month_10k": ("<=", 0.01),
        "capacity_vms": (">=", 100000),
    },
)
