"""The /_sim control API: add, start, cancel and remove events, play scenarios, inject faults.

A plain function from (method, path, body) to (status, JSON), so the HTTP handler stays a
thin translation. Every bad call gets a reason: a test that drives the simulator wrongly
must fail loudly, not rehearse something else.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from simulator.engine import Simulator, SimulatorError
from simulator.faults import Fault
from simulator.scenarios import SCENARIOS, EventSpec

PATHS = {
    (),
    ("state",),
    ("approvals",),
    ("events",),
    ("events", "*"),
    ("events", "*", "start"),
    ("events", "*", "cancel"),
    ("scenarios",),
    ("faults",),
    ("vms",),
    ("arm",),
    ("arm", "*"),
}


class MethodNotAllowed(SimulatorError):
    """A known control path called with the wrong method (405)."""


class UnknownPath(Exception):
    """No such control path (404)."""


class ScenarioRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    target: str | None = None
    at: float = Field(default=0.0, ge=0)


class VmRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    availability_set: str | None = None
    scale_set: str | None = None
    spot: bool = False
    zone: str | None = None
    tags: dict[str, str] | None = None


class Urls(BaseModel):
    """How the server names itself, for answers that carry URLs."""

    url: str
    vm_url: Callable[[str], str]


class ArmFaultRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    status: int = Field(ge=429, le=599)
    count: int = Field(default=1, ge=1, le=1000)
    retry_after: float = Field(default=1.0, ge=0, le=600)


class ArmGrantRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    principal: str = Field(min_length=1)
    scope: str = Field(pattern=r"^/subscriptions/")


def arm_state(arm: Any) -> dict[str, Any]:
    return {
        "grants": arm.grants,
        "faults": [{"status": s, "retry_after": r} for s, r in arm.faults],
        "calls": [vars(c) for c in arm.calls],
    }


def handle(
    sim: Simulator,
    urls: Urls,
    method: str,
    path: str,
    query: dict[str, str],
    raw_body: bytes,
    arm: Any = None,
) -> tuple[int, Any]:
    """Serve one control call. Raises SimulatorError (400), NotFound (404), MethodNotAllowed."""
    parts = [p for p in path.split("/") if p]
    body = _json_body(raw_body) if method in ("POST", "PUT") else {}
    route = (method, *parts[:1], *(["*"] if len(parts) > 1 else []), *parts[2:])
    vm_urls = {name: urls.vm_url(name) for name in sim.vm_names}
    try:
        match route:
            case ("GET",) | ("GET", "state"):
                return 200, {**sim.state(), "url": urls.url, "vm_urls": vm_urls}
            case ("GET", "approvals"):
                return 200, {"approvals": [a.model_dump(mode="json") for a in sim.approvals]}
            case ("GET", "events"):
                return 200, {"events": sim.state()["events"]}
            case ("POST", "events"):
                spec = EventSpec.model_validate(body)
                if spec.at > 0:
                    sim.schedule(spec)
                    return 200, {"EventId": None, "EventIds": [], "scheduled_in": spec.at}
                ids = sim.apply(spec)
                return 200, {"EventId": ids[0] if ids else None, "EventIds": ids}
            case ("GET", "events", "*"):
                return 200, sim.describe_event(parts[1])
            case ("POST", "events", "*", "start"):
                sim.start_event(parts[1])
                return 200, sim.describe_event(parts[1])
            case ("POST", "events", "*", "cancel"):
                sim.cancel_event(parts[1])
                return 200, sim.describe_event(parts[1])
            case ("DELETE", "events", "*"):
                sim.remove_event(parts[1])
                return 200, sim.describe_event(parts[1])
            case ("GET", "scenarios"):
                return 200, {"scenarios": {name: s.summary for name, s in SCENARIOS.items()}}
            case ("POST", "scenarios"):
                request = ScenarioRequest.model_validate(body)
                spec = EventSpec(scenario=request.name, target=request.target, at=request.at)
                if spec.at > 0:
                    sim.schedule(spec)
                    return 200, {"EventIds": [], "scheduled_in": spec.at}
                return 200, {"EventIds": sim.apply(spec)}
            case ("GET", "faults"):
                return 200, {"faults": [f.model_dump() for f in sim.faults]}
            case ("POST", "faults"):
                fault = Fault.model_validate(body)
                if fault.id or fault.used:
                    raise SimulatorError("'id' and 'used' are set by the simulator")
                return 200, {
                    "FaultId": sim.inject_fault(**fault.model_dump(exclude={"id", "used"}))
                }
            case ("DELETE", "faults"):
                return 200, {"cleared": sim.clear_faults(query.get("vm"))}
            case ("GET", "arm"):
                return 200, arm_state(arm)
            case ("POST", "arm", "*") if parts[1] == "faults":
                request = ArmFaultRequest.model_validate(body)
                if request.status != 429 and request.status < 500:
                    raise SimulatorError("an ARM fault is 429 or a 5xx status")
                arm.fail_next(request.status, request.count, request.retry_after)
                return 200, arm_state(arm)
            case ("POST", "arm", "*") if parts[1] == "grants":
                request = ArmGrantRequest.model_validate(body)
                arm.grant(request.principal, request.scope)
                return 200, arm_state(arm)
            case ("GET", "vms"):
                return 200, {"vms": vm_urls, "root": sim.root_vm()}
            case ("POST", "vms"):
                name = sim.add_vm(**VmRequest.model_validate(body).model_dump())
                return 200, {"name": name, "url": urls.vm_url(name)}
            case _:
                if route[1:] in PATHS:
                    raise MethodNotAllowed(f"{method} is not supported on /_sim{path}")
                raise UnknownPath(f"no control endpoint /_sim{path}")
    except ValidationError as exc:
        raise SimulatorError(summarize(exc)) from None


def _json_body(raw: bytes) -> dict[str, Any]:
    if not raw.strip():
        return {}
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SimulatorError(f"body is not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise SimulatorError("body must be a JSON object")
    return body


def summarize(exc: ValidationError) -> str:
    return "; ".join(
        f"{'.'.join(str(p) for p in e['loc']) or 'body'}: {e['msg']}"
        for e in exc.errors(include_url=False)
    )
