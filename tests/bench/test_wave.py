"""The wave instrument (tests/bench/wave.py, issue 47), small: it sees every honest VM
approved, and a wave that leaves honest VMs behind misses its targets.

On 2f59d6a the percentiles were taken over the approved VMs only: with 10 of 99 honest
VMs pointed at a closed port, `wave_honest_approved` read 89 and p99 7.0 s, "met"."""

from __future__ import annotations

import socket
from typing import Any

import pytest

from tests.bench import wave
from tests.bench.phases import wave as wave_phase
from tests.bench.report import failures

pytestmark = [pytest.mark.azurite, pytest.mark.slow]


def closed_port() -> str:
    """An address where nothing listens: a relay that is down."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def test_the_wave_approves_every_honest_vm_and_measures_its_size(azurite: str) -> None:
    result = wave.run(azurite, 20)
    assert result["wave_events"] == 20 and result["wave_slow_relays"] == 1, result
    assert result["wave_honest_approved"] == 19 and result["wave_honest_unapproved"] == 0
    assert result["wave_approve_max_s"] < wave.GIVE_UP, result


def test_honest_vms_never_approved_make_the_wave_miss(
    azurite: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The negative control: 3 honest VMs' relays are down. They count, at the time the
    wave was given up, and `wave_honest_unapproved` misses its target."""
    from tests.functions import conftest

    down = closed_port()
    real = conftest.envelope

    def envelope(name: str, *args: Any, **kwargs: Any) -> str:
        if name in ("wave-00001", "wave-00002", "wave-00003"):
            kwargs["callback_url"] = down
        return real(name, *args, **kwargs)

    monkeypatch.setattr(conftest, "envelope", envelope)
    monkeypatch.setattr(wave, "GIVE_UP", 6.0)
    result = wave.run(azurite, 20)
    # At least the 3: on a busy machine others may not be approved by the 6 s give-up
    # either (a hog run of 6cef93a read 15 approved); the exact count is the test above's.
    assert result["wave_honest_approved"] + result["wave_honest_unapproved"] == 19, result
    assert result["wave_honest_unapproved"] >= 3, result
    assert result["wave_approve_max_s"] >= 6.0 and result["wave_approve_p99_s"] >= 6.0, result
    missed = failures(result, wave_phase.PHASE.targets)
    assert any(line.startswith("wave_honest_unapproved") for line in missed), missed
