"""The bench's phases, in the order they run (tests/bench/runner.py says how: `alone`,
`background`, `beside_next`). A new measurement is a module here defining a Phase (its
keys' targets in it) and one line below."""

from __future__ import annotations

from tests.bench.phases import (
    approve_e2e,
    budget,
    chaos,
    crash,
    enrol,
    fanout,
    fleet,
    hostile,
    ingest,
    relay,
    row_writes,
    wave,
)
from tests.bench.runner import Phase

PHASES: list[Phase] = [
    ingest.PHASE,  # first, with the machine to itself (issue 11)
    chaos.PHASE,  # background: beside every phase after ingest (issue 40)
    relay.PHASE,  # background: 150 s of 1 s polls
    approve_e2e.PHASE,  # beside the crash points
    crash.PHASE,  # a process and an Azurite of its own (issue 31)
    fanout.PHASE,
    fleet.PHASE,
    row_writes.PHASE,
    enrol.ENROL,  # beside the budgets' pass
    enrol.ENROL_BUDGETS,
    hostile.PHASE,
    wave.PHASE,  # issue 37
    budget.PHASE,  # issue 39
]
