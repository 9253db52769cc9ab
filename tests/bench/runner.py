"""The bench's runner: what a phase is, what it gets, and the order phases run in.

A Phase (its name, its progress line, a function returning its keys, the Azurite it uses,
the targets of its keys) is registered in tests/bench/phases/__init__.py; `run_phases`
runs them in that order, some beside others (`beside_next`, `background`, `alone`), a
phase's unmeasured setup ahead of it beside an untimed phase (`prepare`, `prepare_beside`),
and records where the time went (`phase_seconds`, `phase_cpu_seconds`, `prepare_seconds`).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# A target: (operator, value), the operator one of "<=", ">=", "==".
Target = tuple[str, float]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


def progress(text: str) -> None:
    print(f"bench: {text}", file=sys.stderr, flush=True)


def wait_for(probe: Callable[[], Any], timeout: float) -> Any:
    """The probe's first value that is not None, polled; TimeoutError after `timeout` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = probe()
        if value is not None:
            return value
        time.sleep(0.005)
    raise TimeoutError(f"nothing after {timeout} s")


class Bench:
    """What a phase gets: the parsed flags and an Azurite by name. Each name is a fresh
    Azurite of its own, started when a phase first asks for it and stopped after the last
    phase that declares it (Phase.azurite): one phase's rows never slow another's."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self._azurites: dict[str, Any] = {}
        self._prepared: dict[str, Any] = {}

    def prepare(self, phase: Phase) -> None:
        """Run the phase's setup now (run_phases: ahead of it, beside another phase)."""
        if phase.prepare is not None and phase.name not in self._prepared:
            self._prepared[phase.name] = phase.prepare(self)

    def prepared(self, phase: Phase) -> Any:
        """What the phase's setup returned: run ahead of it, or now (a run of the phase
        alone, `--only`, counts its setup in its own time, as before issue 47)."""
        self.prepare(phase)
        return self._prepared.pop(phase.name, None)

    def azurite(self, name: str) -> str:
        """The connection string of the Azurite called `name`."""
        from local.azurite import Azurite

        if name not in self._azurites:
            self._azurites[name] = Azurite().start()
        return self._azurites[name].connection_string

    def cpu_seconds(self) -> float:
        """CPU used so far by this process, its reaped children, and the Azurites still
        running (read from /proc: a running child is not in the children's count yet).
        On a shared machine a phase's CPU says more than its wall time."""
        times = os.times()
        total = times.user + times.system + times.children_user + times.children_system
        tick = os.sysconf("SC_CLK_TCK")
        for server in self._azurites.values():
            try:
                fields = Path(f"/proc/{server.proc.pid}/stat").read_text().rsplit(")", 1)[1]
            except (OSError, AttributeError):
                continue
            user, system = fields.split()[11:13]
            total += (int(user) + int(system)) / tick
        return total

    def release(self, name: str) -> None:
        server = self._azurites.pop(name, None)
        if server is not None:
            server.stop()

    def close(self) -> None:
        for name in list(self._azurites):
            self.release(name)


@dataclass(frozen=True)
class Phase:
    """One measurement: `run` returns the keys it adds to the results (a key starting with
    `_` is kept out of them); `azurite` names the Azurite it uses, if any; `targets` are
    the targets of its keys (the report checks them, and a phase that ran without one of
    its targeted keys fails the bench)."""

    name: str
    describe: Callable[[argparse.Namespace], str]
    run: Callable[[Bench], dict[str, Any]]
    azurite: str | None = None
    targets: dict[str, Target] = field(default_factory=dict)
    # Keys whose target is on the sample's size (points explored, runs): a quick run's
    # smaller samples are not held to it.
    sized: tuple[str, ...] = ()
    # Run in a thread while the next phase runs: both mostly wait (the relay's polling,
    # the end-to-end approvals at real time), and neither measures the other's CPU.
    beside_next: bool = False
    # Run in a thread beside every other phase, joined at the end: the chaos suite mostly
    # waits (its plans play at 20x real time) in processes of its own.
    background: bool = False
    # Run before any background phase starts, with nothing beside it: a throughput that
    # wants both cores (ingest_docs_per_s).
    alone: bool = False
    # Setup that measures nothing (seeding its Azurite's state), which `run` gets from
    # `bench.prepared(phase)`; run_phases runs it ahead, beside the phase named
    # `prepare_beside` (one whose figures are counts, not times) once no other phase runs
    # beside that one (issue 47: the fleet's seeding beside the crash points, after the
    # end-to-end approvals, whose latency wants the CPU). Its time: `prepare_seconds`.
    prepare: Callable[[Bench], Any] | None = None
    prepare_beside: str | None = None


