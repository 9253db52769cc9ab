"""The relay instrument (tests/bench/relay_bench.py, issue 47), small: the changes a relay
misses are counted and fail the figure, not left out of it.

On 2f59d6a a change not seen within 10 s was dropped from the sample, so a relay that
missed changes could still read a p99 "met"; and the memory was one read of VmRSS at the
end, not the peak (VmHWM)."""

from __future__ import annotations

import socket

import pytest

from tests.bench import relay_bench
from tests.bench.phases import relay as relay_phase
from tests.bench.report import failures

pytestmark = pytest.mark.slow


def test_the_relay_sees_every_change_and_its_peak_memory_is_read() -> None:
    result = relay_bench.run(8)
    assert result["changes"] >= 1 and result["detect_missed"] == 0, result
    assert 0 < result["relay_rss_mb"] < 100, result


def test_a_relay_that_cannot_reach_imds_misses_every_change(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The negative control: the relay polls a closed port; every change is missed,
    counted, and the figures miss their targets."""
    from simulator import SimulatorServer

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{probe.getsockname()[1]}"
    monkeypatch.setattr(SimulatorServer, "vm_url", lambda self, name: closed)
    monkeypatch.setattr(relay_bench, "FIRST_DOCUMENT_WAIT", 1.0)
    monkeypatch.setattr(relay_bench, "CHANGE_LIMIT", 1.5)
    result = relay_bench.run(7)
    assert result["detect_missed"] == result["changes"] >= 1, result
    missed = {line.split(":")[0] for line in failures(result, relay_phase.PHASE.targets)}
    assert {"detect_missed", "detect_p99_ms"} <= missed, missed
