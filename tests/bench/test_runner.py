"""The runner's setups run ahead (tests/bench/runner.py, issue 47): a phase's unmeasured
setup (the fleet's seeding) runs beside the phase it names, and only once the phase beside
that one (whose figures are times) is done; run alone, the phase does its setup itself."""

from __future__ import annotations

import argparse
import threading
from typing import Any

from tests.bench.runner import Bench, Phase, run_phases


def phases(log: list[str]) -> list[Phase]:
    untimed_running, prepared = threading.Event(), threading.Event()

    def timed(bench: Bench) -> dict[str, Any]:
        assert untimed_running.wait(10), "the untimed phase did not start beside it"
        log.append("timed done")
        return {"timed": 1}

    def untimed(bench: Bench) -> dict[str, Any]:
        untimed_running.set()
        # The setup runs while this phase does (beside it), not after it.
        assert prepared.wait(10), "the setup did not run beside the untimed phase"
        log.append("untimed done")
        return {"untimed": 1}

    def setup(bench: Bench) -> str:
        log.append("setup")
        prepared.set()
        return "seeded"

    later = Phase(
        "later",
        lambda a: "later",
        lambda b: {"got": b.prepared(later)},
        prepare=setup,
        prepare_beside="untimed",
    )
    return [
        Phase("timed", lambda a: "timed", timed, beside_next=True),
        Phase("untimed", lambda a: "untimed", untimed),
        later,
    ]


def test_a_setup_runs_beside_the_phase_it_names_once_the_timed_one_is_done() -> None:
    log: list[str] = []
    found = run_phases(argparse.Namespace(), phases(log))
    assert log == ["timed done", "setup", "untimed done"]
    assert (found["got"], found["timed"], found["untimed"]) == ("seeded", 1, 1)
    assert set(found["prepare_seconds"]) == {"later"}
    assert set(found["phase_seconds"]) == {"timed", "untimed", "later"}


def test_a_phase_run_alone_does_its_setup_itself() -> None:
    log: list[str] = []
    found = run_phases(argparse.Namespace(), phases(log)[2:])
    assert log == ["setup"] and found["got"] == "seeded" and found["prepare_seconds"] == {}
