"""What Azure says about a VM, by vmId (contract §2): the facts the app acts on.

An envelope's `vm.name`, sets and callback URL are claims a compromised VM can write. Its
vmId, once attested, is not. So the name, resource group, scale set / availability set and
the address the app calls back are looked up in Azure Resource Graph by vmId, with the
function app's own identity (Reader on the VMs' scopes). One query covers standalone and
flexible-orchestration VMs (`resources`, Microsoft.Compute/virtualMachines) and uniform
scale-set instances (`computeresources`, .../virtualMachineScaleSets/virtualMachines), and
joins the NICs that name the VM (`microsoft.network/networkinterfaces`, or the scale set's
own `.../virtualMachines/networkInterfaces` for uniform instances) for the primary NIC's
primary private IPv4. One query per VM per refresh (Resource Graph throttles per caller,
about 15 queries per 5 s), cached in the identities table (registry.CachedResolver).
"""

from __future__ import annotations

import ipaddress
import logging
import re
import uuid
from datetime import UTC, datetime
from typing import Any, Protocol

import requests
from pydantic import BaseModel, ConfigDict, Field, field_validator

from functions.approvers.arm import TokenCredential, retry_after, scope_for

log = logging.getLogger(__name__)

API_VERSION = "2024-04-01"
REQUEST_TIMEOUT_SECONDS = 15.0
MAX_NAME = 200  # bounds what a row holds; Azure names are at most 80 (VM) / 90 (RG)
MAX_ID = 1024


class FactsUnavailable(Exception):
    """Transient: Resource Graph unreachable, throttled, erroring, or its answer unusable.
    The message is abandoned and retried; `retry_after` is how long Azure asked us to wait."""

    def __init__(self, reason: str, retry_after: float | None = None) -> None:
        super().__init__(reason)
        self.retry_after = retry_after


class UnknownVm(Exception):
    """Resource Graph does not know this vmId (yet: its cache lags ~60 s behind a new VM,
    so the caller retries up to the delivery count before giving up)."""


class VmFacts(BaseModel):
    """A VM as Azure describes it. `address` is None when it has no private IPv4 (no
    callback possible); `port` is for tests (None: RELAY_CALLBACK_PORT)."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    vm_id: str
    name: str = Field(max_length=MAX_NAME)
    resource_id: str = Field(max_length=MAX_ID)
    subscription_id: str = Field(max_length=64)
    resource_group: str = Field(max_length=MAX_NAME)
    scale_set: str | None = Field(default=None, max_length=MAX_NAME)
    availability_set: str | None = Field(default=None, max_length=MAX_NAME)
    address: str | None = None
    port: int | None = Field(default=None, ge=1, le=65535)
    fetched_at: datetime

    @field_validator("vm_id")
    @classmethod
    def _vm_id(cls, value: str) -> str:
        return normalise_vm_id(value)

    @field_validator("address")
    @classmethod
    def _address(cls, value: str | None) -> str | None:
        if value is None:
            return None
        address = ipaddress.ip_address(value)
        if address.version != 4:
            raise ValueError("address must be IPv4")
        return str(address)


def normalise_vm_id(value: object) -> str:
    """A vmId (or subscription id) as a lower-case canonical UUID string; ValueError
    otherwise. Everything that puts one into a query or a key goes through here (no KQL or
    key injection: 36 characters of hex and dashes, nothing else)."""
    if not isinstance(value, str) or len(value) != 36:
        raise ValueError("not a UUID")
    text = str(uuid.UUID(value))
    if text != value.lower():  # uuid.UUID also takes braces, "urn:uuid:" and no dashes
        raise ValueError("not a UUID in the 8-4-4-4-12 form")
    return text


class FactsResolver(Protocol):
    def resolve(self, vm_id: str) -> VmFacts:
        """Azure's facts for `vm_id`; raises FactsUnavailable or UnknownVm."""
        ...


class StaticResolver:
    """A dict of facts: tests and the local host, where there is no Resource Graph."""

    def __init__(self, facts: list[VmFacts] | None = None) -> None:
        self._facts: dict[str, VmFacts] = {}
        for item in facts or ():
            self.register(item)

    def register(self, facts: VmFacts) -> None:
        self._facts[facts.vm_id] = facts

    def resolve(self, vm_id: str) -> VmFacts:
        try:
            return self._facts[normalise_vm_id(vm_id)]
        except (KeyError, ValueError):
            raise UnknownVm(f"vmId {vm_id[:40]!r} is not registered") from None


