"""The crash-point explorer: for every request of a scenario, die before it and lose its
answer; compare each end state with the fault-free run's (docs/crash-explorer.md).

`explore(connection, scenario)` returns the points tried and, for each divergent one, the
first differing row or effect. `crash_points(connection)` is what the bench reports.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote, urlsplit

from local.azurite import table_url
from tests.crash import invariants, runner
from tests.crash.checkpoint import CheckpointError, Checkpoints, Result, run_forked
from tests.crash.faults import Fault, Faults, Kind, Sent, installed
from tests.crash.invariants import INVARIANTS
from tests.crash.scenarios import SCENARIOS, Scenario
from tests.crash.state import first_difference, snapshot, table_rows
from tests.crash.world import Made, Servers, World, start_servers

KINDS: tuple[Kind, ...] = ("before", "lost")
IDENTITY_HOST = "AZURE_POD_IDENTITY_AUTHORITY_HOST"


@dataclass
class Point:
    fault: Fault
    request: str  # the request the fault hit
    difference: str  # "" when the end state is the fault-free one
    same_as: Fault | None = None  # not run: the run of this point is the one of `same_as`
    broken: list[str] = field(default_factory=list)  # invariants that do not hold (invariants)


def equivalence(sent: list[Sent]) -> dict[tuple[int, int, str], list[Fault]]:
    """Crash points that leave the world in the same state, grouped; the first of each
    group is run, the others take its outcome.

    What a crash leaves is: the step it hit (which decides what is retried), the changes
    applied outside the host so far (writes, callbacks, posts, topic sends, settled
    messages), and the time (the FakeClock; the retry runs after it). Between two requests
    the host changes nothing outside itself (everything it changes goes out as a request,
    and the harness settles messages only between them), so two points with the same step,
    the same number of changes and the same time are the same experiment: "answer of k
    lost" is "crash before k+1" when k+1 follows in the same step with no time passing in
    between, and a crash before a read is a crash before the read that came just before it.
    """
    classes: dict[tuple[int, int, str], list[Fault]] = {}
    for s in sorted(sent, key=lambda s: s.index):
        before = (s.step, s.changes_before, s.clock_before)
        lost = (s.step, s.changes_before + int(s.write), s.clock_after)
        classes.setdefault(before, []).append(Fault(s.index, "before"))
        classes.setdefault(lost, []).append(Fault(s.index, "lost"))
    return classes


@dataclass
class Report:
    scenario: str
    requests: int  # requests of the fault-free run
    points: list[Point] = field(default_factory=list)
    seconds: float = 0.0
    baseline_errors: list[str] = field(default_factory=list)
    runs: int = 0  # runs with a fault actually executed (the others are equivalent to one)
    effects: dict[str, Any] = field(default_factory=dict)  # the fault-free run's effects
    baseline_broken: list[str] = field(default_factory=list)  # invariants, fault-free run
    # Requests of the fault-free run that got no answer ("k label: error"), and how many
    # requests the world left unanswered on purpose in it (the relay's `drop`).
    unanswered: list[str] = field(default_factory=list)
    dropped: int = 0
    foreign: int = 0  # requests of the process that were not the runs' (Faults.foreign)
    grouped_points: int = 0  # points in every group of equivalent ones, all shards' too
    forked: bool = False  # the runs were forked from a replay (tests.crash.checkpoint)

    def unplanned(self) -> list[str]:
        """The fault-free run's unanswered requests when they are not just the ones the
        world leaves unanswered on purpose: a receiver here is local and answers at once,
        so one more means a deadline passed (a busy machine) and the baseline depends on
        timing. Each unanswered request is named; [] when they are all planned."""
        return [] if len(self.unanswered) == self.dropped else list(self.unanswered)

    def violations(self) -> list[str]:
        """Every invariant broken, in the fault-free run or at any point."""
        seen = list(self.baseline_broken)
        for point in self.points:
            seen += [f"k={_name(point.fault)}: {b}" for b in point.broken]
        return seen

    def tried(self, kind: Kind | None = None) -> int:
        return sum(1 for p in self.points if kind in (None, p.fault.kind))

    def different(self, kind: Kind | None = None) -> list[Point]:
        return [p for p in self.points if p.difference and kind in (None, p.fault.kind)]

    def table(self) -> str:
        lines = [
            f"## {self.scenario}: {self.requests} requests fault-free; {self.runs} distinct"
            f" crash runs ({self.seconds:.0f} s)",
            "| fault | tried | same | different |",
            "|---|---|---|---|",
        ]
        for kind in KINDS:
            tried, diff = self.tried(kind), len(self.different(kind))
            lines.append(f"| {KIND_NAMES[kind]} | {tried} | {tried - diff} | {diff} |")
        if self.baseline_errors:
            lines.append(f"- the fault-free run failed a step: {self.baseline_errors[0]}")
        if self.unanswered:
            lines.append(
                f"- requests of the fault-free run that got no answer: {len(self.unanswered)}"
                f" ({self.dropped} left unanswered on purpose)"
            )
            lines += [f"  - {u}" for u in self.unplanned()[:10]]
        if self.foreign:
            lines.append(
                f"- requests not the runs' (another test's thread), let by: {self.foreign}"
            )
        broken = self.violations()
        lines.append(
            f"- invariants ({', '.join(INVARIANTS)}): checked after {self.runs + 1} runs, "
            f"{len(broken)} broken"
        )
        lines += [f"  - {b}" for b in broken[:10]]
        lines += self.grouped()
        return "\n".join(lines)

    def grouped(self) -> list[str]:
        """The divergent points, consecutive ones with the same first difference as one
        line: `k=7L..9B (5)` is from "answer of 7 lost" to "crash before 9"."""
        lines: list[str] = []
        run: list[Point] = []

        def flush() -> None:
            if not run:
                return
            first, last = run[0], run[-1]
            span = _name(first.fault)
            if len(run) > 1:
                span += f"..{_name(last.fault)}"
            lines.append(f"- k={span} ({len(run)}) `{first.request}`: {first.difference}")
            run.clear()

        for point in self.points:
            if run and point.difference != run[-1].difference:
                flush()
            if point.difference:
                run.append(point)
            else:
                flush()
        flush()
        return lines

    def summary_row(self) -> str:
        cells = []
        for kind in KINDS:
            tried, diff = self.tried(kind), len(self.different(kind))
            cells.append(f"{tried} / {tried - diff} / {diff}")
        return f"| {self.scenario} | {' | '.join(cells)} | {self.runs} |"


def _name(fault: Fault) -> str:
    return f"{fault.index}{'B' if fault.kind == 'before' else 'L'}"


KIND_NAMES = {"before": "crash before k", "lost": "k applied, answer lost"}


RUN_TABLE = re.compile(r"x[0-9a-f]{10}")  # World.prefix: the scenario's own tables


def _classifier(connection: str, servers: Servers) -> Callable[[str, int, str, str], str | None]:
    """Names each request of a run; None for one that cannot be the run's: to a port that
    is neither the run's Azurite nor one of its receivers, or naming a table outside the
    run's prefix. Every urllib3 request of the process passes here, and a test earlier in
    the same worker can leave a thread behind (a local host still retrying against its
    stopped Azurite): counted, its failure read as the baseline's (stop 49's CI)."""
    azurite = _table_port(connection)
    ports = {
        servers.relay.server.server_address[1]: "relay",
        servers.hook.server.server_address[1]: "drain-hook",
    }
    for name, receiver in servers.channels.items():
        ports[receiver.server.server_address[1]] = name
    if servers.arm is not None:
        ports[int(servers.arm.url.rsplit(":", 1)[1].split("/")[0])] = "arm"

    def classify(host: str, port: int, method: str, url: str) -> str:
        what = ports.get(port)
        path = unquote(url)
        if what is None:  # Azurite: name the table (without the run's prefix) and the keys
            if port != azurite:
                return None
            path = path.split("/", 2)[-1]
            table = re.split(r"[(?]", path, maxsplit=1)[0]
            if table not in ("$batch", "Tables") and not RUN_TABLE.match(table):
                return None
            path = path[11:] if path[:1] == "x" else path
            return f"table {method} {path[:70]}"
        return f"{what} {method} {path[:60]}"

    return classify


def _table_port(connection: str) -> int:
    """The port of the connection string's TableEndpoint (Azurite's table service)."""
    return urlsplit(table_url(connection, "")).port or 80


def explore(
    connection: str,
    scenario: Scenario,
    only: list[Fault] | None = None,
    progress: Callable[[str], None] | None = None,
    exhaustive: bool = False,
    shard: tuple[int, int] = (0, 1),
    fork: bool | None = None,
) -> Report:
    """Run `scenario` fault-free, then once per distinct crash point (`equivalence`; every
    (request, fault kind) with `exhaustive`, or only the faults in `only`).

    `shard` (i, n): only every n-th group of equivalent points from the i-th, so a long
    scenario's runs can share workers (the suite's tail); the fault-free run is
    deterministic, so n shards together run every group once. `Report.grouped_points`
    counts the points of every group, run here or not. `fork`: the runs forked from one
    replay of the fault-free run (tests.crash.checkpoint), where Azurite can (None), always
    (True) or never (False)."""
    started = time.monotonic()
    box: dict[str, World] = {}
    servers = start_servers(
        lambda: box["world"].delivering if "world" in box else "",
        lambda path: box["world"].config.hook_status.get(path, 200) if "world" in box else 200,
    )
    identity_host = os.environ.get(IDENTITY_HOST)
    if scenario.arm:
        servers.arm = _start_arm()
    made = Made()  # what every run deploys alike (settings, tables), made at the first
    try:
        faults = Faults(_classifier(connection, servers))
        with installed(faults):
            config, steps = scenario.build(servers)

            broken: list[str] = []

            def fresh(fault: Fault | None) -> World:
                servers.clear()
                faults.fault, faults.count, faults.log, faults.fired = fault, 0, [], ""
                faults.dead, faults.twice, faults._again = False, scenario.twice, None
                world = World(connection, servers, faults, config, made=made)
                box["world"] = world
                return world

            def once(fault: Fault | None) -> tuple[dict[str, Any], runner.Outcome, Faults]:
                world = fresh(fault)
                tables: dict[str, list[dict[str, Any]]] | None = None
                try:
                    outcome = runner.run(world, steps)
                    tables = table_rows(world)  # read once, for both, and for the clearing
                    broken[:] = invariants.check(world, tables)
                    return snapshot(world, tables), outcome, faults
                finally:
                    world.clear_tables(tables)

            baseline, outcome, _ = once(None)
            sent = list(faults.sent)
            report = Report(scenario.name, faults.count, baseline_errors=outcome.errors)
            report.baseline_broken = list(broken)
            report.effects = {k: v for k, v in baseline.items() if k.startswith("effect")}
            report.unanswered = [
                f"{s.index} {s.label}: {s.error}"
                for s in sorted(faults.sent, key=lambda s: s.index)
                if s.error
            ]
            report.dropped = sum(1 for r in servers.relay.requests if r.get("dropped"))
            labels = {s.index: s.label for s in faults.sent}
            if only is not None or exhaustive:
                every = (
                    only if only is not None else [Fault(k, kind) for k in labels for kind in KINDS]
                )
                classes = {(f.index, 0, f.kind): [f] for f in every}
            else:
                classes = equivalence(list(faults.sent))
            report.grouped_points = sum(len(group) for group in classes.values())
            first, every_nth = shard
            groups = list(classes.values())[first::every_nth]
            checkpoints = _checkpoints(connection, fork)
            report.forked = checkpoints is not None
            forked = iter(_forked(fresh, steps, groups, sent, baseline, checkpoints))
            for group in groups:
                if checkpoints is not None:
                    result = next(forked)
                    state, fired, broken[:] = result.state, result.fired, result.broken
                else:
                    state, _, used = once(group[0])
                    fired = used.fired
                report.runs += 1
                difference = first_difference(baseline, state)
                for fault in group:
                    same_as = None if fault == group[0] else group[0]
                    point = Point(fault, labels.get(fault.index, fired), difference, same_as)
                    point.broken = list(broken) if same_as is None else []
                    report.points.append(point)
                if progress is not None and difference:
                    progress(f"{scenario.name} k={group[0].index} {group[0].kind}: {difference}")
            report.points.sort(key=lambda p: (p.fault.index, p.fault.kind))
            report.foreign = len(faults.foreign)
    finally:
        made.drop(connection)  # the scenario's tables (the faults are uninstalled by now)
        servers.close()
        if identity_host is None:
            os.environ.pop(IDENTITY_HOST, None)
        else:
            os.environ[IDENTITY_HOST] = identity_host
    report.seconds = time.monotonic() - started
    return report


def _checkpoints(connection: str, fork: bool | None) -> Checkpoints | None:
    """The Azurite checkpoints when the runs fork (tests.crash.checkpoint): `fork` None
    forks where this Azurite has them (Azurite(checkpoints=True)), True insists."""
    if fork is False:
        return None
    checkpoints = Checkpoints(connection)
    if checkpoints.available():
        return checkpoints
    if fork:
        raise CheckpointError("this Azurite has no checkpoints: Azurite(checkpoints=True)")
    return None


def _forked(
    fresh: Callable[[Fault | None], World],
    steps: list[runner.Step],
    groups: list[list[Fault]],
    sent: list[Sent],
    baseline: dict[str, Any],
    checkpoints: Checkpoints | None,
) -> list[Result]:
    """Each group's crash run, forked from one replay of the fault-free run; the replay
    must end where the fault-free run ended."""
    if checkpoints is None or not groups:
        return []
    world = fresh(None)
    tables: dict[str, list[dict[str, Any]]] | None = None
    try:
        results, _ = run_forked(world, steps, groups, sent, checkpoints)
        tables = table_rows(world)
        replayed = first_difference(baseline, snapshot(world, tables))
    finally:
        world.clear_tables(tables)
    if replayed:
        raise CheckpointError(f"the replay of the fault-free run ended elsewhere: {replayed}")
    return results


def _start_arm() -> Any:
    """Resource Manager, Resource Graph and the managed-identity endpoint (the simulator's),
    with the scale set the ARM scenario's event is on; azure-identity finds its identity
    endpoint through AZURE_POD_IDENTITY_AUTHORITY_HOST (as tests/agentless do)."""
    from simulator import Simulator, SimulatorServer

    sim = Simulator(time_scale=1.0)
    sim.add_scale_set("web", 2)
    server = SimulatorServer(sim).start()
    os.environ[IDENTITY_HOST] = server.url
    return server


def explore_all(
    connection: str,
    names: list[str] | None = None,
    progress: Callable[[str], None] | None = None,
    exhaustive: bool = False,
) -> Iterator[Report]:
    """Each scenario's report as soon as it is explored."""
    chosen = [s for s in SCENARIOS if names is None or s.name in names]
    unknown = set(names or ()) - {s.name for s in SCENARIOS}
    if unknown:
        raise ValueError(
            f"unknown scenario(s) {sorted(unknown)}; known: {[s.name for s in SCENARIOS]}"
        )
    for scenario in chosen:
        yield explore(connection, scenario, progress=progress, exhaustive=exhaustive)


def crash_points(connection: str, names: list[str] | None = None) -> dict[str, int]:
    """For the bench: every scenario (or the named ones) explored; points tried and points
    whose end state differs from the fault-free run. The code under test logs every crash
    it survives, so logging is off meanwhile."""
    logging.disable(logging.CRITICAL)
    reports = []
    try:
        for report in explore_all(connection, names):
            # Each scenario's table on stderr, as `python -m tests.crash` prints it: the
            # bench's log then holds the numbers its last line only sums.
            print(report.table(), file=sys.stderr, flush=True)
            reports.append(report)
    finally:
        logging.disable(logging.NOTSET)
    expects = {s.name: s.expects for s in SCENARIOS}
    return {
        # Points: every request twice (crash before it, its answer lost), by construction;
        # of those, one per group of equivalent points is run (`equivalence`): the runs.
        "crash_points_tried": sum(r.tried() for r in reports),
        "crash_runs_executed": sum(r.runs for r in reports),
        "crash_points_divergent": sum(len(r.different()) for r in reports),
        # A fault-free run that failed a step, or did not show what its scenario is about
        # (its `expects`), is no baseline: the scenario tested nothing (issue 47).
        "crash_baselines_failed": sum(
            1
            for r in reports
            if r.baseline_errors or missing(r, expects[r.scenario]) or r.unplanned()
        ),
        "crash_invariant_runs": sum(r.runs + 1 for r in reports),
        "crash_invariants_broken": sum(len(r.violations()) for r in reports),
    }


def missing(report: Report, expects: tuple[str, ...]) -> list[str]:
    """What the scenario's fault-free run should show and does not."""
    shown = json.dumps(report.effects)
    return [e for e in expects if e not in shown]
