"""Built-in maintenance scenarios and the event specs that scenario files and the control API use.

The timings are the medians Microsoft's own mock server uses (SPEC.md): a live migration is
Scheduled for 15 minutes and Started for 5, a reboot 15 and 10, a cancelled maintenance is
withdrawn after 8 minutes. They are real-world seconds; the simulator divides them by its
time scale, so the same scenario serves a 15-second test and a 15-minute rehearsal.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from functions.model.envelope import (
    FREEZE,
    PLATFORM,
    PREEMPT,
    REBOOT,
    REDEPLOY,
    STARTED,
    TERMINATE,
    USER,
)

LIVE_MIGRATION_DESCRIPTION = (
    "Virtual machine is being paused because of a memory-preserving Live Migration operation."
)

# Minimum notice per type (SPEC.md "Lifecycle") and how long a Started event stays listed.
DEFAULT_NOTICE: dict[str, float] = {
    FREEZE: 900,
    REBOOT: 900,
    REDEPLOY: 600,
    PREEMPT: 30,
    TERMINATE: 300,
}
DEFAULT_IMPACT: dict[str, float] = {
    FREEZE: 300,
    REBOOT: 600,
    REDEPLOY: 600,
    PREEMPT: 60,
    TERMINATE: 120,
}
DEFAULT_DESCRIPTION: dict[str, str] = {
    FREEZE: LIVE_MIGRATION_DESCRIPTION,
    REBOOT: "Virtual machine is going to be restarted as requested by authorized user.",
    REDEPLOY: "Virtual machine is going to be redeployed as requested by authorized user.",
    PREEMPT: "Virtual machine is being evicted because it is a Spot virtual machine.",
    TERMINATE: "Virtual machine is going to be deleted because of a scale-in operation.",
}
FALLBACK_NOTICE, FALLBACK_IMPACT = 900.0, 300.0


@dataclass(frozen=True)
class Scenario:
    """One built-in case. `needs` says which kind of VM it can target."""

    name: str
    event_type: str
    source: str
    duration: int
    notice: float | None  # None: the target scale set's terminate timeout
    impact: float
    description: str
    summary: str
    status: str = "Scheduled"
    cancel_after: float | None = None
    needs: Literal["spot", "scale-set", "set", "zone"] | None = None
    rolling: bool = False  # one VM at a time, the next when the previous event ends
    per_vm: bool = False  # one event per VM (each its own EventId), all at once


# The platform's host reboot; withdrawn ("cancelled") and set-wide rolling maintenance are
# the same event played differently.
PLATFORM_REBOOT = Scenario(
    "platform-reboot",
    REBOOT,
    PLATFORM,
    -1,
    900,
    600,
    "Host server is undergoing maintenance; the virtual machine will be restarted.",
    "Reboot, Platform: 15 min Scheduled, 10 min Started",
)

SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario(
            "live-migration",
            FREEZE,
            PLATFORM,
            5,
            900,
            300,
            LIVE_MIGRATION_DESCRIPTION,
            "Freeze 5 s, Platform: 15 min Scheduled, 5 min Started",
        ),
        Scenario(
            "host-maintenance",
            FREEZE,
            PLATFORM,
            9,
            900,
            300,
            "Host server is undergoing maintenance; the virtual machine will be paused.",
            "Freeze 9 s, Platform: 15 min Scheduled, 5 min Started",
        ),
        Scenario(
            "user-reboot",
            REBOOT,
            USER,
            -1,
            900,
            600,
            DEFAULT_DESCRIPTION[REBOOT],
            "Reboot, User: 15 min Scheduled, 10 min Started",
        ),
        Scenario(
            "user-redeploy",
            REDEPLOY,
            USER,
            -1,
            600,
            600,
            DEFAULT_DESCRIPTION[REDEPLOY],
            "Redeploy, User: 10 min Scheduled, 10 min Started",
        ),
        PLATFORM_REBOOT,
        Scenario(
            "preempt",
            PREEMPT,
            PLATFORM,
            -1,
            30,
            60,
            DEFAULT_DESCRIPTION[PREEMPT],
            "Preempt a Spot VM: 30 s Scheduled, 1 min Started",
            needs="spot",
        ),
        Scenario(
            "terminate",
            TERMINATE,
            USER,
            -1,
            None,
            120,
            DEFAULT_DESCRIPTION[TERMINATE],
            "Terminate one scale-set instance (scale-in): the set's timeout, 2 min Started",
            needs="scale-set",
        ),
        replace(
            PLATFORM_REBOOT,
            name="cancelled",
            summary="Reboot, Platform, withdrawn after 8 min while still Scheduled",
            cancel_after=480,
        ),
        Scenario(
            "hardware-failure",
            REBOOT,
            PLATFORM,
            -1,
            0,
            600,
            "Host server hardware failure; the virtual machine is being restarted.",
            "Reboot appearing directly as Started (NotBefore empty), removed after 10 min",
            status=STARTED,
        ),
        Scenario(
            "platform-redeploy",
            REDEPLOY,
            PLATFORM,
            -1,
            600,
            600,
            "Host server is undergoing maintenance; the virtual machine will be moved to "
            "another host (temporary disk lost).",
            "Redeploy, Platform: 10 min Scheduled, 10 min Started (a policy may drain it)",
        ),
        Scenario(
            "predicted-failure",
            REDEPLOY,
            PLATFORM,
            -1,
            7 * 24 * 3600,
            600,
            "Host hardware is degraded and predicted to fail; the virtual machine will be "
            "moved to another host. Redeploy it sooner to reduce the risk.",
            "Redeploy, Platform, NotBefore 7 days ahead (degraded hardware), 10 min Started",
        ),
        replace(
            PLATFORM_REBOOT,
            name="rolling-maintenance",
            summary="Reboot, Platform, one VM of a set at a time: the next gets its event when "
            "the previous one's ends (default target: the first set)",
            needs="set",
            rolling=True,
        ),
        replace(
            PLATFORM_REBOOT,
            name="zone-wave",
            summary="Reboot, Platform, every VM of an availability zone at once, one event "
            "each, across every scale set and VM there (target: zone:N, a set, VMs, or "
            "tag:NAME=VALUE; default: the first zone)",
            needs="zone",
            per_vm=True,
        ),
    )
}


class EventSpec(BaseModel):
    """An event to add now or later: either a built-in scenario or an explicit event.

    Accepts the simulator's own names (`event_type`, `notice`...) and IMDS's (`EventType`,
    `Resources`...), so a document copied from a real VM can be replayed. Unknown keys are
    rejected: a typo in a scenario file must not silently become a different event.
    """

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    at: float = Field(default=0.0, ge=0, description="offset in seconds (unscaled)")
    scenario: str | None = None
    target: str | None = None
    event_type: str | None = Field(default=None, alias="EventType", min_length=1)
    resources: list[str] | None = Field(default=None, alias="Resources", min_length=1)
    source: str | None = Field(default=None, alias="EventSource", min_length=1)
    duration: int | None = Field(default=None, alias="DurationInSeconds", ge=-1)
    description: str | None = Field(default=None, alias="Description")
    status: Literal["Scheduled", "Started"] | None = Field(default=None, alias="EventStatus")
    notice: float | None = Field(default=None, ge=0)
    impact: float | None = Field(default=None, ge=0)
    cancel_after: float | None = Field(default=None, ge=0)
    event_id: str | None = Field(default=None, alias="EventId", min_length=1)
    resource_type: str | None = Field(default=None, alias="ResourceType", min_length=1)

    @model_validator(mode="after")
    def _scenario_or_event(self) -> EventSpec:
        if self.scenario is not None:
            if self.scenario not in SCENARIOS:
                raise ValueError(
                    f"unknown scenario {self.scenario!r}; known: {', '.join(SCENARIOS)}"
                )
            extra = self.event_kwargs()
            if extra:
                raise ValueError(
                    f"a scenario takes only 'target' and 'at', not {', '.join(sorted(extra))}"
                )
        elif self.event_type is None:
            raise ValueError("give either 'scenario' or 'EventType'")
        if self.resources is not None and self.target is not None:
            raise ValueError("give either 'Resources' or 'target', not both")
        return self

    def event_kwargs(self) -> dict[str, Any]:
        """The explicit event fields that were given, as `Simulator.add_event` keywords."""
        names = (
            "event_type",
            "resources",
            "source",
            "duration",
            "description",
            "status",
            "notice",
            "impact",
            "cancel_after",
            "event_id",
            "resource_type",
        )
        return {n: getattr(self, n) for n in names if getattr(self, n) is not None}


class ScenarioFileError(ValueError):
    """A scenario file that cannot be played, with the reason and the entry at fault."""


def parse_event_specs(data: Any) -> list[EventSpec]:
    """Validate a scenario file's content: a list of specs, or {"events": [...]}."""
    if isinstance(data, dict) and set(data) == {"events"}:
        data = data["events"]
    if not isinstance(data, list):
        raise ScenarioFileError('a scenario file is a JSON list of events (or {"events": [...]})')
    specs = []
    for index, item in enumerate(data):
        try:
            specs.append(EventSpec.model_validate(item))
        except ValidationError as exc:
            reasons = "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or 'entry'}: {e['msg']}"
                for e in exc.errors(include_url=False)
            )
            raise ScenarioFileError(f"entry {index}: {reasons}") from None
    return specs


def load_scenario_file(path: str | Path) -> list[EventSpec]:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ScenarioFileError(f"cannot read {path}: {exc.strerror}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ScenarioFileError(f"{path} is not JSON: {exc}") from None
    try:
        return parse_event_specs(data)
    except ScenarioFileError as exc:
        raise ScenarioFileError(f"{path}: {exc}") from None


_ISO_DURATION = re.compile(r"^PT(?:(\d+)H)?(?:(\d+)M)?(?:(\d+)S)?$", re.IGNORECASE)


def parse_iso_duration(text: str) -> float:
    """`PT5M` -> 300.0: the format of a scale set's `notBeforeTimeout`."""
    match = _ISO_DURATION.match(text.strip())
    if not match or not any(match.groups()):
        raise ValueError(f"{text!r} is not an ISO 8601 duration like PT5M")
    hours, minutes, seconds = (int(g or 0) for g in match.groups())
    return float(hours * 3600 + minutes * 60 + seconds)