def facts_query(vm_id: str) -> str:
    """The KQL for one vmId (validated as a UUID first: it is pasted into the query)."""
    vm_id = normalise_vm_id(vm_id)
    return f"""union
(resources
 | where type =~ 'microsoft.compute/virtualmachines'
 | where tolower(tostring(properties.vmId)) == '{vm_id}'
 | project vmKey = tolower(id), id, subscriptionId, resourceGroup,
     vmId = tostring(properties.vmId), kind = 'vm',
     scaleSetId = tostring(properties.virtualMachineScaleSet.id),
     availabilitySetId = tostring(properties.availabilitySet.id)),
(computeresources
 | where type =~ 'microsoft.compute/virtualmachinescalesets/virtualmachines'
 | where tolower(tostring(properties.vmId)) == '{vm_id}'
 | project vmKey = tolower(id), id, subscriptionId, resourceGroup,
     vmId = tostring(properties.vmId), kind = 'uniform', scaleSetId = '',
     availabilitySetId = tostring(properties.availabilitySet.id))
| join kind=leftouter (
    union
      (resources | where type =~ 'microsoft.network/networkinterfaces'),
      (computeresources | where type =~
         'microsoft.compute/virtualmachinescalesets/virtualmachines/networkinterfaces')
    | extend vmKey = tolower(tostring(properties.virtualMachine.id))
    | where isnotempty(vmKey)
    | mv-expand ipc = properties.ipConfigurations
    | project vmKey, nicId = tostring(id), nicPrimary = tostring(properties.primary),
        ipPrimary = tostring(ipc.properties.primary),
        privateIp = tostring(ipc.properties.privateIPAddress),
        ipVersion = tostring(ipc.properties.privateIPAddressVersion)
  ) on vmKey
| project id, subscriptionId, resourceGroup, vmId, kind, scaleSetId, availabilitySetId,
    nicId, nicPrimary, ipPrimary, privateIp, ipVersion
| limit 200"""


_ID = re.compile(
    r"^/subscriptions/(?P<sub>[^/]+)/resourceGroups/(?P<rg>[^/]+)/providers/"
    r"Microsoft\.Compute/(?:virtualMachines/(?P<vm>[^/]+)|virtualMachineScaleSets/"
    r"(?P<ss>[^/]+)/virtualMachines/(?P<instance>[^/]+))$",
    re.IGNORECASE,
)


def _last_segment(resource_id: str) -> str | None:
    return resource_id.rstrip("/").rsplit("/", 1)[-1] or None if resource_id else None


def _truthy(value: object) -> bool:
    return str(value).strip().lower() == "true"


def _primary_ipv4(rows: list[dict[str, Any]]) -> str | None:
    """The primary NIC's primary IPv4: a NIC/ipconfig flagged primary wins; a VM with one
    NIC (or one ipconfig) has it unflagged. Deterministic otherwise (sorted)."""
    candidates = []
    for row in rows:
        try:
            address = ipaddress.ip_address(str(row.get("privateIp") or ""))
        except ValueError:
            continue
        if address.version != 4:
            continue
        nics = {str(r.get("nicId") or "").lower() for r in rows if r.get("nicId")}
        nic_rank = 0 if _truthy(row.get("nicPrimary")) or len(nics) <= 1 else 1
        ip_rank = 0 if _truthy(row.get("ipPrimary")) else 1
        candidates.append((nic_rank, ip_rank, str(row.get("nicId") or ""), str(address)))
    return min(candidates)[3] if candidates else None


def facts_from_rows(vm_id: str, rows: list[dict[str, Any]], now: datetime) -> VmFacts:
    """Resource Graph rows (one per NIC ipconfig of the VM) -> VmFacts."""
    vm_id = normalise_vm_id(vm_id)
    mine = [r for r in rows if str(r.get("vmId", "")).lower() == vm_id]
    if not mine:
        raise UnknownVm(f"vmId {vm_id} not in Resource Graph")
    ids = {str(r.get("id", "")).lower() for r in mine}
    if len(ids) != 1:  # the vmId is unique per VM; two resources claiming it: do not guess
        raise FactsUnavailable(f"vmId {vm_id} names {len(ids)} resources in Resource Graph")
    first = mine[0]
    resource_id = str(first.get("id", ""))
    match = _ID.match(resource_id)
    if match is None:
        raise FactsUnavailable(f"unexpected resource id {resource_id[:200]!r}")
    if match["vm"]:
        name = match["vm"]
        scale_set = _last_segment(str(first.get("scaleSetId") or ""))
    else:
        scale_set = match["ss"]
        name = f"{scale_set}_{match['instance']}"
    try:
        return VmFacts(
            vm_id=vm_id,
            name=name,
            resource_id=resource_id,
            subscription_id=str(first.get("subscriptionId") or match["sub"]).lower(),
            resource_group=str(first.get("resourceGroup") or match["rg"]),
            scale_set=scale_set,
            availability_set=_last_segment(str(first.get("availabilitySetId") or "")),
            address=_primary_ipv4(mine),
            fetched_at=now,
        )
    except ValueError as exc:
        raise FactsUnavailable(f"Resource Graph row not usable: {str(exc)[:200]}") from None


