"""Phase `approve_e2e`: a simulator change to StartRequests received by the simulator, for
an auto-approved event, through a real relay (1 s polling), the local host, ingest, the
policy and the signed callback, with state on Azurite (`approve_e2e_p99_ms`)."""

from __future__ import annotations

import random
import time
from typing import Any

from tests.bench.runner import Phase, percentile, wait_for


def approve_e2e(samples: int) -> dict[str, Any]:
    """Auto-approved events through the whole local pipeline, one at a time, random phase."""
    from local.options import DemoOptions
    from local.orchestration import Demo
    from local.plan import VmSpec
    from local.report import Timeline

    options = DemoOptions(
        time_scale=1.0,  # real time: 15 min of notice, NotBefore never interferes
        poll_interval=1.0,  # the relay's real cadence
        fleet=(VmSpec(name="bench-1"),),
        plan=(),
        report=None,
        time_limit=3600,
        play_freezes=False,  # a played pause would delay the next sample's detection
        upgrade_lane=False,  # one relay, restarted by the lane, would be a sample's outage
    )
    latencies: list[float] = []
    rng = random.Random(7)
    with Demo(options, Timeline(stream=None)) as demo:
        sim = demo.sim
        for _ in range(samples):
            time.sleep(rng.uniform(0.0, 1.0))  # a random phase against the 1 s poll
            [event_id] = sim.play("live-migration", target="bench-1")
            created = sim.event(event_id).created_at
            approval = wait_for(lambda e=event_id: _approval_of(sim, e), 15)
            latencies.append((approval.at.timestamp() - created) * 1000)
            sim.remove_event(event_id)
            wait_for(lambda e=event_id: "completed" in demo.publisher.transitions(e) or None, 15)
        # Each event is removed once approved, before its Freeze pauses the guest, so the
        # demo's ledger check (did the relay measure the pause?) has no pause to measure.
        failed = [
            o
            for o in demo.outcomes()
            if not o.ok and not o.skipped and not o.name.endswith("(ledger)")
        ]
        if failed:
            raise RuntimeError(f"the pipeline misbehaved during the bench: {failed}")
    return {
        "approve_e2e_p50_ms": round(percentile(latencies, 0.5), 1),
        "approve_e2e_p99_ms": round(percentile(latencies, 0.99), 1),
        "approve_e2e_samples": len(latencies),
    }


def _approval_of(sim: Any, event_id: str) -> Any:
    return next((a for a in sim.approvals if a.event_id == event_id), None)


PHASE = Phase(
    "approve_e2e",
    lambda a: f"approve end to end: {a.approve_samples} auto-approved events",
    lambda b: approve_e2e(b.args.approve_samples),
    targets={"approve_e2e_p99_ms": ("<=", 1500)},
    # Beside the crash points: the approvals wait on 1 s polls at real time (about 15 s of
    # CPU in 100 s), the explorer is CPU on fixed clocks; neither measures the other.
    beside_next=True,
)
