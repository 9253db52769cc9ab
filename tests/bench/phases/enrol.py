"""Phases `enrol` and `enrol_budgets` (tests/bench/enrol_bench.py, issues 26 and 39):
100,000 VMs through the bulk identity sync, its requests counted and its time in Azure
derived from them; again with disruption budgets (placements and group sizes written)."""

from __future__ import annotations

from typing import Any

from tests.bench.runner import Bench, Phase


def _enrol_phase(bench: Bench) -> dict[str, Any]:
    from tests.bench import enrol_bench

    enrolled = enrol_bench.run(bench.azurite("enrol"), bench.args.enrol_vms)
    return {"enrol": enrolled.pop("_enrol"), **enrolled}


def _enrol_budgets_phase(bench: Bench) -> dict[str, Any]:
    from tests.bench import enrol_bench

    vms = bench.args.enrol_vms
    enrolled = enrol_bench.run(bench.azurite("enrol_budgets"), vms, with_budgets=True)
    return {"enrol_budgets": enrolled.pop("_enrol_budgets"), **enrolled}


# Its own Azurite: the fleet's 10,000 VMs and 100,000 junk rows slowed the emulator (one
# Node process) to a third of its speed, which enrol_100k_azurite_s then showed.
ENROL = Phase(
    "enrol",
    lambda a: f"enrol: {a.enrol_vms} VMs through the simulated Resource Graph",
    _enrol_phase,
    azurite="enrol",
    targets={"enrol_100k_s": ("<=", 600), "resource_graph_queries_100k": ("<=", 110)},
    # Beside the budgets' pass: each mostly waits on its own Azurite (one Node process
    # each), and their keys are derived from counted requests, not from wall time.
    beside_next=True,
)

ENROL_BUDGETS = Phase(
    "enrol_budgets",
    lambda a: f"enrol with budgets: {a.enrol_vms} VMs, their placements and group sizes",
    _enrol_budgets_phase,
    azurite="enrol_budgets",
    targets={"enrol_100k_budgets_s": ("<=", 600)},
)