class ResourceGraphResolver:
    """Resolves through `POST {arm}/providers/Microsoft.ResourceGraph/resources`."""

    def __init__(
        self,
        session: requests.Session,
        credential: TokenCredential,
        arm_endpoint: str = "https://management.azure.com",
        subscriptions: tuple[str, ...] | list[str] = (),
        clock: Any = None,
    ) -> None:
        self.session = session
        self.credential = credential
        self.endpoint = arm_endpoint.rstrip("/")
        self.subscriptions = [normalise_vm_id(s) for s in subscriptions]  # UUIDs, too
        self.clock = clock or (lambda: datetime.now(UTC))

    @property
    def url(self) -> str:
        return f"{self.endpoint}/providers/Microsoft.ResourceGraph/resources"

    def resolve(self, vm_id: str) -> VmFacts:
        try:
            query = facts_query(vm_id)
        except ValueError:
            raise UnknownVm(f"vmId {str(vm_id)[:40]!r} is not a UUID") from None
        body: dict[str, Any] = {"query": query, "options": {"resultFormat": "objectArray"}}
        if self.subscriptions:
            body["subscriptions"] = self.subscriptions
        try:
            token = self.credential.get_token(scope_for(self.endpoint))
        except Exception as exc:  # azure-identity raises several types
            raise FactsUnavailable(f"no token for Resource Graph: {type(exc).__name__}") from None
        try:
            answer = self.session.post(
                self.url,
                params={"api-version": API_VERSION},
                json=body,
                headers={
                    "Authorization": f"Bearer {token.token}",  # type: ignore[attr-defined]
                    "Accept": "application/json",
                },
                timeout=REQUEST_TIMEOUT_SECONDS,
                allow_redirects=False,
            )
        except requests.RequestException as exc:
            raise FactsUnavailable(f"Resource Graph unreachable: {type(exc).__name__}") from None
        if answer.status_code != 200:
            raise FactsUnavailable(
                f"Resource Graph {answer.status_code}{_error_code(answer)}",
                retry_after=_wait(answer),
            )
        quota = answer.headers.get("x-ms-user-quota-remaining")
        if quota is not None and quota.strip() in ("0", "1"):
            log.info(
                "Resource Graph quota nearly spent (remaining %s, resets after %s)",
                quota,
                answer.headers.get("x-ms-user-quota-resets-after"),
            )
        try:
            data = answer.json()
            rows = data["data"]
            if isinstance(rows, dict):  # the table format: {"columns": [...], "rows": [...]}
                names = [c["name"] for c in rows["columns"]]
                rows = [dict(zip(names, row, strict=False)) for row in rows["rows"]]
            if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
                raise TypeError("data is not a list of objects")
        except (ValueError, KeyError, TypeError) as exc:
            raise FactsUnavailable(f"Resource Graph answer not understood: {exc!r}"[:300]) from None
        return facts_from_rows(vm_id, rows, self.clock())


def _error_code(answer: requests.Response) -> str:
    try:
        error = answer.json().get("error") or {}
        return f" {str(error.get('code', ''))[:80]}".rstrip()
    except (ValueError, AttributeError):
        return ""


def _wait(answer: requests.Response) -> float | None:
    """How long Azure asked us to wait: Retry-After, or Resource Graph's own
    x-ms-user-quota-resets-after (hh:mm:ss) when the quota is spent."""
    wait = retry_after(answer)
    if wait is not None:
        return wait
    resets = answer.headers.get("x-ms-user-quota-resets-after")
    if resets:
        try:
            h, m, s = resets.split(":")
            return int(h) * 3600 + int(m) * 60 + float(s)
        except ValueError:
            return None
    return None
