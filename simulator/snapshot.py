"""The simulator's state as JSON-ready data (the control API's GET /_sim/state and events).

A mixin of `Simulator` (simulator.engine): it reads the engine's VMs, events, pending specs,
faults and approvals under the engine's lock, after applying what the clock says is due.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from functions.model.envelope import SCHEDULED_EVENTS_API_VERSION
from simulator.faults import FaultBook
from simulator.records import Approval, Event, Vm


class SnapshotMixin:
    """State and event descriptions; `Simulator` provides the state named below."""

    _lock: threading.RLock
    _vms: dict[str, Vm]
    _events: dict[str, Event]
    _pending: list[Any]
    _faults: FaultBook
    _approvals: list[Approval]
    _scale_sets: dict[str, float]
    errors: list[str]
    time_scale: float
    type_scales: dict[str, float]
    approval_mode: str
    clock: Callable[[], float]
    _settle: Callable[[], None]
    _sees: Callable[[Vm, Event], bool]
    event: Callable[[str], Event]
    describe_vm: Callable[[str], dict[str, Any]]
    document: Callable[..., dict[str, Any]]

    def state(self) -> dict[str, Any]:
        """Everything, as JSON-ready data (the control API's GET /_sim/state)."""
        with self._lock:
            self._settle()
            now = self.clock()
            return {
                "now": datetime.fromtimestamp(now, UTC).isoformat(),
                "time_scale": self.time_scale,
                "type_scales": dict(self.type_scales),
                "approval_mode": self.approval_mode,
                "root_vm": next(iter(self._vms.values())).name if self._vms else None,
                "scale_sets": {
                    name: {"terminate_timeout": t} for name, t in self._scale_sets.items()
                },
                "vms": {
                    vm.name: {
                        **self.describe_vm(vm.name),
                        "incarnation": vm.incarnation,
                        "document": self.document(vm.name),
                        "requests": dict(vm.requests),
                    }
                    for vm in self._vms.values()
                },
                "events": [self._describe_event(e, now) for e in self._events.values()],
                "pending": [
                    {"due_in": round(p.due - now, 3), **p.spec.model_dump(exclude_none=True)}
                    for p in self._pending
                ],
                "faults": [f.model_dump() for f in self._faults.active()],
                "approvals": [a.model_dump(mode="json") for a in self._approvals],
                "errors": list(self.errors),
            }

    def describe_event(self, event_id: str) -> dict[str, Any]:
        """One event with its timeline and who approved and sees it, as JSON-ready data."""
        with self._lock:
            self._settle()
            return self._describe_event(self.event(event_id), self.clock())

    def _describe_event(self, event: Event, now: float) -> dict[str, Any]:
        def iso(moment: float | None) -> str | None:
            return datetime.fromtimestamp(moment, UTC).isoformat() if moment is not None else None

        return {
            **(event.render(SCHEDULED_EVENTS_API_VERSION) or {}),
            "scenario": event.scenario,
            "active": event.active,
            "end_reason": event.end_reason,
            "created_at": iso(event.created_at),
            "not_before": iso(event.not_before),
            "started_at": iso(event.started_at),
            "ended_at": iso(event.ended_at),
            "ends_at": iso(event.started_at + event.impact)
            if event.active and event.started_at is not None
            else None,
            "cancel_at": iso(event.cancel_at) if event.active else None,
            "approved_by": list(event.approved_by),
            "seen_by": [vm.name for vm in self._vms.values() if self._sees(vm, event)],
        }

    @property
    def idle(self) -> bool:
        """No event active and nothing pending: a scripted run has played out."""
        with self._lock:
            self._settle()
            return not self._pending and not any(e.active for e in self._events.values())
