"""Phase `noisy_neighbour` (tests/bench/noisy.py, issue 46 item 3): 100 made-up events of
one VM whose relay never answers, beside 200 honest events; its own Azurite."""

from __future__ import annotations

from typing import Any

from tests.bench.runner import Bench, Phase


def _noisy_phase(bench: Bench) -> dict[str, Any]:
    from tests.bench import noisy

    return noisy.run(bench.azurite("noisy"))


PHASE = Phase(
    "noisy_neighbour",
    lambda a: "noisy neighbour: 100 made-up events of one silent relay beside 200 honest",
    _noisy_phase,
    azurite="noisy",
    targets={
        # What one VM's made-up events cost the honest approvals' p99, and how many
        # workers its relay held at once (functions.pipeline.lanes).
        "noisy_neighbour_delay_p99_s": ("<=", 2),
        "noisy_neighbour_exchanges_at_once": ("<=", 1),
        "noisy_neighbour_unapproved": ("==", 0),
    },
)
