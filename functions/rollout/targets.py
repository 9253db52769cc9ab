"""Which VMs a rollout covers: every Linux VM under a scope, from Azure Resource Graph
(as functions.identity.facts reads the fleet, with the same client), never from the VMs.

Two queries, one table each (Resource Graph's limits; reference/supported-tables-
resources.md, as functions/identity/facts.py cites it): `resources` holds
microsoft.compute/virtualmachines (standalone VMs and Flexible scale sets' members, whose
`properties.virtualMachineScaleSet.id` names their set), `computeresources` holds
microsoft.compute/virtualmachinescalesets/virtualmachines (Uniform instances, whose id
names their set). The scope is an ARM id: a subscription, a resource group, a scale set
(Uniform or Flexible) or one VM.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from functions.identity.resource_graph import ResourceGraph
from functions.model.budgets import Placement

# An ARM id of a subscription, a resource group, a scale set or a VM: letters, digits and
# `-._()` in each segment (what Azure allows in those names), nothing to escape in KQL.
_SCOPE = re.compile(
    r"^/subscriptions/(?P<sub>[0-9a-fA-F-]{36})"
    r"(?:/resourceGroups/[A-Za-z0-9._()-]{1,90}"
    r"(?:/providers/Microsoft\.Compute/(?:virtualMachines|virtualMachineScaleSets)"
    r"/[A-Za-z0-9._()-]{1,80})?)?$",
    re.IGNORECASE,
)
_UNIFORM = re.compile(r"/virtualmachinescalesets/(?P<set>[^/]+)/virtualmachines/[^/]+$", re.I)
MAX_TARGETS = 50_000  # one rollout; larger fleets are rolled out scope by scope


class ScopeError(ValueError):
    """A scope that is not an ARM id this command understands; the message says which."""


def parse_scope(text: str) -> tuple[str, str]:
    """(the scope in lower case, its subscription id) or ScopeError."""
    scope = text.strip().rstrip("/")
    match = _SCOPE.match(scope)
    if match is None:
        raise ScopeError(
            f"scope {text[:200]!r} is not /subscriptions/ID[/resourceGroups/RG[/providers/"
            "Microsoft.Compute/virtualMachineScaleSets/NAME | /virtualMachines/NAME]]"
        )
    return scope.lower(), match["sub"].lower()


@dataclass(frozen=True)
class Target:
    """One VM the rollout runs on, as Azure lists it."""

    id: str  # its ARM id: the run command's parent
    name: str
    vm_id: str  # properties.vmId, the relay's (and the liveness row's) identity
    location: str
    subscription: str
    resource_group: str
    scale_set: str = ""  # its set's name (Uniform or Flexible), "" for a standalone VM
    availability_set: str = ""
    uniform: bool = False
    zone: str = ""
    tags: dict[str, str] = field(default_factory=dict, hash=False, compare=False)

    @property
    def kind(self) -> str:
        if self.uniform:
            return "uniform"
        return "flexible" if self.scale_set else "vm"

    @property
    def set_label(self) -> str:
        return self.scale_set or "(standalone VMs)"

    def placement(self) -> Placement:
        """Where Azure places it, for the policy's disruption budgets."""
        return Placement(
            name=self.name,
            vm_id=self.vm_id,
            subscription=self.subscription,
            resource_group=self.resource_group,
            zone=self.zone or None,
            scale_set=self.scale_set or None,
            availability_set=self.availability_set or None,
            tags=self.tags,
        )


def target_query(table: str, scope: str) -> str:
    """The KQL of `table` ("resources" or "computeresources") for the Linux VMs under
    `scope` (a lower-case ARM id checked by parse_scope: nothing in it needs escaping)."""
    if table == "resources":
        vm_type, scale_set = (
            "microsoft.compute/virtualmachines",
            "tolower(tostring(properties.virtualMachineScaleSet.id))",
        )
    else:
        vm_type, scale_set = ("microsoft.compute/virtualmachinescalesets/virtualmachines", "''")
    return f"""{table}
| where type =~ '{vm_type}'
| extend key = tolower(id), scaleSetId = {scale_set}
| where key == '{scope}' or key startswith '{scope}/' or scaleSetId == '{scope}'
| where tostring(properties.storageProfile.osDisk.osType) !~ 'Windows'
| project id, name, location, subscriptionId, resourceGroup, tags, zones,
    vmId = tolower(tostring(properties.vmId)), scaleSetId,
    availabilitySetId = tostring(properties.availabilitySet.id)
| order by id asc"""


def _target(row: dict[str, Any]) -> Target | None:
    rid, vm_id = str(row.get("id") or ""), str(row.get("vmId") or "")
    if not rid or not vm_id:
        return None  # a VM being created has no vmId yet: nothing to roll out to
    uniform = _UNIFORM.search(rid)
    scale_set = uniform["set"] if uniform else str(row.get("scaleSetId") or "").rsplit("/", 1)[-1]
    zones = row.get("zones")
    tags = row.get("tags") if isinstance(row.get("tags"), dict) else {}
    return Target(
        id=rid,
        name=str(row.get("name") or rid.rsplit("/", 1)[-1]),
        vm_id=vm_id,
        location=str(row.get("location") or ""),
        subscription=str(row.get("subscriptionId") or "").lower(),
        resource_group=str(row.get("resourceGroup") or ""),
        scale_set=scale_set,
        availability_set=str(row.get("availabilitySetId") or "").rsplit("/", 1)[-1],
        uniform=bool(uniform),
        zone=str(zones[0]) if isinstance(zones, list) and zones else "",
        tags={str(k): str(v) for k, v in (tags or {}).items()},
    )


def list_targets(graph: ResourceGraph, scope: str) -> list[Target]:
    """Every Linux VM under `scope`, both tables, all pages, in id order."""
    found: dict[str, Target] = {}
    for table in ("resources", "computeresources"):
        for row in _rows(graph, target_query(table, scope)):
            target = _target(row)
            if target is not None:
                found[target.id.lower()] = target
            if len(found) > MAX_TARGETS:
                raise ScopeError(f"more than {MAX_TARGETS} VMs in scope: give a smaller scope")
    return sorted(found.values(), key=lambda t: (t.scale_set.lower(), t.id.lower()))


def _rows(graph: ResourceGraph, kql: str) -> Iterator[dict[str, Any]]:
    token = None
    while True:
        page = graph.query(kql, skip_token=token)
        yield from page.rows
        token = page.skip_token
        if not token:
            return
