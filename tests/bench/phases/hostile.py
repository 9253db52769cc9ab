"""Phase `hostile` (tests/security/hostile.py, issue 32): the worst wall time one hostile
message costs: the one 5 s issuer deadline of a message whose issuer never answers, plus
CPU."""

from __future__ import annotations

from typing import Any

from tests.bench.runner import Bench, Phase


def _hostile_phase(bench: Bench) -> dict[str, Any]:
    from tests.security import hostile

    return hostile.worst_message_cost_ms(bench.azurite("hostile"))


PHASE = Phase(
    "hostile",
    lambda a: "one VM's hostile messages: the worst cost of one (issue 32)",
    _hostile_phase,
    azurite="hostile",
    targets={"worst_message_cost_ms": ("<=", 6000)},
)
