"""What one demo run is: time scale, hard limit, report path, fleet, plan, environment.

A pydantic model, so the CLI, the end-to-end tests and the bench all build a run the same
way and an impossible one (a scale set timeout outside 5 to 15 minutes) fails up front.
"""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import BaseModel, Field

from local.plan import FLEET, PLAN, Step, VmSpec

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_REPORT = ROOT / "out" / "demo-report.html"


class DemoOptions(BaseModel):
    time_scale: float = Field(default=60.0, gt=0)
    time_limit: float = Field(default=170.0, gt=0)  # the hard limit: all stopped by then
    settle: float = Field(default=3.0, ge=0)  # quiet seconds after the last event went away
    report: Path | None = DEFAULT_REPORT
    fleet: tuple[VmSpec, ...] = FLEET
    plan: tuple[Step, ...] = PLAN
    # The scale set's notBeforeTimeout: PT10M (5 to 15 minutes are allowed).
    terminate_timeout: float = Field(default=600.0, ge=300, le=900)
    # A time scale of its own per event type: at 60x a Spot eviction's 30 s notice would be
    # 0.5 s, shorter than NotBefore's one-second resolution; at 6x it is 5 s to drain in.
    type_scales: dict[str, float] = Field(default_factory=lambda: {"Preempt": 6.0})
    poll_interval: float = Field(default=0.25, gt=0)  # relays' IMDS polling (1 s in Azure)
    keep: bool = False  # keep the working directory (relay logs, inbox, processed messages)
    # Keep the stack up after the outcomes and serve the operators' pages (local.demo_pages).
    serve: bool = False
    # A Freeze pauses its VMs' guests, relays included, for the impact ledger
    # (local.demo_ledger); the bench's latency samples turn it off (a pause would delay
    # the next sample's detection, not measure the pipeline).
    play_freezes: bool = True
    # The upgrade lane (local.demo_upgrade, issue 44) restarts half the relays while the
    # plan plays; a test of what one relay does over time turns it off (a restarted relay
    # sends its VM's document afresh, which would hide whether the running one re-sends).
    upgrade_lane: bool = True
    env: dict[str, str] = Field(default_factory=lambda: dict(os.environ))


class DemoAborted(Exception):
    """Stopped by Ctrl-C, SIGTERM or the hard time limit; everything is still cleaned up."""
