"""The noisy-neighbour instrument (tests/bench/noisy.py, issue 46), small: with each VM's
lane (functions.pipeline.lanes) the liar's relay holds one exchange at a time and every
honest VM is approved; the negative control turns the lanes off and sees the figure miss
(on 2f59d6a, which had no lanes, every made-up event held a worker for its whole budget)."""

from __future__ import annotations

import pytest

from tests.bench import noisy
from tests.bench.phases import noisy as noisy_phase
from tests.bench.report import failures

pytestmark = [pytest.mark.azurite, pytest.mark.slow]


def test_the_liar_holds_one_exchange_and_every_honest_vm_is_approved(
    azurite: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(noisy, "MADE_UP", 48)
    result = noisy.run(azurite, honest=20)
    assert result["noisy_neighbour_approved"] == 20, result
    assert result["noisy_neighbour_exchanges_at_once"] == 1, result


def test_without_the_lanes_the_figure_misses(azurite: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """48 made-up events, 16 workers, a 5 s budget: three rounds of budgets ahead of the
    honest ones, so the delay is about 15 s, and the liar holds every worker at once."""
    monkeypatch.setattr(noisy, "MADE_UP", 48)
    result = noisy.run(azurite, honest=20, fair=False)
    assert result["noisy_neighbour_exchanges_at_once"] >= 8, result
    missed = failures(result, noisy_phase.PHASE.targets)
    assert any(line.startswith("noisy_neighbour_delay_p99_s") for line in missed), missed
    assert any(line.startswith("noisy_neighbour_exchanges_at_once") for line in missed), missed
