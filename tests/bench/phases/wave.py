"""Phase `wave` (tests/bench/wave.py, issue 37): a fleet-wide wave of due events approved
through the work queue while 1 % of the relays drip or hang; its own Azurite."""

from __future__ import annotations

from typing import Any

from tests.bench.runner import Bench, Phase


def _wave_phase(bench: Bench) -> dict[str, Any]:
    from tests.bench import wave

    return wave.run(bench.azurite("wave"), bench.args.wave_vms)


PHASE = Phase(
    "wave",
    lambda a: f"wave: {a.wave_vms} VMs' events due at once, 1 % of relays dripping",
    _wave_phase,
    azurite="wave",
    # Honest VMs approved in time, sweeps that wait on no relay.
    targets={
        "wave_honest_unapproved": ("==", 0),
        "wave_approve_p99_s": ("<=", 60),
        "wave_approve_max_s": ("<=", 90),
        "wave_sweep_s_max": ("<=", 10),
        # Issue 47: what Azure bills for one approval of the wave (9.15 on 2f59d6a).
        "wave_table_requests_per_event": ("<=", 6),
    },
)
