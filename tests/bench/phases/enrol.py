"""Phase `enrol` (tests/bench/enrol_bench.py, issues 26 and 39): 100,000 VMs through the
bulk identity sync with disruption budgets (placements and group sizes written), its
requests counted and its time in Azure derived from them, with and without the budgets'
writes."""

from __future__ import annotations

from typing import Any

from tests.bench.runner import Bench, Phase


def _enrol_phase(bench: Bench) -> dict[str, Any]:
    """One pass with budgets gives both figures (enrol_bench.run): the pass without
    budgets is the same pass without its placements, so it is not run again (issue 47:
    about 80 s of the bench's 12 minutes on the build machine)."""
    from tests.bench import enrol_bench

    vms = bench.args.enrol_vms
    enrolled = enrol_bench.run(bench.azurite("enrol"), vms, with_budgets=True)
    return {"enrol_budgets": enrolled.pop("_enrol_budgets"), **enrolled}


# Its own Azurite: the fleet's 10,000 VMs and 100,000 junk rows slowed the emulator (one
# Node process) to a third of its speed, which enrol_100k_budgets_azurite_s then showed.
PHASE = Phase(
    "enrol",
    lambda a: f"enrol: {a.enrol_vms} VMs through the simulated Resource Graph, with budgets",
    _enrol_phase,
    azurite="enrol",
    targets={
        "enrol_100k_s": ("<=", 600),
        "enrol_100k_budgets_s": ("<=", 600),
        "resource_graph_queries_100k": ("<=", 110),
    },
)
