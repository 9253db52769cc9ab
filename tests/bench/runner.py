"""The bench's runner: what a phase is, what it gets, and the order phases run in.

A Phase (its name, its progress line, a function returning its keys, the Azurite it uses,
the targets of its keys) is registered in tests/bench/phases/__init__.py; `run_phases`
runs them in that order, some beside others (`beside_next`, `background`, `alone`), and
records where the time went (`phase_seconds`, `phase_cpu_seconds`).
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


def run_phases(args: argparse.Namespace, phases: list[Phase]) -> dict[str, Any]:
    """Every phase in order (a `beside_next` one in a thread beside the next), each one's
    wall time in `phase_seconds`; the CPU of phases run side by side is counted in both."""
    bench = Bench(args)
    results: dict[str, Any] = {}
    seconds: dict[str, float] = {}
    cpu: dict[str, float] = {}
    foreground = [p for p in phases if not p.background]
    last_use = {p.azurite: i for i, p in enumerate(foreground) if p.azurite}

    def measured(phase: Phase) -> dict[str, Any]:
        began, used = time.monotonic(), bench.cpu_seconds()
        found = phase.run(bench)
        seconds[phase.name] = round(time.monotonic() - began, 1)
        cpu[phase.name] = round(bench.cpu_seconds() - used, 1)
        return found

    beside = ThreadPoolExecutor(max_workers=1)
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
        background.shutdown(wait=True)
        bench.close()
    results["phase_seconds"] = seconds
    results["phase_cpu_seconds"] = cpu  # user + sys, Azurite and child processes included
    return results
