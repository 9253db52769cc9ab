"""The bench's phases, in the order they run (tests/bench/runner.py says how: `alone`,
`background`, `beside_next`). A new measurement is a module here defining a Phase (its
keys' targets in it) and one line below."""

from __future__ import annotations

from tests.bench.phases import (
    approve_e2e,
    budget,
    calibration,
    chaos,
    crash,
    enrol,
    fanout,
    fleet,
    hostile,
    ingest,
    noisy,
    relay,
    row_writes,
    wave,
)
from tests.bench.runner import Phase

PHASES: list[Phase] = [
    calibration.PHASE,  # first, alone: this machine's speed beside the figures (issue 47)
    ingest.PHASE,  # then, still with the machine to itself (issue 11)
    chaos.PHASE,  # background: beside every phase after ingest (issue 40)
    relay.PHASE,  # background: 150 s of 1 s polls
    approve_e2e.PHASE,  # beside the crash points
    crash.PHASE,  # a process and an Azurite of its own (issue 31); the fleet's seeding beside it
    fanout.PHASE,
    fleet.PHASE,  # its seeding (prepare) ran beside the crash points (issue 47)
    row_writes.PHASE,
    enrol.PHASE,  # one pass, both enrolment figures
    hostile.PHASE,
    wave.PHASE,  # issue 37
    budget.PHASE,  # issue 39
    noisy.PHASE,  # issue 46: one VM's made-up events beside honest ones
]
