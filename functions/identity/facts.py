"""What Azure says about a VM, by vmId (contract §2): the facts the app acts on.

An envelope's `vm.name`, sets and callback URL are claims a compromised VM can write. Its
vmId, once attested, is not. So the name, resource group, scale set / availability set and
the address the app calls back are looked up in Azure Resource Graph by vmId, with the
function app's own identity (Reader on the VMs' scopes). Two queries, each on one table as
Resource Graph's documented limits require (see `vm_query`): `resources` for standalone and
flexible-orchestration VMs with their NICs, `computeresources` for uniform scale-set
instances with theirs; the primary NIC's primary private IPv4 is the callback address.
The bulk sync (functions.identity.sync) pages both into the identities table for the whole
fleet; `ResourceGraphResolver` asks about one vmId only when the sync has not stored it
(registry.CachedResolver).
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

from functions.approvers.arm import TokenCredential
from functions.identity.resource_graph import (
    FactsUnavailable,
    ResourceGraph,
    ResourceGraphRefused,
)
from functions.model.budgets import Placement
from functions.model.match import MAX_TAG_NAME, MAX_TAG_VALUE, MAX_TAGS

log = logging.getLogger(__name__)

MAX_NAME = 200  # bounds what a row holds; Azure names are at most 80 (VM) / 90 (RG)
MAX_ID = 1024
MAX_IP_CONFIGURATIONS = 256  # per NIC, Azure's own limit
MAX_ZONE = 64  # Azure's zones are "1", "2", "3"
# What the tags of one VM may take in its row (the facts' JSON is one Table property, at
# most 32 K UTF-16 units). Azure's own limits (50 tags, names of 512 and values of 256
# characters) can exceed it in theory; tags past it are left out, counted and logged.
MAX_TAGS_CHARS = 20_000


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
    # What disruption budgets group by (functions.model.budgets): Azure's tags on the VM
    # and its availability zone (None: not zonal). Rows written before these were read
    # have neither; the next sync pass fills them in.
    tags: dict[str, str] = Field(default_factory=dict)
    tags_dropped: int = 0
    zone: str | None = Field(default=None, max_length=MAX_ZONE)
    # Azure's region (`location`): a zone number names a datacenter only within one region
    # of one subscription (Learn, availability-zones-overview), so budgets key zones by all
    # three. Rows written before it was read have none; the next sync pass fills it in.
    location: str | None = Field(default=None, max_length=MAX_ZONE)

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


# The documented limits (MicrosoftDocs/azure-docs, articles/governance/resource-graph/
# concepts/query-language.md @ 03982e63): `union` only within one table or between
# Resources and ResourceContainers, at most 3 legs; at most 3 `join`, one of them across
# tables; at most 3 `mv-expand`. So each query reads one table, and joins it only with
# itself (no cross-table join, no union, no mv-expand: a NIC's ipConfigurations come back
# as one array and are read here). Which table holds what: reference/supported-tables-
# resources.md @ 00ec1e2f: `resources` holds microsoft.compute/virtualmachines (standalone
# VMs and flexible scale-set members) and microsoft.network/networkinterfaces;
# `computeresources` holds microsoft.compute/virtualmachinescalesets/virtualmachines (uniform
# instances) and .../virtualmachines/networkinterfaces. The property paths are those of
# Azure/azure-rest-api-specs examples: NetworkInterfaceGet.json (network 2024-05-01 @
# 25683164: properties.virtualMachine.id, properties.primary, ipConfigurations[].properties.
# {primary, privateIPAddress, privateIPAddressVersion}) and VirtualMachineScaleSetVM_Get_
# WithUserData.json (compute 2024-07-01 @ 38a91431: properties.vmId). A VM's `tags` (an
# object) and `zones` (an array of one zone) are top-level properties of both resources:
# VirtualMachine_List_MaximumSet_Gen.json @ 19c6a456 and VirtualMachineScaleSetVM_List_
# MaximumSet_Gen.json @ 49183a62 (compute 2024-07-01); Resource Graph has them as the
# `tags` and `zones` columns of every row. Rows come ordered by `id` so one VM's rows (one
# per NIC) are adjacent across pages.
VM_TABLE = "resources"
UNIFORM_TABLE = "computeresources"
_SHAPES = {
    VM_TABLE: (
        "microsoft.compute/virtualmachines",
        "microsoft.network/networkinterfaces",
        "tostring(properties.virtualMachineScaleSet.id)",
    ),
    UNIFORM_TABLE: (
        "microsoft.compute/virtualmachinescalesets/virtualmachines",
        "microsoft.compute/virtualmachinescalesets/virtualmachines/networkinterfaces",
        "''",
    ),
}
TABLES = tuple(_SHAPES)


def vm_query(table: str, vm_id: str | None = None) -> str:
    """The KQL for the VMs of `table` (one of TABLES) with their NICs: every VM in scope
    (the bulk sync), or the one `vm_id` (validated as a UUID first: it is pasted in)."""
    vm_type, nic_type, scale_set = _SHAPES[table]
    where = ""
    if vm_id is not None:
        where = f"\n| where tolower(tostring(properties.vmId)) == '{normalise_vm_id(vm_id)}'"
    return f"""{table}
