"""The budget wave's negative control (tests/bench/budget_wave.py, issue 47): a wave whose
slots never come back misses its targets.

On 2f59d6a, with 4 of 20 VMs never reporting their event gone (their slots leak), only 4
were approved, yet `budget_peak_over_limit` read 0 and `budget_wait_p99_s` 1.6 s, both
"met": the wait was taken over the approved VMs only. (tests/cost/test_measurements.py
runs the instrument with and without the budget.)"""

from __future__ import annotations

from typing import Any

import pytest

from tests.bench import budget_wave
from tests.bench.phases import budget as budget_phase
from tests.bench.report import failures

pytestmark = [pytest.mark.azurite, pytest.mark.slow]


def test_slots_that_never_come_back_make_the_budget_wave_miss(
    azurite: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = budget_wave._Fleet.__init__
    stuck: set[str] = set()

    def leaking(self: Any, relay: Any, events: Any, report: Any, impact: float) -> None:
        def report_but_never_leave(name: str, sequence: int, listed: list[Any]) -> None:
            if not listed and (name in stuck or len(stuck) < 4):
                stuck.add(name)  # the first 4 VMs out never report their event gone
                return
            report(name, sequence, listed)

        real(self, relay, events, report_but_never_leave, impact)

    monkeypatch.setattr(budget_wave._Fleet, "__init__", leaking)
    monkeypatch.setattr(budget_wave, "GIVE_UP", 15.0)
    result = budget_wave.run(azurite, 20, impact=0.3)
    # 4 at most, each slot kept: on a busy machine the 15 s give-up may come before all
    # 4 of the first are approved, never after a fifth.
    assert result["budget_limit"] == 4 and 1 <= result["budget_approved"] <= 4, result
    assert result["budget_unapproved"] == 20 - result["budget_approved"], result
    assert result["budget_slots_held_at_end"] == result["budget_approved"], result
    assert result["budget_wait_p99_s"] >= 15.0, result
    missed = {line.split(":")[0] for line in failures(result, budget_phase.PHASE.targets)}
    assert {"budget_unapproved", "budget_slots_held_at_end"} <= missed, missed
