"""A stand-in for Azure Resource Manager's Scheduled Events `acknowledge`, served under /arm.

It checks what ARM checks, in ARM's order, and answers in ARM's error shape
(`{"error": {"code", "message"}}`), so the function app's ARM approver is tested against
every answer it must handle:

- the path: `/subscriptions/{sub}/resourcegroups/{rg}/providers/Microsoft.Compute/{type}/
  {name}/providers/Microsoft.Maintenance/scheduledevents/{EventId}/acknowledge`, POST only
  (404 InvalidResourceType / ResourceNotFound / ResourceGroupNotFound otherwise);
- `api-version` present (400 MissingApiVersionParameter) and one the provider serves (400
  NoRegisteredProviderFound);
- a bearer token (401 AuthenticationFailed) that is one the simulator's managed-identity
  endpoint issued, unexpired, for this audience (401 InvalidAuthenticationToken...);
- that the caller holds `Microsoft.Maintenance/scheduledevents/acknowledge/action` at the
  resource or above (403 AuthorizationFailed), when grants are configured;
- that the resource owns the event (404 `{"Error": {"Code": "InvalidScheduledEventId",
  "Message": "Scheduled event not found"}}`, capitalised keys, as Azure answered in
  azure-powershell's recorded TestApproveAzScheduledEvents) and that it is still Scheduled
  (409 Conflict: what Azure answers there is not recorded).
Then it starts the event for all its Resources, as ARM does, and answers as recorded:
200 `{"value": "Successfully approved scheduled event"}`. Faults: 429 (with Retry-After) or
5xx on the next calls, on demand.

The list form (`POST .../providers/Microsoft.Maintenance/scheduledevents` with
`{"value": [EventId, ...]}`, the spec's ScheduledEvents_AcknowledgeList) makes the same
checks. All listed events Scheduled on that owner: all approved, 200 `{"value":
"Successfully approved all Scheduled Events in the list"}`. Some not found there: 207
MultiStatus in the recorded shape (`{"error": {"code": "MultiStatusResponse", "message",
"details": [{"target", "code", "message"}]}}`), one result per listed event in the
request's order: the Scheduled ones approved ("OK", as azure-powershell's own unit test
ApproveAzureRmScheduledEventListTests shows), the others "NotFound" "Scheduled event not
found". One no longer Scheduled: 409, none approved, each failing event named (`target`).

It also serves Azure Resource Graph's `POST /providers/Microsoft.ResourceGraph/resources`
for the function app's facts resolver and bulk sync (functions.identity.facts, .sync): same
bearer-token checks, then simulator.resource_graph (the documented query limits, 1,000-row
pages with `$skipToken`, the 15-per-5-s quota), rows shaped like the facts queries'
projection, one per NIC. Each simulated VM gets its own loopback
address, 127.0.0.2 + its index in the simulator (stable while the simulator lives), so a
test can run one relay per VM on one machine and the app still calls each at its own.
"""

from __future__ import annotations

import base64
import ipaddress
import json
import re
import threading
import uuid
from dataclasses import dataclass, field
from typing import Any

from functions.model.envelope import SCHEDULED
from simulator import instance
from simulator.engine import Conflict, NotFound, Simulator
from simulator.maintenance import scheduled_event_rows
from simulator.resource_graph import ResourceGraphService, vm_row

ACTION = "Microsoft.Maintenance/scheduledevents/acknowledge/action"
API_VERSIONS = ("2023-10-01-preview", "2025-10-01-preview", "2025-11-01")
PUBLIC_AUDIENCES = ("https://management.azure.com", "https://management.core.windows.net")

_PATH = re.compile(
    r"^/subscriptions/(?P<sub>[^/]+)/resourcegroups/(?P<rg>[^/]+)/providers/microsoft\.compute"
    r"/(?P<type>[^/]+)/(?P<name>[^/]+)/providers/microsoft\.maintenance/scheduledevents"
    r"/(?P<event>[^/]+)/acknowledge$",
    re.IGNORECASE,
)
# ScheduledEvents_AcknowledgeList (azure-rest-api-specs Microsoft.Maintenance stable/2025-11-01
# Maintenance.json @ bb074ee7): POST to the owner's scheduledevents collection, body
# ScheduledEventsIdList {"value": [ids]} (required); 200 ScheduledEventsApproveResponse,
# else ScheduledEventsListAcknowledgeError {"error": {code, message, details: [{target,
# code, message}]}}. First served in 2025-10-01-preview. Azure's real answers (recorded by
# azure-powershell, tests/conformance/SOURCES.md): the texts below, and 207 per event.
_LIST_PATH = re.compile(
    r"^/subscriptions/(?P<sub>[^/]+)/resourcegroups/(?P<rg>[^/]+)/providers/microsoft\.compute"
    r"/(?P<type>[^/]+)/(?P<name>[^/]+)/providers/microsoft\.maintenance/scheduledevents$",
    re.IGNORECASE,
)
LIST_API_VERSIONS = ("2025-10-01-preview", "2025-11-01")
APPROVED_ONE = "Successfully approved scheduled event"
APPROVED_LIST = "Successfully approved all Scheduled Events in the list"
NOT_FOUND = "Scheduled event not found"
MULTI_STATUS_MESSAGE = (
    "The operation returned different statuses for the Scheduled Events. "
    "Review each event's result for details."
)
_TYPES = {
    "virtualmachines": "virtualMachines",
    "virtualmachinescalesets": "virtualMachineScaleSets",
    "availabilitysets": "availabilitySets",
}