| where type =~ '{vm_type}'{where}
| project id, vmKey = tolower(id), subscriptionId, resourceGroup,
    vmId = tostring(properties.vmId), scaleSetId = {scale_set},
    availabilitySetId = tostring(properties.availabilitySet.id), tags, zones, location
| join kind=leftouter (
    {table}
    | where type =~ '{nic_type}'
    | extend vmKey = tolower(tostring(properties.virtualMachine.id))
    | where isnotempty(vmKey)
    | project vmKey, nicId = tostring(id), nicPrimary = tostring(properties.primary),
        ipConfigurations = properties.ipConfigurations
  ) on vmKey
| project id, subscriptionId, resourceGroup, vmId, scaleSetId, availabilitySetId,
    tags, zones, location, nicId, nicPrimary, ipConfigurations
| order by id asc"""


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


def ip_configurations(row: dict[str, Any]) -> list[dict[str, Any]]:
    """A row's NIC ipConfigurations (the array Resource Graph returns, each with its
    `properties`), as {"primary", "address", "version"}; anything malformed is left out."""
    items = row.get("ipConfigurations")
    if not isinstance(items, list):
        return []
    out = []
    for item in items[:MAX_IP_CONFIGURATIONS]:
        props = item.get("properties") if isinstance(item, dict) else None
        if isinstance(props, dict):
            out.append(
                {
                    "primary": _truthy(props.get("primary")),
                    "address": str(props.get("privateIPAddress") or ""),
                    "version": str(props.get("privateIPAddressVersion") or ""),
                }
            )
    return out


def _primary_ipv4(rows: list[dict[str, Any]]) -> str | None:
    """The primary NIC's primary IPv4: a NIC/ipconfig flagged primary wins; a VM with one
    NIC (or one ipconfig) has it unflagged. Deterministic otherwise (sorted)."""
    nics = {str(r.get("nicId") or "").lower() for r in rows if r.get("nicId")}
    candidates = []
    for row in rows:
        nic_rank = 0 if _truthy(row.get("nicPrimary")) or len(nics) <= 1 else 1
        for ipc in ip_configurations(row):
            try:
                address = ipaddress.ip_address(ipc["address"])
            except ValueError:
                continue  # absent, or a prefix ("10.0.0.16/28")
            if address.version != 4:
                continue
            ip_rank = 0 if ipc["primary"] else 1
            candidates.append((nic_rank, ip_rank, str(row.get("nicId") or ""), str(address)))
    return min(candidates)[3] if candidates else None


def read_tags(value: object) -> tuple[dict[str, str], int]:
    """A row's `tags` column as {name: value}, within Azure's limits and MAX_TAGS_CHARS,
    and how many tags were left out (non-string entries, or past the bound)."""
    if not isinstance(value, dict):
        return {}, 0
    tags: dict[str, str] = {}
    used = dropped = 0
    for name in sorted(value, key=str):
        text = value[name]
        if not isinstance(name, str) or not isinstance(text, str | int | float | bool):
            dropped += 1
            continue
        name, text = name[:MAX_TAG_NAME], str(text)[:MAX_TAG_VALUE]
        used += len(name) + len(text) + 6
        if used > MAX_TAGS_CHARS or len(tags) >= MAX_TAGS:
            dropped += 1
            continue
        tags[name] = text
    return tags, dropped


def read_zone(value: object) -> str | None:
    """A row's `zones` column: the VM's one zone, or None (not zonal, or not one zone)."""
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], str | int):
        zone = str(value[0]).strip()
        return zone[:MAX_ZONE] or None
    return None


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
    tags, dropped = read_tags(first.get("tags"))
    if dropped:
        log.warning("vmId %s: %d tag(s) left out of its facts (too many, too long)", vm_id, dropped)
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
            tags=tags,
            tags_dropped=dropped,
            zone=read_zone(first.get("zones")),
            location=read_location(first.get("location")),
        )
    except ValueError as exc:
        raise FactsUnavailable(f"Resource Graph row not usable: {str(exc)[:200]}") from None


def read_location(value: Any) -> str | None:
    """A row's `location` column: Azure's region name ("eastus"), lower-cased; None when
    absent or not a short name."""
    if not isinstance(value, str) or not value.strip() or len(value) > MAX_ZONE:
        return None
    text = value.strip().casefold()
    return text if re.fullmatch(r"[a-z0-9-]+", text) else None


def placement_of(facts: VmFacts) -> Placement:
    """Where Azure places the VM, as disruption budgets read it."""
    return Placement(
        name=facts.name,
        vm_id=facts.vm_id,
        subscription=facts.subscription_id,
        resource_group=facts.resource_group,
        zone=facts.zone,
        region=facts.location,
        scale_set=facts.scale_set,
        availability_set=facts.availability_set,
        tags=facts.tags,
        fetched_at=facts.fetched_at,
    )


def rows_by_vm(rows: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Rows grouped by vmId (lower-case); rows without a usable vmId are left out."""
    grouped: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        try:
            vm_id = normalise_vm_id(str(row.get("vmId", "")).lower())
        except ValueError:
            continue
        grouped.setdefault(vm_id, []).append(row)
    return grouped


