"""Resource Manager's view of the simulated events: who owns an event, and its acknowledge.

A mixin of `Simulator` (simulator.engine): an event belongs to its VMs' scale set or
availability set, or to its single VM, as Event Grid and ARM name it; ARM's acknowledge
approves it for all its Resources, under the engine's lock.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import UTC, datetime

from functions.model.envelope import SCHEDULED, TERMINATE
from simulator.errors import Conflict, NotFound
from simulator.records import Approval, Event, Vm


class ArmMixin:
    """Ownership and acknowledge; `Simulator` provides the state named below."""

    _lock: threading.RLock
    _vms: dict[str, Vm]
    _events: dict[str, Event]
    _approvals: list[Approval]
    clock: Callable[[], float]
    _advance: Callable[[], None]
    _settle: Callable[[], None]
    _start: Callable[[Event, float], None]
    _release_terminates: Callable[[float], None]
    grid_status: Callable[[Event], str]

    def owner_of(self, event: Event) -> tuple[str, str]:
        """The resource an event belongs to outside the VM: the scale set or availability
        set of its VMs, or the VM itself ("virtualMachines", name)."""
        vm = self._vms.get(event.resources[0].casefold()) if event.resources else None
        if vm is not None and vm.scale_set:
            return "virtualMachineScaleSets", vm.scale_set
        if vm is not None and vm.availability_set:
            return "availabilitySets", vm.availability_set
        return "virtualMachines", vm.name if vm is not None else event.resources[0]

    def owns(self, resource_type: str, name: str) -> bool:
        """Whether a VM, scale set or availability set of that name exists here."""
        with self._lock:
            key = name.casefold()
            if resource_type == "virtualMachines":
                return key in self._vms
            attr = "scale_set" if resource_type == "virtualMachineScaleSets" else "availability_set"
            return any((getattr(vm, attr) or "").casefold() == key for vm in self._vms.values())

    def acknowledge(self, resource_type: str, name: str, event_id: str) -> Event:
        """ARM's acknowledge: approve an event for all its Resources, if `name` owns it.
        NotFound: no such event under that resource; Conflict: it is not Scheduled."""
        with self._lock:
            self._advance()
            event = next(
                (e for e in self._events.values() if e.event_id.casefold() == event_id.casefold()),
                None,
            )
            if event is None:
                raise NotFound(f"scheduled event {event_id} not found")
            kind, owner = self.owner_of(event)
            if kind != resource_type or owner.casefold() != name.casefold():
                raise NotFound(
                    f"scheduled event {event_id} does not belong to {resource_type}/{name}"
                )
            if not event.active or event.status != SCHEDULED:
                raise Conflict(
                    f"scheduled event {event.event_id} is "
                    f"{self.grid_status(event)}: only a Scheduled event can be acknowledged"
                )
            now = self.clock()
            self._approvals.append(
                Approval(
                    vm=f"arm:{kind}/{owner}",
                    event_id=event.event_id,
                    at=datetime.fromtimestamp(now, UTC),
                    counted=True,
                )
            )
            for resource in event.resources:
                if resource not in event.approved_by:
                    event.approved_by.append(resource)
            if event.event_type != TERMINATE:
                self._start(event, now)
            self._release_terminates(now)
            self._settle()
            return event
