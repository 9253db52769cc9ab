"""The simulator's fault API: inject misbehaviour, count requests, enforce IMDS's rate limit.

A mixin of `Simulator` (simulator.engine): it works on the engine's VMs and fault book under
the engine's lock.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from simulator.faults import Endpoint, Fault, FaultAction, FaultBook, FaultKind
from simulator.records import Vm


class FaultsMixin:
    """Faults and request counting; `Simulator` provides the state named below."""

    _lock: threading.RLock
    _vms: dict[str, Vm]
    _faults: FaultBook
    rate_limit: float | None
    vm: Callable[[str], Vm]
    clock: Callable[[], float]
    guest_hold: Callable[[str, float], float]

    def inject_fault(
        self,
        kind: FaultKind,
        vm: str | None = None,
        count: int | None = 1,
        status: int = 500,
        seconds: float = 1.0,
        endpoint: Endpoint = "scheduledevents",
    ) -> int:
        """Make the next `count` matching requests misbehave (None: until cleared).

        `vm` None means every VM. `endpoint` chooses which IMDS path is affected
        (scheduledevents by default; "any" for all). A first-call-delay marks the VMs as not
        yet enabled, so their next scheduledevents request waits `seconds`, as the first call
        after enabling (or after 24 h without requests) does on Azure.
        Raises pydantic.ValidationError for bad values, NotFound for an unknown VM.
        """
        fault = Fault.model_validate(
            {
                "kind": kind,
                "vm": vm,
                "count": count,
                "status": status,
                "seconds": seconds,
                "endpoint": endpoint,
            }
        )
        with self._lock:
            if fault.vm is not None:
                fault.vm = self.vm(fault.vm).name
            if fault.kind == "first-call-delay":
                for target in self._vms.values():
                    if fault.vm is None or target.name == fault.vm:
                        target.enablement.reset()
            return self._faults.add(fault)

    def clear_faults(self, vm: str | None = None) -> int:
        """Remove all faults (or those of one VM); return how many were removed."""
        with self._lock:
            return self._faults.clear(self.vm(vm).name if vm is not None else None)

    @property
    def faults(self) -> list[Fault]:
        with self._lock:
            return self._faults.active()

    def take_nonce_fault(self, vm: str, nonce: str) -> str | None:
        """The nonce fault that applies to this attested request, if any (see FaultBook)."""
        with self._lock:
            return self._faults.take_nonce_fault(vm, nonce)

    def take_faults(self, vm: str, endpoint: str, post: bool = False) -> FaultAction:
        """Count one valid request and say how the server must misbehave on it, if at all.
        A POST to scheduledevents (StartRequests) is also counted as "startrequests",
        whatever it is answered: what tests of at-most-once approvals count."""
        with self._lock:
            target = self.vm(vm)
            target.requests[endpoint] += 1
            if post and endpoint == "scheduledevents":
                target.requests["startrequests"] += 1
            if self._over_rate_limit(target):
                return FaultAction(kind="status", status=429)
            action = self._faults.take(target.name, endpoint, post)
            # A paused guest (a Freeze playing, simulator.guest) asks nothing until it ends.
            action.delay += self.guest_hold(target.name, self.clock())
            if endpoint == "scheduledevents":
                if target.enablement.enabled:
                    action.delay += target.enablement.remaining()
                else:
                    delay = self._faults.take_first_call(target.name)
                    action.delay += target.enablement.begin(delay)
            return action

    def _over_rate_limit(self, vm: Vm) -> bool:
        if self.rate_limit is None:
            return False
        now = time.monotonic()
        recent = vm.recent_requests
        recent.append(now)
        while recent and recent[0] <= now - 1.0:
            recent.popleft()
        return len(recent) > self.rate_limit

    def request_count(self, vm: str, endpoint: str = "scheduledevents") -> int:
        """How many requests of that endpoint the VM's URL has received (after validation)."""
        with self._lock:
            return self.vm(vm).requests[endpoint]