RESOURCE_GRAPH_PATH = "/providers/microsoft.resourcegraph/resources"
SIMULATED_REGION = "eastus"  # every simulated VM's `location` (Resource Graph's column)
RESOURCE_GRAPH_API_VERSIONS = ("2021-03-01", "2022-10-01", "2024-04-01")
FIRST_ADDRESS = ipaddress.IPv4Address("127.0.0.2")


def simulated_vm_id(name: str) -> str:
    """The vmId the simulator's IMDS gives VM `name` (as simulator.instance.compute)."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"relay-simulator/{name}"))


def _post_version(method: str, query: dict[str, str]) -> str:
    """What every Resource Manager POST here checks first: the method, an api-version."""
    if method != "POST":
        raise _Refusal(405, "MethodNotAllowed", f"{method} is not allowed here.")
    version = query.get("api-version")
    if not version:
        raise _Refusal(
            400,
            "MissingApiVersionParameter",
            "The api-version query parameter (?api-version=) is required for all requests.",
        )
    return version


def simulated_address(index: int) -> str:
    """The private address of the simulator's VM number `index` (0-based): 127.0.0.2 on."""
    return str(FIRST_ADDRESS + index)


@dataclass
class ArmCall:
    """One acknowledge request as received, and what was answered."""

    path: str
    status: int
    code: str
    principal: str | None


