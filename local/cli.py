"""`python -m local.demo`: flags, signals, the summary, the report, the exit code.

Exit codes: 0 every expected outcome met, 1 one was not (or the demo stopped early),
130 interrupted (Ctrl-C, SIGTERM), 3 stopping itself hung and what was left was killed.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

from pydantic import TypeAdapter, ValidationError

from local.demo_pages import SERVE_HINT, serve
from local.lag import LagMeter, Pace, choose_scale, load_per_core, overshoot
from local.options import DEFAULT_REPORT, DemoAborted, DemoOptions
from local.orchestration import Demo
from local.plan import FLEET, PLAN, Step, check_plan
from local.report import Outcome, Timeline, summary_lines, wants_colour, write_html
from local.report_data import collect


@contextlib.contextmanager
def _signals_stop_the_demo(demo: Demo) -> Iterator[None]:
    """SIGTERM and SIGINT (Ctrl-C) unwind the demo, stopping everything in order.

    The handler's KeyboardInterrupt is raised wherever the main thread is, and Python
    drops it when that is a weakref callback or a finalizer ("Exception ignored in"): a
    SIGINT during the start-up's imports then stopped nothing, and the demo played on past
    the CLI test's 30 s. So the signal is also noted on the demo, whose play loop raises it
    at its next check (`DemoState.check_deadline`, every 0.1 s)."""

    def interrupt(signum: int, frame: object) -> None:
        demo.interrupted = f"signal {signum}"
        raise KeyboardInterrupt(demo.interrupted)

    previous = {sig: signal.signal(sig, interrupt) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def run(options: DemoOptions, timeline: Timeline | None = None, pace: str = "") -> int:
    timeline = timeline or Timeline()
    if pace:  # the time scale was slowed for a busy machine (local.lag): said first
        timeline.add("demo", "pace", pace)
    meter = LagMeter().start()
    demo = Demo(options, timeline)
    # The backstop: if stopping itself hangs, kill the children and leave.
    backstop = threading.Timer(options.time_limit + 20, _hard_exit, args=(demo,))
    backstop.daemon = True
    backstop.start()
    outcomes: list[Outcome] = []
    aborted: str | None = None
    reported = False
    try:
        with _signals_stop_the_demo(demo):
            try:
                demo.start()
                demo.play()
                outcomes = demo.outcomes()
                if options.serve and getattr(demo, "host", None) is not None:
                    backstop.cancel()  # served until Ctrl-C: no time limit any more
                    _report(options, timeline, outcomes, demo)
                    reported = True
                    serve(demo, list(demo.step_events.values()))
            except KeyboardInterrupt:
                aborted = None if reported else "interrupted"  # Ctrl-C ends serving
            except DemoAborted as exc:
                aborted = str(exc)
            finally:
                try:
                    timeline.add("demo", "demo", "stopping everything it started")
                finally:
                    _stop_patiently(demo)
    finally:
        backstop.cancel()
    if aborted:
        timeline.add("demo", "demo", f"stopped early: {aborted}", ok=False)
        outcomes = outcomes or [Outcome("the demo ran to the end", False, aborted)]
    meter.stop()
    failed = [o for o in outcomes if not o.ok and not o.skipped]
    busy = meter.verdict(len(failed) + (1 if aborted else 0), options.time_scale)
    if busy:
        timeline.add("demo", "pace", busy, ok=False)
    if not reported:
        _report(options, timeline, outcomes, demo)
    if busy:
        print(f"  {busy}")
    if aborted == "interrupted":
        return 130
    return 1 if failed or aborted else 0


def _report(options: DemoOptions, timeline: Timeline, outcomes: list[Outcome], demo: Demo) -> None:
    """The summary on stdout, the HTML report, and where the operators' pages are."""
    print("\nSummary")
    for line in summary_lines(outcomes, colour=wants_colour(sys.stdout)):
        print(line)
    if options.report is not None:
        path = write_html(
            options.report,
            "Scheduled Events bridge: demo report",
            timeline.snapshot(),
            outcomes,
            demo.facts(),
            data=collect(demo),
        )
        print(f"  report: {path}")
    if options.keep:
        print(f"  working directory (relay logs, inbox): {demo.workdir}")
    if not options.serve:
        print(f"  {SERVE_HINT}")


def _stop_patiently(demo: Demo, limit: float = 30.0) -> None:
    """Stop in order; a second Ctrl-C must not leave relays behind half-stopped."""

    def wait(signum: int, frame: object) -> None:
        print("demo: still stopping what it started, a moment", file=sys.stderr, flush=True)

    previous = {sig: signal.signal(sig, wait) for sig in (signal.SIGINT, signal.SIGTERM)}
    backstop = threading.Timer(limit, _hard_exit, args=(demo,))
    backstop.daemon = True
    backstop.start()
    try:
        demo.close()
    finally:
        backstop.cancel()
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _hard_exit(demo: Demo) -> None:
    print("demo: stopping took too long; killing what is left", file=sys.stderr, flush=True)
    demo.stack.kill_all()
    os._exit(3)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m local.demo",
        description="Play real maintenance through the whole bridge on this machine.",
    )
    parser.add_argument(
        "--time-scale",
        type=float,
        help="60 (default): 15 min in 15 s; slower by itself on a busy machine unless given",
    )
    parser.add_argument(
        "--time-limit",
        type=float,
        help="hard stop, seconds (default 170 at 60x, longer at a slower time scale)",
    )
    parser.add_argument("--report", type=Path, default=DEFAULT_REPORT, help="HTML report path")
    parser.add_argument("--no-report", action="store_true")
    parser.add_argument(
        "--plan",
        type=Path,
        help='JSON list of steps to play instead of the built-in plan: [{"at": 0, '
        '"scenario": "platform-reboot", "target": "web-as"}, ...] (fleet: '
        + ", ".join(vm.name for vm in FLEET)
        + "; sets web-as, workers)",
    )
    parser.add_argument(
        "--no-upgrade-lane",
        action="store_true",
        help="play the plan alone: no relays upgraded, killed or refused alongside "
        "(the upgrade lane takes about 20 s beside any plan)",
    )
    parser.add_argument(
        "--keep",
        action="store_true",
        help="keep the working directory (relay logs, inbox, processed messages) and say where",
    )
    parser.add_argument(
        "--serve",
        action="store_true",
        help="after the outcomes, keep everything up and serve the operators' pages on "
        "127.0.0.1 (a local stand-in operator, no Entra ID) until Ctrl-C",
    )
    args = parser.parse_args(argv)
    plan = PLAN
    if args.plan is not None:
        try:
            plan = tuple(TypeAdapter(list[Step]).validate_json(args.plan.read_bytes()))
        except (OSError, ValidationError) as exc:
            parser.error(f"--plan {args.plan}: {exc}")
        problem = check_plan(plan, FLEET)
        if problem:
            parser.error(f"--plan {args.plan}: {problem}")
    pace = (
        Pace(args.time_scale)
        if args.time_scale
        else choose_scale(60.0, overshoot(), load_per_core())
    )
    options = DemoOptions(
        plan=plan,
        time_scale=pace.scale,
        time_limit=args.time_limit or 170.0 * 60.0 / min(pace.scale, 60.0),
        report=None if args.no_report else args.report,
        keep=args.keep,
        serve=args.serve,
        upgrade_lane=not args.no_upgrade_lane,
    )
    try:
        return run(options, pace=pace.note)
    except BrokenPipeError:  # the reader went away after everything was stopped
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
