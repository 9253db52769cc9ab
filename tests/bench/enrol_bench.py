"""`enrol_100k_s` and `resource_graph_queries_100k`: a fleet enrolled by the bulk sync.

100,000 VMs (80 % standalone in `resources`, 20 % uniform scale-set instances in
`computeresources`) are served by the simulator's Resource Graph over HTTP, with Azure's
page size (1,000 rows, `$skipToken`) and quota (15 queries per 5-second window, its
`x-ms-user-quota-*` headers, 429 beyond); functions.identity.sync pages them into the
identities table on Azurite, every row written for real (entity group transactions).

How `enrol_100k_s` is computed, exactly:

    enrol = elapsed + quota_waits + timer_gaps

- `elapsed`: measured wall time of the pass here: HTTP to the simulator, which holds each
  answer ASSUMED_AZURE_SECONDS_PER_QUERY (2 s, what a 1,000-row Resource Graph page might
  take in Azure: not measured, no Azure here; an assumption on the slow side), building the
  facts, and every Table write to Azurite (the sync asks for the next page while it writes
  the current one, 8 partitions in parallel);
- `quota_waits`: the seconds the sync slept for the quota. The quota's clock is the sync's
  own simulated clock, which advances only by those sleeps: no real time counts toward the
  5-second windows, so this over-states the wait (in Azure, the seconds spent writing a
  page also count toward the next window);
- `timer_gaps`: the timer runs every 5 minutes and each run works at most
  RESOURCE_GRAPH_SYNC_BUDGET_SECONDS (240 s), so a pass longer than that waits
  60 s between runs: (runs - 1) * 60 s.

Run alone: `python -m tests.bench.enrol_bench [--vms N]` (prints one JSON line).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import requests

ASSUMED_AZURE_SECONDS_PER_QUERY = 2.0
TIMER_SECONDS = 300
SUB = "bbbbbbbb-0000-4000-8000-000000000000"
BASE = f"/subscriptions/{SUB}/resourceGroups/fleet/providers"


def inventory(vms: int, uniform_share: float = 0.2) -> list[dict[str, Any]]:
    from simulator.resource_graph import vm_row

    rows = []
    uniform = int(vms * uniform_share)
    for i in range(vms):
        vm_id = f"{i:08x}-{uuid.uuid4().hex[:4]}-4000-8000-000000000000"
        address = f"10.{i // 65536 % 256}.{i // 256 % 256}.{i % 256}"
        if i < uniform:
            scale_set = f"{BASE}/Microsoft.Compute/virtualMachineScaleSets/ss{i // 1000}"
            rid = f"{scale_set}/virtualMachines/{i}"
            table, nic = "computeresources", f"{rid}/networkInterfaces/nic"
        else:
            rid = f"{BASE}/Microsoft.Compute/virtualMachines/vm{i:06d}"
            table, nic = "resources", f"{BASE}/Microsoft.Network/networkInterfaces/vm{i:06d}-nic"
        rows.append(
            vm_row(
                table=table,
                resource_id=rid,
                subscription_id=SUB,
                resource_group="fleet",
                vm_id=vm_id,
                nic_id=nic,
                address=address,
            )
        )
    return rows


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def run(connection_string: str, vms: int = 100_000) -> dict[str, Any]:
    from azure.data.tables import TableServiceClient

    from functions.identity.facts import ResourceGraphResolver
    from functions.identity.registry import IdentityStore
    from functions.identity.sync import sync_identities
    from functions.settings import Settings
    from simulator import Simulator, SimulatorServer
    from tests.identity.test_facts import SimulatorCredential

    rows = inventory(vms)
    server = SimulatorServer(Simulator(time_scale=60.0)).start()
    try:
        quota_clock = _Clock()
        server.arm.graph.inventory = lambda: rows
        server.arm.graph.clock = quota_clock
        server.arm.graph.latency = ASSUMED_AZURE_SECONDS_PER_QUERY
        service = TableServiceClient.from_connection_string(connection_string)
        store = IdentityStore.from_service(
            service, b"B" * 40, prefix="enrol" + uuid.uuid4().hex[:8]
        ).ensure_table()
        resolver = ResourceGraphResolver(
            requests.Session(), SimulatorCredential(server), server.arm_url, subscriptions=[SUB]
        )
        began = time.monotonic()
        report = sync_identities(
            resolver.graph,
            store.table,
            lambda: datetime.now(UTC),
            every=timedelta(hours=3),
            budget_seconds=10**9,  # one continuous pass; the timer's runs are added below
            sleep=quota_clock.sleep,
            monotonic=lambda: time.monotonic() + quota_clock.now,
        )
        elapsed = time.monotonic() - began
        throttled = sum(1 for c in server.arm.calls if c.status == 429)
        # Spot-check: a sample of VMs is stored with Azure's facts.
        for row in rows[:: max(1, vms // 50)]:
            identity = store.get(row["vmId"])
            assert identity is not None and identity.facts.resource_id == row["id"], row["id"]
    finally:
        server.stop()
    assert report.finished_pass and report.vms_written == vms, report
    budget = Settings().resource_graph_sync_budget_seconds
    working = elapsed + report.waited_seconds
    runs = max(1, math.ceil(working / budget))
    enrol = working + (runs - 1) * (TIMER_SECONDS - budget)
    return {
        "enrol_100k_s": round(enrol, 1),
        "resource_graph_queries_100k": report.queries,
        "_enrol": {
            "vms": vms,
            "measured_elapsed_s": round(elapsed, 1),
            "quota_waits_s": round(report.waited_seconds, 1),
            "quota_waits": report.quota_waits,
            "assumed_azure_s_per_query": ASSUMED_AZURE_SECONDS_PER_QUERY,
            "timer_runs": runs,
            "table_requests": report.table_requests,
            "throttled_429": throttled,
            "pages": report.pages,
        },
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.enrol_bench")
    parser.add_argument("--vms", type=int, default=100_000)
    args = parser.parse_args(argv)
    from local.azurite import Azurite

    with Azurite() as azurite:
        print(json.dumps(run(azurite.connection_string, args.vms)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
