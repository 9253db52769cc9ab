"""What a heartbeat says about draining (relay contract 2, issue 44): `probe_at`, `drain`.

The app's readiness drain works only where a load balancer really probes the VM: without
one, a 503 on /readyz takes nothing out of rotation and the drain is a wait. So the relay
reports, signed in its liveness row (relay.liveness), when Azure's probe last reached the
readiness endpoint (`probe_at`, unix seconds, 0 = never since the endpoint started) and
which drain means it offers (`drain`: "hook" for the operator's hook scripts, "readiness"
for a /readyz it can turn 503, "file" for the drain-signal file the application or its
proxy reads), and the app decides from that which drain to count on.

Azure's probes come from 168.63.129.16 (Learn, load-balancer-custom-probe-overview: "The
load balancer health probe originates from the IP address 168.63.129.16"), so only a probe
from that address counts. The readiness responder (relay.responder, a process of its own
that outlives the relay) records its probes in its status file, which is read here at each
heartbeat; a relay serving /readyz itself (--ready-listen) records them in relay.ready.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

AZURE_PROBE_SOURCE = "168.63.129.16"
DEFAULT_STATUS = Path("/run/scheduled-events-relay-ready/status.json")


def read_status(path: Path | None) -> dict[str, Any]:
    """The responder's status ({"probe_at": int, "means": [...]}), {} when there is none
    (no responder, or it stopped: its runtime directory goes with it) or it is unreadable."""
    if path is None:
        return {}
    try:
        data = json.loads(path.read_bytes()[:4096])
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def probe_time(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def drain_facts(
    hooks: bool, serving: Any, publishing: bool, status: Path | None
) -> Callable[[], tuple[int, str]]:
    """(probe_at, drain) at each heartbeat. `serving`: relay.ready.Readiness when the relay
    serves /readyz itself, else None; `publishing`: the relay publishes its drain state for
    the responder (--drain-file), so the responder's means are this relay's too."""

    def facts() -> tuple[int, str]:
        found = read_status(status) if publishing else {}
        offered = found.get("means") if isinstance(found.get("means"), list) else []
        probe_at = probe_time(found.get("probe_at"))
        if serving is not None:
            probe_at = max(probe_at, serving.probe_at)
        means = ["hook"] if hooks else []
        if serving is not None or "readiness" in offered:
            means.append("readiness")
        if "file" in offered:
            means.append("file")
        return probe_at, ",".join(means)

    return facts
