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
    # probe answers 503 (relay.ready's built-in hook), then the drain waits
    # `readiness_seconds` and approves. It applies where no relay hook of the operator's
    # does: with neither DRAIN__RELAY_HOOK nor DRAIN__HTTP_URL set, and on a VM whose relay
    # lacks DRAIN__RELAY_HOOK (functions.terminate.plan.relay_drain). False: those events
    # are held until NotBefore, as before.
    readiness: bool = True
    # The stated drain time: an Azure Load Balancer sends no new flows to a VM after its
    # probe failed probeThreshold times (2 x 5 s in infra/modules/relay-ready-lb.bicep);
    # the rest lets requests in flight finish. Never past the drain deadline.
    readiness_seconds: float = Field(default=30, ge=0)

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
