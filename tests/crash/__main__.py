"""`python -m tests.crash [--exhaustive] [scenario ...]`: explore every scenario (or the
named ones) on a fresh Azurite and print a table per scenario: points tried, same,
different, and for each different one the first differing row or effect. `--exhaustive`
runs every crash point instead of one per group of equivalent points
(explore.equivalence)."""

from __future__ import annotations

import argparse
import json
import logging
import sys

from local.azurite import Azurite
from tests.crash.explore import explore_all
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
    args = parser.parse_args(argv)
    logging.disable(logging.CRITICAL)  # the code under test logs every crash it survives
    with Azurite() as azurite:
        total = divergent = 0
        reports = explore_all(
            azurite.connection_string, args.scenarios or None, exhaustive=args.exhaustive
        )
        expects = {s.name: s.expects for s in SCENARIOS}
        for report in reports:
            print(report.table(), flush=True)
            shown = json.dumps(report.effects)
            missing = [e for e in expects[report.scenario] if e not in shown]
            if missing:
                print(f"- the fault-free run does not show {missing}", flush=True)
            print(flush=True)
            total += report.tried()
            divergent += len(report.different())
    print(f"crash_points_tried {total}, crash_points_divergent {divergent}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
