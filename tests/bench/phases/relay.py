"""Phase `relay` (tests/bench/relay_bench.py): detection latency at 1 s polling, the relay's
memory, and its CPU against the seed's plain polling loop measured beside it; the room
the embedded relay leaves in Azure's customData."""

from __future__ import annotations

from typing import Any

from tests.bench.runner import Bench, Phase


def _relay_phase(bench: Bench) -> dict[str, Any]:
    from tests.bench import relay_bench
    from tests.infra.customdata import spare_bytes

    out = relay_bench.run(bench.args.relay_seconds)
    out["relay_customdata_spare_bytes"] = spare_bytes()  # issue 28: room to grow
    return out


PHASE = Phase(
    "relay",
    lambda a: f"relay: {a.relay_seconds:g} s of polling beside the plain loop",
    _relay_phase,
    targets={
        "detect_p99_ms": ("<=", 1100),
        "detect_missed": ("==", 0),  # issue 47: changes the relay never forwarded
        "relay_rss_mb": ("<=", 15),
        "relay_cpu_ratio": ("<=", 1.0),
        "relay_customdata_spare_bytes": (">=", 8192),
    },
    # Beside every other phase, as the chaos suite: it mostly waits (1 s polls), its CPU
    # and memory are read per process from /proc, and what load adds to a change's
    # detection is milliseconds against the 1 s poll.
    background=True,
)
