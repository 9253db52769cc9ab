"""Which VMs a target names: VM names, set names, `zone:N` (every VM Azure places in that
availability zone) or `tag:NAME=VALUE` (every VM with that tag), comma-separated, or a
scenario's default.

Pure functions over the simulator's VMs and scale sets, so the rules (a scale-in takes the
highest instance, a Spot scenario needs a Spot VM) read in one place.
"""

from __future__ import annotations

from collections.abc import Callable

from simulator.errors import NotFound, SimulatorError
from simulator.records import Vm
from simulator.scenarios import Scenario


def resolve_target(
    vms: dict[str, Vm],
    scale_sets: dict[str, float],
    root_vm: Callable[[], str],
    target: str | None,
    scenario: Scenario | None,
) -> list[str]:
    """VM names, set names (comma-separated), or None (a sensible default) -> the VMs."""
    needs = scenario.needs if scenario else None
    label = scenario.name if scenario else "this event"
    if target is None:
        if needs == "spot":
            spots = [vm.name for vm in vms.values() if vm.spot]
            if not spots:
                raise SimulatorError(f"{label} needs a Spot VM: add one (--spot NAME)")
            return spots[:1]
        if needs == "set":
            sets = [
                vm.availability_set or vm.scale_set
                for vm in vms.values()
                if vm.availability_set or vm.scale_set
            ]
            if not sets:
                return [root_vm()]
            target = sets[0]
        elif needs == "zone":
            zones = [vm.zone for vm in vms.values() if vm.zone]
            if not zones:
                raise SimulatorError(f"{label} needs a VM in an availability zone (--zone)")
            target = f"zone:{zones[0]}"
        elif needs == "scale-set":
            if not scale_sets:
                raise SimulatorError(
                    f"{label} needs a scale-set instance: add a scale set (--scale-set NAME:N)"
                )
            target = next(iter(scale_sets))
        else:
            return [root_vm()]
    names: list[str] = []
    for part in (p.strip() for p in target.split(",")):
        if part:
            names.extend(n for n in _resolve_one(vms, part, needs, label) if n not in names)
    if not names:
        raise SimulatorError(f"target {target!r} names no VM")
    return names


def _resolve_one(vms: dict[str, Vm], target: str, needs: str | None, label: str) -> list[str]:
    placed = _placed(vms, target)
    if placed is not None:
        if not placed:
            raise NotFound(f"no VM in {target!r}")
        return placed
    vm = vms.get(target.casefold())
    if vm is not None:
        if needs == "spot" and not vm.spot:
            raise SimulatorError(f"{label} needs a Spot VM; {vm.name} is not one")
        if needs == "scale-set" and not vm.scale_set:
            raise SimulatorError(f"{label} needs a scale-set instance; {vm.name} is not one")
        return [vm.name]
    members = [
        v
        for v in vms.values()
        if target.casefold()
        in ((v.availability_set or "").casefold(), (v.scale_set or "").casefold())
    ]
    if not members:
        raise NotFound(f"no VM or set named {target!r}")
    if needs == "scale-set":
        if not members[0].scale_set:
            raise SimulatorError(f"{label} needs a scale set; {target} is an availability set")
        return [members[-1].name]  # scale-in removes the highest instance id first
    if needs == "spot":
        members = [v for v in members if v.spot]
        if not members:
            raise SimulatorError(f"{label} needs a Spot VM; {target} has none")
    return [v.name for v in members]


def _placed(vms: dict[str, Vm], target: str) -> list[str] | None:
    """`zone:N` or `tag:NAME=VALUE` -> the VMs Azure places there (names compare as Azure
    compares them: tag names case-insensitively, values exactly); None for other targets."""
    kind, sep, rest = target.partition(":")
    if not sep or kind.casefold() not in ("zone", "tag"):
        return None
    if kind.casefold() == "zone":
        return [v.name for v in vms.values() if v.zone == rest.strip()]
    name, eq, value = rest.partition("=")
    if not eq or not name:
        raise SimulatorError(f"target {target!r}: use tag:NAME=VALUE")
    return [
        v.name
        for v in vms.values()
        if {k.casefold(): t for k, t in v.tags.items()}.get(name.casefold()) == value
    ]