class ResourceGraphResolver:
    """Resolves one vmId through Resource Graph (functions.identity.resource_graph): the
    `resources` query first (standalone and flexible VMs), then `computeresources` (uniform
    instances) only if the first knows nothing: one or two queries per vmId. Used only for
    vmIds the bulk sync (functions.identity.sync) has not stored yet."""

    def __init__(
        self,
        session: requests.Session,
        credential: TokenCredential,
        arm_endpoint: str = "https://management.azure.com",
        subscriptions: tuple[str, ...] | list[str] = (),
        clock: Any = None,
    ) -> None:
        self.graph = ResourceGraph(
            session,
            credential,
            arm_endpoint,
            [normalise_vm_id(s) for s in subscriptions],  # UUIDs, too
        )
        self.clock = clock or (lambda: datetime.now(UTC))

    @property
    def url(self) -> str:
        return self.graph.url

    @property
    def credential(self) -> TokenCredential:
        return self.graph.credential

    def resolve(self, vm_id: str) -> VmFacts:
        try:
            vm_id = normalise_vm_id(vm_id)
        except ValueError:
            raise UnknownVm(f"vmId {str(vm_id)[:40]!r} is not a UUID") from None
        for table in TABLES:
            rows = self.graph.query(vm_query(table, vm_id)).rows
            if rows_by_vm(rows).get(vm_id):
                return facts_from_rows(vm_id, rows, self.clock())
        raise UnknownVm(f"vmId {vm_id} not in Resource Graph")


__all__ = [
    "FactsUnavailable",
    "ResourceGraphRefused",
    "ResourceGraphResolver",
    "StaticResolver",
    "UnknownVm",
    "VmFacts",
    "facts_from_rows",
    "normalise_vm_id",
    "placement_of",
    "vm_query",
]
