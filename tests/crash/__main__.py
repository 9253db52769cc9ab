"""`python -m tests.crash [--exhaustive] [--json] [scenario ...]`: explore every scenario
(or the named ones) on a fresh Azurite and print a table per scenario: points tried, same,
different, and for each different one the first differing row or effect. `--exhaustive`
runs every crash point instead of one per group of equivalent points
(explore.equivalence). `--json` (what `make bench` runs, in a process of its own: the
explorer routes every urllib3 request of its process through its faults) prints the
tables on stderr and one JSON line of the bench's crash keys on stdout."""

from __future__ import annotations

import argparse
import json
import logging
import sys

from local.azurite import Azurite
from tests.crash.explore import crash_points, explore_all, missing
from tests.crash.scenarios import SCENARIOS


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.crash",
        description="Crash-point explorer: every request of each scenario, crash before it "
        "or lose its answer, then compare the end state with the fault-free run.",
    )
    parser.add_argument(
        "scenarios", nargs="*", metavar="scenario", help=", ".join(s.name for s in SCENARIOS)
    )
    parser.add_argument(
        "--exhaustive", action="store_true", help="run every point, not one per equivalent group"
    )
    parser.add_argument(
        "--json", action="store_true", help="tables on stderr, the bench's keys as one JSON line"
    )
    args = parser.parse_args(argv)
    if args.json:
        with Azurite(checkpoints=True) as azurite:
            print(json.dumps(crash_points(azurite.connection_string, args.scenarios or None)))
        return 0
    logging.disable(logging.CRITICAL)  # the code under test logs every crash it survives
    with Azurite(checkpoints=True) as azurite:
        total = divergent = 0
        reports = explore_all(
            azurite.connection_string, args.scenarios or None, exhaustive=args.exhaustive
        )
        expects = {s.name: s.expects for s in SCENARIOS}
        for report in reports:
            print(report.table(), flush=True)
            absent = missing(report, expects[report.scenario])
            if absent:
                print(f"- the fault-free run does not show {absent}", flush=True)
            print(flush=True)
            total += report.tried()
            divergent += len(report.different())
    print(f"crash_points_tried {total}, crash_points_divergent {divergent}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
