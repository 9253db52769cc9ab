"""The simulated Scheduled Events service: VMs, their events, approvals and faults.

Plain state behind one lock, with no HTTP in it, so tests and the demo can drive it directly
and the HTTP server stays a thin translation. Time-driven transitions (NotBefore passing,
impact ending, a cancellation) are applied lazily on every call and by the server's ticker,
so every document anyone reads is consistent with the clock at that moment.

Times: `notice`, `impact`, `cancel_after` and scenario offsets are real-world seconds and are
divided by `time_scale`. `NotBefore` is written as wall-clock time (the injected clock), because
a consumer compares it with its own clock. Fault delays are real seconds and are not scaled:
they model the network, not the maintenance.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any, Literal

from functions.model.envelope import (
    API_VERSIONS,
    SCHEDULED,
    SCHEDULED_EVENTS_API_VERSION,
    STARTED,
    TERMINATE,
)
from simulator.errors import Conflict, NotFound, SimulatorError
from simulator.faulting import FaultsMixin
from simulator.faults import FaultBook
from simulator.fleet import DEFAULT_TERMINATE_TIMEOUT, DEFAULT_VM, FleetMixin
from simulator.guest import GuestMixin
from simulator.ownership import ArmMixin
from simulator.records import Approval, Event, Vm
from simulator.scenarios import (
    DEFAULT_DESCRIPTION,
    DEFAULT_IMPACT,
    DEFAULT_NOTICE,
    FALLBACK_IMPACT,
    FALLBACK_NOTICE,
    SCENARIOS,
    EventSpec,
    Scenario,
)
from simulator.snapshot import SnapshotMixin

__all__ = ["DEFAULT_VM", "Conflict", "NotFound", "Simulator", "SimulatorError"]

COMPLETED, CANCELED = "Completed", "Canceled"  # Event Grid's end statuses


@dataclass
class _Pending:
    due: float
    spec: EventSpec


Listener = Callable[[str, int, dict[str, Any]], None]
# (event as IMDS writes it, with EventStatus Completed/Canceled once it ended; its owner
# (resource type, name) as Event Grid and ARM name it)
EventListener = Callable[[dict[str, Any], tuple[str, str]], None]


class Simulator(FleetMixin, ArmMixin, FaultsMixin, SnapshotMixin, GuestMixin):
    """IMDS Scheduled Events for a set of simulated VMs. Thread-safe: one re-entrant lock.

    Its VMs (simulator.fleet), Resource Manager's view (simulator.ownership), faults
    (simulator.faulting), state reports (simulator.snapshot) and Freeze playback
    (simulator.guest) are mixins over the same
    state; events, documents, approvals and time live here.
    """

    def __init__(
        self,
        time_scale: float = 1.0,
        approval_mode: Literal["any", "all"] = "any",
        clock: Callable[[], float] = time.time,
        location: str = "westeurope",
        rate_limit: float | None = None,
        type_scales: dict[str, float] | None = None,
    ) -> None:
        """`rate_limit`: answer 429 beyond this many requests per second per VM, as IMDS
        does (5/s on Azure); None (default) means no limit. `type_scales`: a time scale of
        their own for events of some types, e.g. {"Preempt": 6}: at 60x a Spot eviction's
        30 s notice would be 0.5 s, less than NotBefore's one-second resolution."""
        if not time_scale > 0:
            raise SimulatorError("time_scale must be greater than 0")
        self.type_scales = {k.casefold(): float(v) for k, v in (type_scales or {}).items()}
        if not all(v > 0 for v in self.type_scales.values()):
            raise SimulatorError("every type's time scale must be greater than 0")
        if approval_mode not in ("any", "all"):
            raise SimulatorError("approval_mode must be 'any' or 'all'")
        self.time_scale = float(time_scale)
        self.approval_mode = approval_mode
        self.clock = clock
        self.location = location
        if rate_limit is not None and not rate_limit > 0:
            raise SimulatorError("rate_limit must be greater than 0")
        self.rate_limit = rate_limit
        self._lock = threading.RLock()
        self._vms: dict[str, Vm] = {}
        self._scale_sets: dict[str, float] = {}
        self._events: dict[str, Event] = {}
        self._pending: list[_Pending] = []
        self._approvals: list[Approval] = []
        self._faults = FaultBook()
        self._listeners: list[Listener] = []
        self._event_listeners: list[EventListener] = []
        self._event_states: dict[str, str] = {}  # EventId -> status last told listeners
        self._advancing = False
        self._dirty = False
        self._as_of: float | None = None
        self._paused: dict[str, list[tuple[float, float]]] = {}  # guest pauses (Freeze)
        self.errors: list[str] = []

    # ------------------------------------------------------------------ events

    def add_event(
        self,
        event_type: str = "Freeze",
        resources: Iterable[str] | None = None,
        source: str = "Platform",
        duration: int = -1,
        notice: float | None = None,
        impact: float | None = None,
        description: str | None = None,
        status: str = SCHEDULED,
        cancel_after: float | None = None,
        event_id: str | None = None,
        resource_type: str = "VirtualMachine",
        target: str | None = None,
        scenario: str | None = None,
    ) -> str:
        """Raise an event now. Times are real-world seconds, divided by the time scale.

        `notice` defaults to the type's minimum notice (a Terminate: its scale set's timeout),
        `impact` (Started until removed) to Microsoft's mock medians. `cancel_after` withdraws
        the event that long after it appeared if it is still Scheduled.
        """
        if status not in (SCHEDULED, STARTED):
            raise SimulatorError("status must be 'Scheduled' or 'Started'")
        if not isinstance(event_type, str) or not event_type:
            raise SimulatorError("event_type must be a non-empty string")
        if isinstance(duration, bool) or not isinstance(duration, int) or duration < -1:
            raise SimulatorError("duration must be an integer >= -1 (-1: unknown)")
        for label, value in (("notice", notice), ("impact", impact), ("cancel", cancel_after)):
            if value is not None and not (isinstance(value, int | float) and value >= 0):
                raise SimulatorError(f"{label} must be a number of seconds >= 0")
        with self._lock:
            self._advance()
            if resources is not None and target is not None:
                raise SimulatorError("give either resources or target, not both")
            if resources is None:
                names = self._resolve_target(target, None)
            else:
                names = [self.vm(str(r)).name for r in resources]
                if not names:
                    raise SimulatorError("resources must name at least one VM")
            if event_id is None:
                event_id = str(uuid.uuid4()).upper()
            if any(e.event_id.casefold() == event_id.casefold() for e in self._events.values()):
                raise SimulatorError(f"EventId {event_id} already exists")
            if notice is None:
                notice = self._default_notice(event_type, names)
            if impact is None:
                impact = DEFAULT_IMPACT.get(event_type, FALLBACK_IMPACT)
            now = self._now()
            scale = self.scale_of(event_type)
            event = Event(
                event_id=event_id,
                event_type=event_type,
                resources=names,
                source=source,
                duration=duration,
                description=(
                    description
                    if description is not None
                    else DEFAULT_DESCRIPTION.get(event_type, f"{event_type} maintenance.")
                ),
                resource_type=resource_type,
                created_at=now,
                not_before=now + notice / scale if status == SCHEDULED else None,
                impact=impact / scale,
                cancel_at=now + cancel_after / scale if cancel_after is not None else None,
                status=status,
                scenario=scenario,
                started_at=now if status == STARTED else None,
            )
            self._events[event_id] = event
            self._dirty = True
            self._settle()
            return event_id

    def scale_of(self, event_type: str) -> float:
        """The time scale events of this type play at (`type_scales`, else `time_scale`)."""
        return self.type_scales.get(event_type.casefold(), self.time_scale)

    def _default_notice(self, event_type: str, resources: list[str]) -> float:
        if event_type == TERMINATE:
            timeouts = [
                self._scale_sets[vm.scale_set]
                for vm in (self.vm(r) for r in resources)
                if vm.scale_set in self._scale_sets
            ]
            return min(timeouts) if timeouts else DEFAULT_TERMINATE_TIMEOUT
        return DEFAULT_NOTICE.get(event_type, FALLBACK_NOTICE)

    def play(self, name: str, target: str | None = None, impact: float | None = None) -> list[str]:
        """Play a built-in scenario on a VM or a set; return the EventIds it raised.
        `impact` (real-world seconds, scaled like the scenario's) replaces the scenario's
        Started-until-removed: a player that ends the event itself (remove_event) on a
        condition keeps it from ending first (the demo's budget turns, local.demo_budget)."""
        scenario = SCENARIOS.get(name)
        if scenario is None:
            raise SimulatorError(f"unknown scenario {name!r}; known: {', '.join(SCENARIOS)}")
        if impact is not None:
            scenario = replace(scenario, impact=impact)
        with self._lock:
            self._advance()
            names = self._resolve_target(target, scenario)
            if scenario.rolling:
                # One VM (update domain) at a time: the next gets its event when this one ends.
                return [self._raise(scenario, names[:1], follow=names[1:])]
            # A scale-in deletes instances one Terminate event each, all with the same
            # NotBefore; everything else is one event naming all affected VMs.
            # A zone-wide wave is one event per VM too (each VM's own host maintenance).
            per_vm = scenario.event_type == TERMINATE or scenario.per_vm
            groups = [[n] for n in names] if per_vm else [names]
            outer, self._as_of = self._as_of, self._now()
            try:
                return [self._raise(scenario, group) for group in groups]
            finally:
                self._as_of = outer

    def _raise(
        self, scenario: Scenario, resources: list[str], follow: list[str] | None = None
    ) -> str:
        event_id = self.add_event(
            event_type=scenario.event_type,
            resources=resources,
            source=scenario.source,
            duration=scenario.duration,
            notice=scenario.notice,
            impact=scenario.impact,
            description=scenario.description,
            status=scenario.status,
            cancel_after=scenario.cancel_after,
            scenario=scenario.name,
        )
        self._events[event_id].follow = list(follow or [])
        return event_id

    def apply(self, spec: EventSpec) -> list[str]:
        """Raise what an EventSpec (control API, scenario file) describes, ignoring `at`."""
        if spec.scenario is not None:
            return self.play(spec.scenario, target=spec.target)
        return [self.add_event(target=spec.target, **spec.event_kwargs())]

    def schedule(self, spec: EventSpec, at: float | None = None) -> None:
        """Apply a spec `at` seconds (unscaled; default spec.at) from now.

        The target is checked now, so a scenario file with a typo fails at load time.
        """
        with self._lock:
            if spec.scenario is not None:
                self._resolve_target(spec.target, SCENARIOS[spec.scenario])
            elif spec.resources is not None:
                for name in spec.resources:
                    self.vm(name)
            else:
                self._resolve_target(spec.target, None)
            offset = spec.at if at is None else at
            self._pending.append(_Pending(self.clock() + offset / self.time_scale, spec))
            self._pending.sort(key=lambda p: p.due)
            self._settle()

    @property
    def pending(self) -> int:
        """Scheduled specs not yet applied."""
        with self._lock:
            return len(self._pending)

    def start_event(self, event_id: str) -> None:
        """Start a Scheduled event now, as if NotBefore had passed (no approval recorded)."""
        with self._lock:
            event = self._active(event_id)
            if event.status == SCHEDULED:
                self._start(event, self.clock())
            self._settle()

    def cancel_event(self, event_id: str) -> None:
        """Withdraw a Scheduled event, as Azure does when it cancels maintenance."""
        with self._lock:
            event = self._active(event_id)
            if event.status != SCHEDULED:
                raise SimulatorError(
                    f"{event.event_id} has {event.status}: only a Scheduled event can be "
                    "cancelled (remove it to end it)"
                )
            self._end(event, self.clock(), "cancelled")
            self._settle()

    def remove_event(self, event_id: str) -> None:
        """End an event now, whatever its status (e.g. an impact shorter than announced)."""
        with self._lock:
            event = self._active(event_id)
            self._end(event, self.clock(), "removed")
            self._settle()

    def event(self, event_id: str) -> Event:
        with self._lock:
            self._advance()
            for event in self._events.values():
                if event.event_id.casefold() == event_id.casefold():
                    return event
            raise NotFound(f"no event {event_id}")

    def _active(self, event_id: str) -> Event:
        self._advance()
        event = self.event(event_id)
        if not event.active:
            raise NotFound(f"event {event.event_id} has already ended ({event.end_reason})")
        return event

    # ------------------------------------------------------------------ documents

    def document(self, vm: str, api_version: str = SCHEDULED_EVENTS_API_VERSION) -> dict[str, Any]:
        """The VM's Scheduled Events document as IMDS of `api_version` would answer."""
        if api_version not in API_VERSIONS:
            raise SimulatorError(
                f"api-version {api_version!r} is not one of {', '.join(API_VERSIONS)}"
            )
        with self._lock:
            self._settle()
            target = self.vm(vm)
            events = [
                rendered
                for event in self._visible(target)
                if (rendered := event.render(api_version)) is not None
            ]
            return {"DocumentIncarnation": target.incarnation, "Events": events}

    def history(self, vm: str) -> list[dict[str, Any]]:
        """Every document the VM has had (newest API version), oldest first."""
        with self._lock:
            self._settle()
            return [dict(d) for d in self.vm(vm).history]

    def _visible(self, vm: Vm) -> list[Event]:
        return [e for e in self._events.values() if e.active and self._sees(vm, e)]

    def _sees(self, vm: Vm, event: Event) -> bool:
        """Named VMs see an event; so does every VM sharing a set with a named VM."""
        key = vm.name.casefold()
        if any(r.casefold() == key for r in event.resources):
            return True
        group = vm.group
        if group is None:
            return False
        return any(
            (other := self._vms.get(r.casefold())) is not None and other.group == group
            for r in event.resources
        )

    # ------------------------------------------------------------------ approvals

    def approve(self, vm: str, event_ids: list[str]) -> list[Approval]:
        """A POST of StartRequests from `vm`. All ids must be in its document, or nothing
        is recorded (NotFound)."""
        with self._lock:
            self._advance()
            caller = self.vm(vm)
            visible = {e.event_id.casefold(): e for e in self._visible(caller)}
            unknown = [i for i in event_ids if i.casefold() not in visible]
            if unknown:
                raise NotFound(f"EventId not in this VM's document: {', '.join(unknown)}")
            now = self.clock()
            recorded = []
            for event_id in event_ids:
                event = visible[event_id.casefold()]
                named = any(r.casefold() == caller.name.casefold() for r in event.resources)
                approval = Approval(
                    vm=caller.name,
                    event_id=event.event_id,
                    at=datetime.fromtimestamp(now, UTC),
                    counted=named,
                )
                self._approvals.append(approval)
                recorded.append(approval)
                if named and caller.name not in event.approved_by:
                    event.approved_by.append(caller.name)
                if (
                    event.status == SCHEDULED
                    and event.event_type != TERMINATE
                    and self._approved(event)
                ):
                    self._start(event, now)
            self._release_terminates(now)
            self._settle()
            return recorded

    def _approved(self, event: Event) -> bool:
        if self.approval_mode == "any":
            return bool(event.approved_by)
        return {r.casefold() for r in event.resources} <= {a.casefold() for a in event.approved_by}

    @property
    def approvals(self) -> list[Approval]:
        with self._lock:
            return list(self._approvals)

    # ------------------------------------------------------------------ time

    def tick(self) -> None:
        """Apply whatever the clock says is due (the server calls this a few times a second)."""
        with self._lock:
            self._settle()

    def _now(self) -> float:
        return self._as_of if self._as_of is not None else self.clock()

    def _start(self, event: Event, now: float) -> None:
        event.status = STARTED
        event.started_at = now
        self._dirty = True
        self._pause_guests(event, now)

    def _end(self, event: Event, now: float, reason: str) -> None:
        event.ended_at = now
        event.end_reason = reason
        self._dirty = True
        if event.follow and event.scenario in SCENARIOS:
            outer, self._as_of = self._as_of, now
            try:
                self._raise(SCENARIOS[event.scenario], event.follow[:1], event.follow[1:])
            finally:
                self._as_of = outer

    def _release_terminates(self, now: float) -> None:
        """Start approved Terminate events once none of their scale set is left unapproved.

        The seed's rule: VM_2's approved deletion waits until VM_1's pending one is approved
        or times out, and simultaneous deletions all need approval.
        """
        batches: dict[str, list[Event]] = {}
        for event in self._events.values():
            if event.active and event.status == SCHEDULED and event.event_type == TERMINATE:
                for key in self._terminate_keys(event):
                    batches.setdefault(key, []).append(event)
        for batch in batches.values():
            if all(self._approved(e) for e in batch):
                for event in batch:
                    if event.status == SCHEDULED:
                        self._start(event, now)

    def _terminate_keys(self, event: Event) -> set[str]:
        keys = set()
        for name in event.resources:
            vm = self._vms.get(name.casefold())
            keys.add(f"set:{vm.scale_set.casefold()}" if vm and vm.scale_set else f"vm:{name}")
        return keys

    def _advance(self) -> None:
        if self._advancing:  # apply() below re-enters through add_event
            return
        self._advancing = True
        try:
            self._advance_once()
        finally:
            self._advancing = False

    def _advance_once(self) -> None:
        now = self.clock()
        while self._pending and self._pending[0].due <= now:
            pending = self._pending.pop(0)
            self._as_of = pending.due  # as if applied on time, however late we look
            try:
                self.apply(pending.spec)
            except SimulatorError as exc:
                # Checked when scheduled; only a VM or set removed since can get here.
                self.errors.append(f"scheduled {pending.spec.model_dump(exclude_none=True)}: {exc}")
            finally:
                self._as_of = None
        for event in list(self._events.values()):  # a rolling scenario adds as events end
            if not event.active:
                continue
            if event.status == SCHEDULED:
                cancel_first = event.cancel_at is not None and (
                    event.not_before is None or event.cancel_at <= event.not_before
                )
                if cancel_first and event.cancel_at is not None and now >= event.cancel_at:
                    self._end(event, event.cancel_at, "cancelled")
                    continue
                if event.not_before is not None and now >= event.not_before:
                    # Started at NotBefore, not when someone looked: a clock that jumps
                    # (tests, a stalled process) still gets the right removal time.
                    self._start(event, event.not_before)
            started = event.started_at
            if event.status == STARTED and started is not None and now >= started + event.impact:
                self._end(event, started + event.impact, "completed")
        self._release_terminates(now)

    def _settle(self) -> None:
        """Advance time, then bump the incarnation of every VM whose event list changed.

        Documents are only re-rendered after something changed, so a thousand relays polling
        once a second cost a lookup each, not a thousand renders each.
        """
        self._advance()
        if not self._dirty:
            return
        self._dirty = False
        for vm in self._vms.values():
            events = [e.render(SCHEDULED_EVENTS_API_VERSION) for e in self._visible(vm)]
            if events != vm.events:
                vm.events = events
                vm.incarnation += 1
                document = {"DocumentIncarnation": vm.incarnation, "Events": events}
                vm.history.append(document)
                for listener in list(self._listeners):
                    listener(vm.name, vm.incarnation, document)
        self._tell_event_listeners()

    def _tell_event_listeners(self) -> None:
        """Every status change of every event, as Event Grid reports them (ended events as
        Completed or Canceled); done after the documents, so a listener sees both agree."""
        for event in self._events.values():
            status = self.grid_status(event)
            if self._event_states.get(event.event_id) == status:
                continue
            self._event_states[event.event_id] = status
            if not self._event_listeners:
                continue
            rendered = event.render(SCHEDULED_EVENTS_API_VERSION) or {}
            rendered = {**rendered, "EventStatus": status}
            owner = self.owner_of(event)
            for listener in list(self._event_listeners):
                listener(rendered, owner)

    @staticmethod
    def grid_status(event: Event) -> str:
        if event.active:
            return event.status
        return COMPLETED if event.started_at is not None else CANCELED

    def subscribe_events(self, listener: EventListener) -> None:
        """Call `listener(event, owner)` on every status change of an event, Completed and
        Canceled included (under the lock: keep it quick and do not block)."""
        with self._lock:
            self._event_listeners.append(listener)

    def subscribe(self, listener: Listener) -> None:
        """Call `listener(vm, incarnation, document)` on every document change (under the lock:
        keep it quick and do not block)."""
        with self._lock:
            self._listeners.append(listener)