def run_phases(args: argparse.Namespace, phases: list[Phase]) -> dict[str, Any]:
    """Every phase in order (a `beside_next` one in a thread beside the next), each one's
    wall time in `phase_seconds`; the CPU of phases run side by side is counted in both."""
    bench = Bench(args)
    results: dict[str, Any] = {}
    seconds: dict[str, float] = {}
    cpu: dict[str, float] = {}
    prepared: dict[str, float] = {}
    foreground = [p for p in phases if not p.background]
    last_use = {p.azurite: i for i, p in enumerate(foreground) if p.azurite}

    def measured(phase: Phase) -> dict[str, Any]:
        began, used = time.monotonic(), bench.cpu_seconds()
        found = phase.run(bench)
        seconds[phase.name] = round(time.monotonic() - began, 1)
        cpu[phase.name] = round(bench.cpu_seconds() - used, 1)
        return found

    def prepare_ahead(phase: Phase, partner: Any) -> dict[str, Any]:
        """`phase` in a thread; once `partner` (a phase beside it) is done, the setups of
        the later phases that asked to run beside it, in this thread; then its keys."""
        running = ahead.submit(measured, phase)
        if partner is not None:
            partner.exception()  # waits; its error, if any, is raised where it is merged
        for later in foreground[foreground.index(phase) + 1 :]:
            if later.prepare is not None and later.prepare_beside == phase.name:
                progress(f"{later.name}: its setup, beside {phase.name}")
                began = time.monotonic()
                bench.prepare(later)
                prepared[later.name] = round(time.monotonic() - began, 1)
        found: dict[str, Any] = running.result()
        return found

    beside = ThreadPoolExecutor(max_workers=1)
    ahead = ThreadPoolExecutor(max_workers=1)
    background = ThreadPoolExecutor(max_workers=max(1, sum(p.background for p in phases)))
    behind: list[Any] = []

    def start_background() -> None:
        for phase in (p for p in phases if p.background):
            progress(phase.describe(args))
            behind.append(background.submit(measured, phase))

    pending: Any = None
    try:
        for i, phase in enumerate(foreground):
            if not phase.alone and not behind:
                start_background()
            progress(phase.describe(args))
            if phase.beside_next and i + 1 < len(foreground) and pending is None:
                pending = beside.submit(measured, phase)
                continue
            if any(p.prepare_beside == phase.name for p in foreground[i + 1 :]):
                found = prepare_ahead(phase, pending)
            else:
                found = measured(phase)
            if pending is not None:
                found = {**pending.result(), **found}
                pending = None
            results.update({k: v for k, v in found.items() if not k.startswith("_")})
            if phase.azurite and last_use[phase.azurite] == i:
                bench.release(phase.azurite)
        if not behind:
            start_background()
        for future in behind:
            results.update({k: v for k, v in future.result().items() if not k.startswith("_")})
    finally:
        beside.shutdown(wait=True)
        ahead.shutdown(wait=True)
        background.shutdown(wait=True)
        bench.close()
    results["phase_seconds"] = seconds
    results["phase_cpu_seconds"] = cpu  # user + sys, Azurite and child processes included
    results["prepare_seconds"] = prepared  # setups run ahead, beside another phase
    return results
