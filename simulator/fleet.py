"""The simulated VMs: single VMs, availability sets and scale sets, and which VMs a target names.

A mixin of `Simulator` (simulator.engine): VMs are added and looked up under the engine's
lock; adding one re-renders documents through the engine's `_settle`.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterable
from typing import Any

from simulator.errors import NotFound, SimulatorError
from simulator.records import Vm
from simulator.scenarios import Scenario
from simulator.targets import resolve_target

DEFAULT_VM = "myVM"
DEFAULT_TERMINATE_TIMEOUT = 300.0
MIN_TERMINATE_TIMEOUT, MAX_TERMINATE_TIMEOUT = 300.0, 900.0

_VM_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,79}$")


class FleetMixin:
    """VMs and sets; `Simulator` provides the state named below."""

    _lock: threading.RLock
    _vms: dict[str, Vm]
    _scale_sets: dict[str, float]
    _dirty: bool
    _settle: Callable[[], None]

    def add_vm(
        self,
        name: str,
        availability_set: str | None = None,
        scale_set: str | None = None,
        spot: bool = False,
        zone: str | None = None,
        tags: dict[str, str] | None = None,
    ) -> str:
        """Add a VM. A VM belongs to at most one set; its set-mates see its events. `zone`
        and `tags` are Azure's facts about it (Resource Graph answers them)."""
        if not isinstance(name, str) or not _VM_NAME.match(name):
            raise SimulatorError(
                f"VM name {name!r} must be 1-80 letters, digits, '.', '_' or '-' "
                "and start with a letter or digit"
            )
        if availability_set and scale_set:
            raise SimulatorError(f"{name}: a VM is in an availability set or a scale set, not both")
        for set_name in (availability_set, scale_set):
            if set_name is not None and not _VM_NAME.match(set_name):
                raise SimulatorError(f"set name {set_name!r} is not a valid name")
        with self._lock:
            if name.casefold() in self._vms:
                raise SimulatorError(f"VM {name!r} already exists")
            vm = Vm(name, availability_set, scale_set, spot, zone=_zone(zone), tags=_tags(tags))
            vm.history.append({"DocumentIncarnation": 1, "Events": []})
            self._vms[name.casefold()] = vm
            self._dirty = True
            if scale_set and scale_set not in self._scale_sets:
                self._scale_sets[scale_set] = DEFAULT_TERMINATE_TIMEOUT
            self._settle()
        return name

    def add_scale_set(
        self,
        name: str,
        count: int,
        terminate_timeout: float = DEFAULT_TERMINATE_TIMEOUT,
        zone: str | None = None,
        tags: dict[str, str] | None = None,
    ) -> list[str]:
        """Add instances `name_0..name_{count-1}` with terminate notifications enabled, all
        in `zone` (a zonal scale set) and tagged `tags`."""
        if not isinstance(count, int) or not 1 <= count <= 1000:
            raise SimulatorError("a scale set has 1 to 1000 instances")
        if not MIN_TERMINATE_TIMEOUT <= terminate_timeout <= MAX_TERMINATE_TIMEOUT:
            raise SimulatorError("notBeforeTimeout must be between PT5M and PT15M")
        with self._lock:
            self._scale_sets[name] = float(terminate_timeout)
            return [
                self.add_vm(f"{name}_{i}", scale_set=name, zone=zone, tags=tags)
                for i in range(count)
            ]

    def add_availability_set(
        self, name: str, vms: Iterable[str], tags: dict[str, str] | None = None
    ) -> list[str]:
        with self._lock:
            return [self.add_vm(vm, availability_set=name, tags=tags) for vm in vms]

    def place(
        self, target: str, zone: str | None = None, tags: dict[str, str] | None = None
    ) -> list[str]:
        """Set the zone and/or add tags of a VM or of every VM of a set (Azure's facts:
        Resource Graph answers them from the next query)."""
        with self._lock:
            names = self._resolve_target(target, None)
            for name in names:
                vm = self.vm(name)
                if zone is not None:
                    vm.zone = _zone(zone)
                vm.tags = {**vm.tags, **_tags(tags)}
            return names

    @property
    def vm_names(self) -> list[str]:
        with self._lock:
            return [vm.name for vm in self._vms.values()]

    def root_vm(self) -> str:
        """The VM served at the root URL: the first one added, or `myVM` if there is none."""
        with self._lock:
            if not self._vms:
                self.add_vm(DEFAULT_VM)
            return next(iter(self._vms.values())).name

    def vm(self, name: str) -> Vm:
        """Look a VM up by name (case-insensitive). `myVM` exists implicitly while no VM has
        been added, so a bare Simulator behaves like the CLI's default."""
        with self._lock:
            if not self._vms and name.casefold() == DEFAULT_VM.casefold():
                self.add_vm(DEFAULT_VM)
            try:
                return self._vms[name.casefold()]
            except KeyError:
                raise NotFound(f"no VM named {name!r}") from None

    def describe_vm(self, name: str) -> dict[str, Any]:
        with self._lock:
            vm = self.vm(name)
            return {
                "name": vm.name,
                "availability_set": vm.availability_set,
                "scale_set": vm.scale_set,
                "spot": vm.spot,
                "zone": vm.zone,
                "tags": dict(vm.tags),
                "terminate_timeout": self._scale_sets.get(vm.scale_set) if vm.scale_set else None,
            }

    def _resolve_target(self, target: str | None, scenario: Scenario | None) -> list[str]:
        return resolve_target(self._vms, self._scale_sets, self.root_vm, target, scenario)


def _zone(zone: str | int | None) -> str | None:
    if zone is None:
        return None
    text = str(zone).strip()
    if not re.match(r"^[A-Za-z0-9-]{1,16}$", text):
        raise SimulatorError(f"zone {zone!r} is not a zone like 1, 2 or 3")
    return text


def _tags(tags: dict[str, str] | None) -> dict[str, str]:
    """Tags as Azure allows them: names 1-512 characters without < > % & \\ ? /, values up
    to 256 characters, at most 50."""
    out = {}
    for name, value in (tags or {}).items():
        if not isinstance(name, str) or not 0 < len(name) <= 512 or set(name) & set("<>%&\\?/"):
            raise SimulatorError(f"tag name {name!r} is not one Azure allows")
        if not isinstance(value, str) or len(value) > 256:
            raise SimulatorError(f"tag {name!r}: a value is a string of at most 256 characters")
        out[name] = value
    if len(out) > 50:
        raise SimulatorError("at most 50 tags per VM (Azure's limit)")
    return out
