"""`python -m tests.chaos`: the chaos suite (issue 40), its table on stdout.

    .venv/bin/python -m tests.chaos              # every run, three processes at once
    .venv/bin/python -m tests.chaos --quick      # the short version make test runs
    .venv/bin/python -m tests.chaos --run "host killed mid-message" --json

Exit status 1 when a run diverges from its fault-free run (allowed exceptions aside).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import sys

from tests.chaos.runner import RUNS, quick_runs, run_all, run_sharded, summary, table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.chaos", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="the short version only")
    parser.add_argument("--run", action="append", help="only this run (repeatable)")
    parser.add_argument("--json", action="store_true", help="the results as JSON too")
    parser.add_argument(
        "--jobs", type=int, default=3, help="processes for the full suite (1: this one only)"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)
    runs = quick_runs() if args.quick else RUNS
    if args.run:
        runs = tuple(r for r in (*RUNS, *quick_runs()) if r.name in args.run)
        if not runs:
            parser.error(f"no run named {args.run}; known: {[r.name for r in RUNS]}")

    def progress(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    if args.jobs > 1 and not args.run and not args.quick:
        results = run_sharded(runs, args.jobs, progress)
    else:
        results = run_all(runs, progress=progress)
    print(table(results))
    if args.json:
        runs_json = [dataclasses.asdict(r) for r in results]
        print(json.dumps({**summary(results), "runs": runs_json}, default=str))
    return 1 if summary(results)["chaos_divergent"] else 0


if __name__ == "__main__":
    sys.exit(main())
