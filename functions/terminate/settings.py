"""`DRAIN__*` and `UNDRAIN__*` app settings: how the drain before a disruptive event runs.

The same drain (HTTP hook, relay hook script, then approve) serves every event type a
policy rule gives the action `drain`; only the time it may take differs. A Preempt (Spot
eviction) comes with about 30 s of notice, so it gets margins of its own
(`DRAIN__PREEMPT_*`): the 30 s safety margin meant for a 5 to 15 minute scale-in would
leave it no time at all.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from functions.model.envelope import PREEMPT


class DrainSettings(BaseSettings):
    """`DRAIN__*` app settings."""

    model_config = SettingsConfigDict(env_prefix="DRAIN__", extra="ignore", case_sensitive=False)

    http_url: str | None = Field(default=None, pattern=r"^https?://")
    relay_hook: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    step_timeout_seconds: float = Field(default=120, gt=0)
    safety_margin_seconds: float = Field(default=30, ge=0)
    on_failure: Literal["approve", "hold"] = "hold"
    poll_seconds: float = Field(default=2.0, gt=0)  # relay hook status polling
    # Kept free after the drain steps for the approval call itself.
    approve_reserve_seconds: float = Field(default=10, ge=0)
    # A Preempt's ~30 s notice: approve (or let go) this long before NotBefore, and keep
    # this long for the approval after the drain steps.
    preempt_safety_margin_seconds: float = Field(default=5, ge=0)
    preempt_approve_reserve_seconds: float = Field(default=2, ge=0)
    # The drain that needs no script of the operator's (issue 38): each relay's readiness
    # probe answers 503 (relay.ready's built-in hook), then the drain waits and approves. It
    # applies only on a VM whose relay a load balancer probed lately (issue 44:
    # functions.model.drains.drain_for, from the heartbeat's `probe_at`) and where no drain
    # of the operator's applies. False: never (such events have no drain: held).
    readiness: bool = True
    # The load balancer's probe (intervalInSeconds x probeThreshold, Learn's default interval
    # is 15 s; infra/modules/relay-ready-lb.bicep uses 5 x 2): a relay probed within two
    # intervals before its heartbeat counts as behind a load balancer, and after the probe
    # turned 503 the balancer sends no new flows once this many probes failed.
    probe_interval_seconds: float = Field(default=15, ge=1, le=3600)
    probe_threshold: int = Field(default=2, ge=1, le=100)
    # Established TCP connections continue after a probe goes down (Learn,
    # load-balancer-custom-probe-overview): the time given to keep-alive, HTTP/2 and
    # WebSocket clients on the VM to finish after the balancer stopped sending new flows.
    connection_seconds: float = Field(default=30, ge=0)
    # The whole wait after the probe turned 503, instead of interval x threshold +
    # connection_seconds (the setting of releases before issue 44). Never past the drain
    # deadline.
    readiness_seconds: float | None = Field(default=None, ge=0)

    def probe_window_seconds(self) -> float:
        """How recent a load-balancer probe must be, before the relay's heartbeat, for its
        readiness drain to count: two probe intervals."""
        return 2 * self.probe_interval_seconds

    def readiness_wait_seconds(self) -> float:
        """The readiness drain's wait after the probe answered 503: the probe's timing
        (interval x threshold) plus the connection drain time, or DRAIN__READINESS_SECONDS."""
        if self.readiness_seconds is not None:
            return self.readiness_seconds
        return self.probe_interval_seconds * self.probe_threshold + self.connection_seconds

    def margins(self, event_type: str) -> tuple[float, float]:
        """(safety margin, approval reserve) in seconds for an event of this type."""
        if event_type.casefold() == PREEMPT.casefold():
            return self.preempt_safety_margin_seconds, self.preempt_approve_reserve_seconds
        return self.safety_margin_seconds, self.approve_reserve_seconds


class UndrainSettings(BaseSettings):
    """`UNDRAIN__*` app settings: how to put back a VM drained for an event that then
    ended without taking it away: cancelled by Azure (any type), or completed by a type
    after which the VM is back (Freeze, Reboot, Redeploy)."""

    model_config = SettingsConfigDict(env_prefix="UNDRAIN__", extra="ignore", case_sensitive=False)

    http_url: str | None = Field(default=None, pattern=r"^https?://")
    relay_hook: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    step_timeout_seconds: float = Field(default=120, gt=0)
    poll_seconds: float = Field(default=2.0, gt=0)
