"""`python -m tests.crash [--exhaustive] [scenario ...]`: explore every scenario (or the
named ones) on a fresh Azurite and print a table per scenario: points tried, same,
different, and for each different one the first differing row or effect. `--exhaustive`
runs every crash point instead of one per group of equivalent points
(explore.equivalence)."""

from __future__ import annotations

import logging
import sys

from local.azurite import Azurite
from tests.crash.explore import explore_all


def main(argv: list[str]) -> int:
    logging.disable(logging.CRITICAL)  # the code under test logs every crash it survives
    exhaustive = "--exhaustive" in argv
    names = [a for a in argv if not a.startswith("--")] or None
    with Azurite() as azurite:
        total = divergent = 0
        for report in explore_all(azurite.connection_string, names, exhaustive=exhaustive):
            print(report.table(), flush=True)
            print(flush=True)
            total += report.tried()
            divergent += len(report.different())
    print(f"crash_points_tried {total}, crash_points_divergent {divergent}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
