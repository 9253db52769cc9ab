"""Phase `calibration`: how fast this machine is, measured beside the figures (issue 47).

On another 2-core machine of the same kind the same bench took twice as long and missed
three targets; a figure that depends on speed says little without the speed. Two numbers,
first and with the machine to itself (as ingest):

- `calibration_python_loop_s`: the wall time of a fixed pure-Python loop (the fastest of
  three): the CPU the app, the relays and the harness get;
- `calibration_azurite_requests_per_s`: Table requests a fresh Azurite answers one after
  another (an upsert and a point read per row, one client): the emulator's speed, which
  bounds every phase on Azurite.

docs/benchmarks.md says which targets depend on speed. Both are reported, not targeted.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from tests.bench.runner import Bench, Phase

LOOP = 3_000_000  # iterations of the fixed loop (about 0.5 s on the build machine)
ROWS = 300  # rows written and read back on Azurite


def python_loop_s() -> float:
    """The fastest of three runs of the same pure-Python loop, in seconds."""
    best = float("inf")
    for _ in range(3):
        began = time.perf_counter()
        total, seen = 0, {}
        for i in range(LOOP):
            total += i * i % 7
            if i % 1024 == 0:
                seen[i] = total
        best = min(best, time.perf_counter() - began)
    return best


def azurite_requests_per_s(connection_string: str) -> float:
    """Upserts and point reads, one after another, of ROWS small rows (after a warm-up)."""
    from azure.data.tables import TableServiceClient

    service = TableServiceClient.from_connection_string(connection_string)
    table = service.create_table_if_not_exists("calib" + uuid.uuid4().hex[:8])
    for i in range(20):  # the emulator's first requests are slower (its JIT): not counted
        table.upsert_entity({"PartitionKey": "warm", "RowKey": str(i), "n": i})
    began = time.perf_counter()
    for i in range(ROWS):
        table.upsert_entity({"PartitionKey": "p", "RowKey": f"{i:05d}", "n": i})
        table.get_entity("p", f"{i:05d}")
    return 2 * ROWS / (time.perf_counter() - began)


def _calibration(bench: Bench) -> dict[str, Any]:
    return {
        "calibration_python_loop_s": round(python_loop_s(), 3),
        "calibration_azurite_requests_per_s": round(
            azurite_requests_per_s(bench.azurite("calibration")), 1
        ),
    }


PHASE = Phase(
    "calibration",
    lambda a: "calibration: a fixed Python loop, and Azurite's request rate",
    _calibration,
    azurite="calibration",
    alone=True,
)
