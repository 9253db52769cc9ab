"""Phase `chaos` (tests/chaos, issue 40): the demo's whole stack under injected faults, each
run compared with the fault-free run of its plan, in processes of its own beside every
other phase but ingest (it mostly waits: its plans play at 20x real time)."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

from tests.bench.runner import Bench, Phase


def _chaos_phase(bench: Bench) -> dict[str, Any]:
    """The chaos suite (tests/chaos) in processes of its own; its table on stderr."""
    argv = [sys.executable, "-m", "tests.chaos", "--json", "--jobs", str(bench.args.chaos_jobs)]
    if bench.args.quick:
        argv.append("--quick")
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    table_lines = [line for line in done.stdout.splitlines() if not line.startswith("{")]
    print("\n".join(table_lines), file=sys.stderr, flush=True)
    found = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if not found:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return {"chaos_runs": 0, "chaos_divergent": 1, "_chaos_error": tail}
    numbers = json.loads(found[-1])
    keys = ("chaos_runs", "chaos_divergent", "chaos_faults_not_fired")
    return {key: numbers[key] for key in keys}


PHASE = Phase(
    "chaos",
    lambda a: f"chaos suite: the demo's stack under faults, {a.chaos_jobs} processes",
    _chaos_phase,
    # The fault-free run of each plan against its faulted runs (allowed exceptions aside:
    # docs/operations.md).
    targets={
        "chaos_runs": (">=", 10),
        "chaos_divergent": ("==", 0),
        # Issue 47: a run whose fault touched nothing tested nothing (divergent too).
        "chaos_faults_not_fired": ("==", 0),
    },
    sized=("chaos_runs",),
    background=True,
)