@dataclass
class ArmService:
    """The state behind /arm: who may acknowledge where, and injected faults."""

    sim: Simulator
    audience: str = ""  # the server's own /arm URL, set by the server
    # principal (token appid) -> scopes where it holds the acknowledge action; None: any
    # caller with a valid token may (the role is assigned at the subscription).
    grants: dict[str, list[str]] | None = None
    faults: list[tuple[int, float]] = field(default_factory=list)  # (status, Retry-After)
    calls: list[ArmCall] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    # Resource Graph behind the same checks (simulator.resource_graph): its limits, pages
    # and quota; `inventory` answers from the simulated VMs.
    graph: ResourceGraphService = field(init=False)

    def __post_init__(self) -> None:
        self.graph = ResourceGraphService(inventory=self.inventory)

    def grant(self, principal: str, scope: str) -> None:
        """Assign the acknowledge action to `principal` at `scope` (an ARM id prefix)."""
        with self._lock:
            self.grants = self.grants or {}
            self.grants.setdefault(principal, []).append(scope.rstrip("/"))

    def fail_next(self, status: int, count: int = 1, retry_after: float = 1.0) -> None:
        """Answer the next `count` well-formed calls with `status` (429 or 5xx)."""
        with self._lock:
            self.faults.extend([(status, retry_after)] * count)

    def handle(
        self, method: str, path: str, query: dict[str, str], headers: Any, body: bytes = b""
    ) -> tuple[int, dict[str, Any], dict[str, str]]:
        seen: dict[str, str] = {}
        request_body = body
        try:
            if path.rstrip("/").casefold() == RESOURCE_GRAPH_PATH:
                status, body, extra = self._resource_graph(
                    method, query, headers, request_body, seen
                )
            elif _LIST_PATH.match(path):
                status, body, extra = self._answer_list(
                    method, path, query, headers, request_body, seen
                )
            else:
                status, body, extra = self._answer(method, path, query, headers, seen)
        except _Refusal as refusal:
            status, body, extra = refusal.answer()
        principal = seen.get("principal")
        code = _code(body)
        with self._lock:
            self.calls.append(ArmCall(path=path, status=status, code=code, principal=principal))
        return status, body, extra

    def _answer(
        self, method: str, path: str, query: dict[str, str], headers: Any, seen: dict[str, str]
    ) -> tuple[int, dict[str, Any], dict[str, str]]:
        match = _PATH.match(path)
        if match is None:
            raise _Refusal(404, "InvalidResourceType", f"No route for {path!r}.")
        version = _post_version(method, query)
        if version not in API_VERSIONS:
            raise _Refusal(
                400,
                "NoRegisteredProviderFound",
                f"No registered resource provider found for API version '{version}' and type "
                f"'scheduledevents'. The supported api-versions are '{', '.join(API_VERSIONS)}'.",
            )
        claims = self._token(headers.get("Authorization"))
        principal = seen["principal"] = str(claims.get("appid") or claims.get("oid") or "")
        resource_type = _TYPES.get(match["type"].casefold())
        scope = (
            f"/subscriptions/{match['sub']}/resourcegroups/{match['rg']}/providers/"
            f"Microsoft.Compute/{match['type']}/{match['name']}"
        )
        if not self._allowed(principal, scope):
            raise _Refusal(
                403,
                "AuthorizationFailed",
                f"The client '{principal}' with object id '{principal}' does not have "
                f"authorization to perform action '{ACTION}' over scope '{scope}/providers/"
                f"Microsoft.Maintenance/scheduledevents/{match['event']}' or the scope is "
                "invalid. If access was recently granted, please refresh your credentials.",
            )
        if match["sub"].casefold() != instance.SUBSCRIPTION_ID:
            raise _Refusal(
                404,
                "SubscriptionNotFound",
                f"The subscription '{match['sub']}' could not be found.",
            )
        if match["rg"].casefold() != instance.RESOURCE_GROUP.casefold():
            raise _Refusal(
                404, "ResourceGroupNotFound", f"Resource group '{match['rg']}' could not be found."
            )
        if resource_type is None:
            raise _Refusal(
                404,
                "InvalidResourceType",
                f"The resource type '{match['type']}' could not be found in the namespace "
                "'Microsoft.Compute' for scheduled events.",
            )
        if not self.sim.owns(resource_type, match["name"]):
            raise _Refusal(
                404,
                "ResourceNotFound",
                f"The Resource 'Microsoft.Compute/{resource_type}/{match['name']}' under "
                f"resource group '{match['rg']}' was not found.",
            )
        with self._lock:
            fault = self.faults.pop(0) if self.faults else None
        if fault is not None:
            status, wait = fault
            code = "TooManyRequests" if status == 429 else "InternalServerError"
            headers_out = {"Retry-After": f"{wait:g}"} if status in (429, 503) else {}
            body = {"error": {"code": code, "message": f"Simulated {status}."}}
            return status, body, headers_out
        try:
            self.sim.acknowledge(resource_type, match["name"], match["event"])
        except Conflict as exc:
            raise _Refusal(409, "Conflict", str(exc)) from None
        except NotFound:
            raise _Refusal(404, "InvalidScheduledEventId", NOT_FOUND, capitalised=True) from None
        return 200, {"value": APPROVED_ONE}, {}

    def _answer_list(
        self,
        method: str,
        path: str,
        query: dict[str, str],
        headers: Any,
        body: bytes,
        seen: dict[str, str],
    ) -> tuple[int, dict[str, Any], dict[str, str]]:
        """The list form: the same checks as one acknowledge, then per listed event: all
        Scheduled on this owner, 200; one no longer Scheduled, 409 and none approved; else
        207, the Scheduled ones approved and each event's result in `details`."""
        match = _LIST_PATH.match(path)
        assert match is not None
        version = _post_version(method, query)
        if version not in LIST_API_VERSIONS:
            raise _Refusal(
                400,
                "NoRegisteredProviderFound",
                f"No registered resource provider found for API version '{version}' and type "
                "'scheduledevents'. The supported api-versions are "
                f"'{', '.join(LIST_API_VERSIONS)}'.",
            )
        claims = self._token(headers.get("Authorization"))
        principal = seen["principal"] = str(claims.get("appid") or claims.get("oid") or "")
        try:
            ids = json.loads(body or b"null")["value"]
            if not isinstance(ids, list) or not ids or not all(isinstance(i, str) for i in ids):
                raise TypeError("value")
        except (ValueError, KeyError, TypeError):
            raise _Refusal(
                400,
                "InvalidRequestContent",
                'The request body must be a ScheduledEventsIdList: {"value": [ids]}.',
            ) from None
        resource_type = _TYPES.get(match["type"].casefold())
        scope = (
            f"/subscriptions/{match['sub']}/resourcegroups/{match['rg']}/providers/"
            f"Microsoft.Compute/{match['type']}/{match['name']}"
        )
        if not self._allowed(principal, scope):
            raise _Refusal(
                403,
                "AuthorizationFailed",
                f"The client '{principal}' with object id '{principal}' does not have "
                f"authorization to perform action '{ACTION}' over scope '{scope}/providers/"
                "Microsoft.Maintenance/scheduledevents' or the scope is invalid.",
            )
        if (
            match["sub"].casefold() != instance.SUBSCRIPTION_ID
            or match["rg"].casefold() != instance.RESOURCE_GROUP.casefold()
            or resource_type is None
            or not self.sim.owns(resource_type, match["name"])
        ):
            raise _Refusal(
                404,
                "ResourceNotFound",
                f"The Resource 'Microsoft.Compute/{match['type']}/{match['name']}' under "
                f"resource group '{match['rg']}' was not found.",
            )
        with self._lock:
            fault = self.faults.pop(0) if self.faults else None
        if fault is not None:
            status, wait = fault
            code = "TooManyRequests" if status == 429 else "InternalServerError"
            headers_out = {"Retry-After": f"{wait:g}"} if status in (429, 503) else {}
            return status, {"error": {"code": code, "message": f"Simulated {status}."}}, headers_out
        with self.sim._lock:  # checked and approved as one
            refusals = {i: self._list_refusal(resource_type, match["name"], i) for i in ids}
            details = [d for d in refusals.values() if d]
            if any(d["code"] == "Conflict" for d in details):
                message = f"{len(details)} of {len(ids)} scheduled events cannot be acknowledged."
                return (
                    409,
                    {"error": {"code": "Conflict", "message": message, "details": details}},
                    {},
                )
            results: list[dict[str, str]] = []
            done: set[str] = set()
            for event_id in ids:
                refusal = refusals[event_id]
                if refusal is None:
                    if event_id not in done:  # an id listed twice is approved once
                        self.sim.acknowledge(resource_type, match["name"], event_id)
                        done.add(event_id)
                    refusal = {"target": event_id, "code": "OK", "message": APPROVED_ONE}
                results.append(refusal)
        if details:
            return (
                207,
                {
                    "error": {
                        "code": "MultiStatusResponse",
                        "message": MULTI_STATUS_MESSAGE,
                        "details": results,
                    }
                },
                {},
            )
        return 200, {"value": APPROVED_LIST}, {}

    def _list_refusal(self, resource_type: str, name: str, event_id: str) -> dict[str, str] | None:
        """Why one id of a list cannot be acknowledged by `name`, as an error detail."""
        try:
            event = self.sim.event(event_id)
        except NotFound:
            return {"target": event_id, "code": "NotFound", "message": NOT_FOUND}
        kind, owner = self.sim.owner_of(event)
        if kind != resource_type or owner.casefold() != name.casefold():
            return {"target": event_id, "code": "NotFound", "message": NOT_FOUND}
        if not event.active or event.status != SCHEDULED:
            return {
                "target": event_id,
                "code": "Conflict",
                "message": f"The scheduled event is {self.sim.grid_status(event)}: only a "
                "Scheduled event can be acknowledged.",
            }
        return None

    # ------------------------------------------------------------------ Resource Graph

    def _resource_graph(
        self, method: str, query: dict[str, str], headers: Any, body: bytes, seen: dict[str, str]
    ) -> tuple[int, dict[str, Any], dict[str, str]]:
        version = _post_version(method, query)
        if version not in RESOURCE_GRAPH_API_VERSIONS:
            raise _Refusal(
                400,
                "InvalidApiVersionParameter",
                f"The api-version '{version}' is invalid. The supported versions are "
                f"'{', '.join(RESOURCE_GRAPH_API_VERSIONS)}'.",
            )
        claims = self._token(headers.get("Authorization"))
        seen["principal"] = str(claims.get("appid") or claims.get("oid") or "")
        try:
            request = json.loads(body or b"{}")
            kql = request["query"]
            if not isinstance(kql, str):
                raise TypeError("query")
        except (ValueError, KeyError, TypeError):
            raise _Refusal(400, "BadRequest", "The request body must hold a query.") from None
        subscriptions = request.get("subscriptions")
        with self._lock:
            fault = self.faults.pop(0) if self.faults else None
        if fault is not None:
            status, wait = fault
            code = "RateLimiting" if status == 429 else "InternalServerError"
            out = {"Retry-After": f"{wait:g}"} if status in (429, 503) else {}
            if status == 429:
                out["x-ms-user-quota-remaining"] = "0"
                out["x-ms-user-quota-resets-after"] = f"00:00:{max(1, int(wait)):02d}"
            return status, {"error": {"code": code, "message": f"Simulated {status}."}}, out
        scope = None if subscriptions is None else {str(s).casefold() for s in subscriptions}
        return self.graph.answer(seen["principal"], request, scope)

    def inventory(self) -> list[dict[str, Any]]:
        """Every simulated VM as the facts queries project it: standalone VMs in
        `resources`, scale-set instances (uniform) in `computeresources`; one NIC each."""
        base = (
            f"/subscriptions/{instance.SUBSCRIPTION_ID}/resourceGroups/"
            f"{instance.RESOURCE_GROUP}/providers"
        )
        rows = []
        for index, name in enumerate(self.sim.vm_names):
            vm = self.sim.describe_vm(name)
            resource_id = instance.resource_id(vm)
            if vm["scale_set"]:
                table = "computeresources"
                nic = f"{resource_id}/networkInterfaces/{vm['scale_set']}-nic"
            else:
                table = "resources"
                nic = f"{base}/Microsoft.Network/networkInterfaces/{name}-nic"
            availability = (
                f"{base}/Microsoft.Compute/availabilitySets/{vm['availability_set']}"
                if vm["availability_set"]
                else ""
            )
            rows.append(
                vm_row(
                    table=table,
                    resource_id=resource_id,
                    subscription_id=instance.SUBSCRIPTION_ID,
                    resource_group=instance.RESOURCE_GROUP.lower(),
                    vm_id=simulated_vm_id(name),
                    nic_id=nic,
                    address=simulated_address(index),
                    availability_set_id=availability,
                    tags=vm["tags"] or None,
                    zones=[vm["zone"]] if vm["zone"] else None,
                    location=SIMULATED_REGION,
                )
            )
        rows.extend(scheduled_event_rows(self.sim))  # maintenanceresources (Azure's events)
        return rows

    def _token(self, header: str | None) -> dict[str, Any]:
        if not header:
            raise _Refusal(
                401,
                "AuthenticationFailed",
                "Authentication failed. The 'Authorization' header is missing.",
            )
        scheme, _, token = header.partition(" ")
        if scheme.casefold() != "bearer" or not token.strip():
            raise _Refusal(
                401,
                "AuthenticationFailed",
                "Authentication failed. The 'Authorization' header is provided in an invalid "
                "format.",
            )
        try:
            payload = token.strip().split(".")[1]
            claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
            if not isinstance(claims, dict) or claims.get("iss") != "relay-simulator":
                raise ValueError("issuer")
        except (IndexError, ValueError, UnicodeDecodeError):
            raise _Refusal(
                401, "InvalidAuthenticationToken", "The access token is invalid."
            ) from None
        if float(claims.get("exp", 0)) <= self.sim.clock():
            raise _Refusal(
                401,
                "ExpiredAuthenticationToken",
                "The access token expiry UTC time is in the past.",
            )
        audiences = {a.rstrip("/").casefold() for a in (*PUBLIC_AUDIENCES, self.audience) if a}
        if str(claims.get("aud", "")).rstrip("/").casefold() not in audiences:
            raise _Refusal(
                401,
                "InvalidAuthenticationTokenAudience",
                f"The access token has been obtained for wrong audience or resource "
                f"'{claims.get('aud')}'. It should exactly match with one of the allowed "
                f"audiences {sorted(audiences)}.",
            )
        return claims

    def _allowed(self, principal: str, scope: str) -> bool:
        with self._lock:
            if self.grants is None:
                return True
            held = self.grants.get(principal, [])
        target = scope.casefold()
        return any(target == s.casefold() or target.startswith(s.casefold() + "/") for s in held)


def _code(body: object) -> str:
    """The error code of an answer, in either case Azure spells the keys."""
    if not isinstance(body, dict):
        return ""
    error = body.get("error") or body.get("Error")
    if not isinstance(error, dict):
        return ""
    return str(error.get("code") or error.get("Code") or "")


class _Refusal(Exception):
    """An ARM error answer: raised where a check fails, answered by `handle`. Resource
    Manager answers `{"error": {"code", "message"}}`; the Maintenance provider's own 404 for
    an unknown event has capitalised keys (`capitalised`), as recorded from Azure."""

    def __init__(self, status: int, code: str, message: str, *, capitalised: bool = False) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message
        self.capitalised = capitalised

    def answer(self) -> tuple[int, dict[str, Any], dict[str, str]]:
        if self.capitalised:
            return self.status, {"Error": {"Code": self.code, "Message": self.message}}, {}
        return self.status, {"error": {"code": self.code, "message": self.message}}, {}
