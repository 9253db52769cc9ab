"""Azure Resource Manager ids of the resources that own Scheduled Events.

Outside the VM an event belongs to the resource that opted in: a VM, a scale set or an
availability set. Event Grid names it in `subject` (the event's own ARM id, under that
resource); a relay knows it from its VM's compute metadata. Both sources and the ARM
approver meet on this one model, so an id is parsed (and case-folded) in one place only.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Protocol

from pydantic import BaseModel, ConfigDict

# Canonical spelling of the owner types the acknowledge API accepts (path segment).
OWNER_TYPES = {
    "virtualmachines": "virtualMachines",
    "virtualmachinescalesets": "virtualMachineScaleSets",
    "availabilitysets": "availabilitySets",
}

_OWNER = re.compile(
    r"^/subscriptions/(?P<sub>[^/]+)/resourcegroups/(?P<rg>[^/]+)"
    r"/providers/microsoft\.compute/(?P<type>[^/]+)/(?P<name>[^/]+)(?P<rest>(/.*)?)$",
    re.IGNORECASE,
)
_EVENT_SUFFIX = re.compile(
    r"^/providers/microsoft\.maintenance/scheduledevents/(?P<event>[^/]+)$", re.IGNORECASE
)
_VMSS_INSTANCE = re.compile(r"^/virtualmachines/(?P<instance>[^/]+)$", re.IGNORECASE)


class ComputeMetadata(Protocol):
    """What a relay's VM reported of itself (its stored VM row): where it stands in ARM."""

    @property
    def resource_id(self) -> str | None: ...

    @property
    def scale_set(self) -> str | None: ...

    @property
    def availability_set(self) -> str | None: ...


class ArmError(ValueError):
    """Not the ARM id of a VM, scale set, availability set or one of their events."""


class ArmResource(BaseModel):
    """A VM, scale set or availability set, as the acknowledge path names it."""

    model_config = ConfigDict(frozen=True)

    subscription_id: str
    resource_group: str
    resource_type: str  # virtualMachines | virtualMachineScaleSets | availabilitySets
    name: str

    @property
    def id(self) -> str:
        return (
            f"/subscriptions/{self.subscription_id}/resourceGroups/{self.resource_group}"
            f"/providers/Microsoft.Compute/{self.resource_type}/{self.name}"
        )

    def sibling(self, resource_type: str, name: str) -> ArmResource:
        """Another resource of the same resource group (a VM's scale set or availability set:
        Azure keeps them in the VM's resource group)."""
        return ArmResource(
            subscription_id=self.subscription_id,
            resource_group=self.resource_group,
            resource_type=OWNER_TYPES[resource_type.casefold()],
            name=name,
        )

    def same(self, other: ArmResource) -> bool:
        return self.id.casefold() == other.id.casefold()


def _owner(match: re.Match[str], text: str) -> ArmResource:
    kind = OWNER_TYPES.get(match["type"].casefold())
    if kind is None:
        raise ArmError(
            f"{text!r}: resource type {match['type']!r} cannot own Scheduled Events "
            f"(one of {', '.join(OWNER_TYPES.values())})"
        )
    return ArmResource(
        subscription_id=match["sub"],
        resource_group=match["rg"],
        resource_type=kind,
        name=match["name"],
    )


def parse_event_id(text: object) -> tuple[ArmResource, str]:
    """`.../Microsoft.Compute/{type}/{name}/providers/Microsoft.Maintenance/scheduledevents/{id}`
    -> (the owner, the EventId). Raises ArmError naming what is wrong (whatever `text` is:
    it comes from an Event Grid event or a stored row)."""
    match = _OWNER.match(text.strip()) if isinstance(text, str) else None
    if match is None or not isinstance(text, str):
        raise ArmError(f"{text!r} is not an ARM id under Microsoft.Compute")
    owner = _owner(match, text)
    suffix = _EVENT_SUFFIX.match(match["rest"])
    if suffix is None:
        raise ArmError(
            f"{text!r} does not end in /providers/Microsoft.Maintenance/scheduledevents/<EventId>"
        )
    return owner, suffix["event"]


def owner_of_vm(
    resource_id: str | None, scale_set: str | None = None, availability_set: str | None = None
) -> ArmResource | None:
    """Which resource owns a relay-reported VM's events: its scale set, its availability set
    (all VMs of a set share the opt-in and the event), or the VM. None when the VM's
    compute metadata gave no usable resource id."""
    if not resource_id:
        return None
    match = _OWNER.match(resource_id.strip())
    if match is None:
        return None
    try:
        resource = _owner(match, resource_id)
    except ArmError:
        return None
    if resource.resource_type == "virtualMachineScaleSets":
        # A scale-set instance: .../virtualMachineScaleSets/web/virtualMachines/3
        if match["rest"] and _VMSS_INSTANCE.match(match["rest"]) is None:
            return None
        return resource
    if match["rest"]:
        return None
    if scale_set:
        return resource.sibling("virtualMachineScaleSets", scale_set)
    if availability_set:
        return resource.sibling("availabilitySets", availability_set)
    return resource


def owners_of(event_owner: str | None, vms: Iterable[ComputeMetadata | None]) -> list[ArmResource]:
    """Where an event can be acknowledged, each owner once: the one Event Grid named (the
    event's ARM id, `event_owner`), then those the named VMs' compute metadata gives
    (scale set, availability set or the VM itself; a VM with no row is None). Decided
    here, beside the parsing, from the rows the approval read (functions.pipeline.approve):
    the approval's walk to the relays steps into no ARM module first (issue 46)."""
    candidates = [owner_of_vm(event_owner)] if event_owner else []
    candidates += [
        owner_of_vm(vm.resource_id, vm.scale_set, vm.availability_set)
        for vm in vms
        if vm is not None
    ]
    owners: list[ArmResource] = []
    for owner in candidates:
        if owner is not None and not any(owner.same(o) for o in owners):
            owners.append(owner)
    return owners
