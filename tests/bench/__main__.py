"""`python -m tests.bench`: the bridge's numbers, measured on this machine with real parts.

- relay (tests/bench/relay_bench.py): detection latency at 1 s polling, the relay's memory,
  and its CPU against the seed's plain polling loop measured beside it;
- approve_e2e: a simulator change to StartRequests received by the simulator, for an
  auto-approved event, through a real relay (1 s polling), the local host, ingest, the
  policy and the signed callback, with state on Azurite;
- ingest throughput with Table storage on Azurite, one worker per Service Bus session;
- notifications per event: 100 VMs of one availability set report the same event
  concurrently, and Teams must get one post;
- the worst cost of one hostile message (tests/security/hostile.py: an issuer fan-out,
  an issuer that hangs or drips, a mesh of certificates, a bogus nonce, random vmIds, ...);
- fleet scale (tests/bench/scale_bench.py, tests/bench/watchdog_bench.py,
  tests/bench/set_relays.py, tests/bench/relay_heartbeats.py): Table requests per
  document at 200 reporters, documents per event across a 20-VM set of real relays, one
  watchdog sweep at 10,000 VMs, heartbeats (real relays writing the liveness table, and
  the Service Bus path of older relays); from these, the per-operation counts the cost
  model reads (functions/cost/counts.json, rewritten by a full run) and the model's cost
  per VM-month at 10,000 VMs and capacity ceiling;
- enrolment (tests/bench/enrol_bench.py): 100,000 VMs through the bulk identity sync with
  disruption budgets (placements and group sizes written), on an Azurite of its own, its
  requests counted and its time in Azure derived from them, with and without the budgets'
  writes, the assumed Resource Graph latency apart from the counted writes;
- calibration: a fixed Python loop and Azurite's request rate, first, beside the figures;
- the chaos suite (tests/chaos, issue 40): the demo's whole stack under injected faults,
  each run compared with the fault-free run of its plan, in processes of its own beside
  every other phase but ingest (it mostly waits: its plans play at 20x real time);
- the wave (issue 37), a wave under a disruption budget (issue 39), and the crash-point
  explorer with its invariants (tests/crash, in a process of its own).

Each measurement is a Phase (tests/bench/runner.py: its name, its progress line, a function
returning its keys, the Azurite it uses, its keys' targets), one module each under
tests/bench/phases/, registered in PHASES (tests/bench/phases/__init__.py): a new key is a
new phase, or one more key in a phase's dict. `phase_seconds` in the JSON line says where
the bench's time went.

The table is for people; the last line is one JSON object, for CI and the README.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from tests.bench.phases import PHASES
from tests.bench.phases.crash import CRASH_BENCH
from tests.bench.report import failures, table, targets_of
from tests.bench.runner import run_phases
from tests.crash.scenarios import SCENARIOS


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.bench", description=__doc__)
    # CPU time is read from /proc in 10 ms ticks; 150 s of polling keeps that under 5 %.
    parser.add_argument("--relay-seconds", type=float, default=150.0)
    parser.add_argument("--approve-samples", type=int, default=40)
    parser.add_argument("--ingest-vms", type=int, default=300)
    parser.add_argument("--ingest-processes", type=int, default=2, help="worker processes")
    parser.add_argument("--ingest-threads", type=int, default=2, help="sessions per process")
    parser.add_argument("--watchdog-vms", type=int, default=10_000, help="fleet of the sweep")
    parser.add_argument("--watchdog-ended", type=int, default=1_000, help="ended events")
    parser.add_argument("--enrol-vms", type=int, default=100_000, help="VMs the sync enrols")
    parser.add_argument(
        "--junk-rows", type=int, default=100_000, help="junk liveness rows beside the fleet"
    )
    parser.add_argument(
        "--counts-out",
        help="where to write the measured counts (default: functions/cost/counts.json on a "
        "full run, nowhere with --quick); they are in the last JSON line either way",
    )
    parser.add_argument(
        "--only",
        action="append",
        choices=[p.name for p in PHASES],
        help="run only this phase (repeatable), for a look at one measurement",
    )
    parser.add_argument(
        "--crash-scenario",
        dest="crash_scenarios",
        action="append",
        help=f"explore only this crash scenario (repeatable; default: the {len(CRASH_BENCH)} "
        f"of CRASH_BENCH, {', '.join(CRASH_BENCH)}, of the {len(SCENARIOS)} in tests/crash; "
        "'all' for every one, as `make test` explores them)",
    )
    parser.add_argument(
        "--chaos-jobs", type=int, default=3, help="processes the chaos suite runs in"
    )
    parser.add_argument("--wave-vms", type=int, default=2_000, help="VMs of the wave")
    parser.add_argument("--budget-vms", type=int, default=60, help="VMs of the wave under a budget")
    parser.add_argument("--quick", action="store_true", help="small samples, for a smoke run")
    args = parser.parse_args(argv)
    if args.quick:
        args.relay_seconds, args.approve_samples, args.ingest_vms = 12.0, 5, 50
        args.watchdog_vms, args.watchdog_ended = 1_000, 100
        args.enrol_vms, args.junk_rows = 10_000, 10_000
        args.wave_vms = 300
        args.crash_scenarios = args.crash_scenarios or ["watchdog"]
    phases = [p for p in PHASES if not args.only or p.name in args.only]
    targets = targets_of(phases, quick=args.quick)
    began = time.monotonic()
    results: dict[str, Any] = {"quick": args.quick}
    results.update(run_phases(args, phases))
    results["bench_seconds"] = round(time.monotonic() - began, 1)
    failed = failures(results, targets)
    results["targets_failed"] = failed
    print(table(results, targets))
    for line in failed:
        print(f"bench: target failed: {line}", file=sys.stderr)
    print(json.dumps(results))
    # Any target missed, or a targeted figure missing: the bench fails (issue 47).
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
