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

import re
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from functions.model.envelope import (
    API_VERSIONS,
    SCHEDULED,
    SCHEDULED_EVENTS_API_VERSION,
    STARTED,
    TERMINATE,
)
from simulator.faults import Endpoint, Fault, FaultAction, FaultBook, FaultKind
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

DEFAULT_VM = "myVM"
COMPLETED, CANCELED = "Completed", "Canceled"  # Event Grid's end statuses
DEFAULT_TERMINATE_TIMEOUT = 300.0
MIN_TERMINATE_TIMEOUT, MAX_TERMINATE_TIMEOUT = 300.0, 900.0

_VM_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,79}$")


class SimulatorError(ValueError):
    """A request the simulator cannot honour; the message says why (the control API's 400)."""


class NotFound(SimulatorError):
    """An unknown VM or event (the control API's 404)."""


class Conflict(SimulatorError):
    """An event in a state that does not allow the request (ARM's 409)."""


@dataclass
class _Pending:
    due: float
    spec: EventSpec


Listener = Callable[[str, int, dict[str, Any]], None]
# (event as IMDS writes it, with EventStatus Completed/Canceled once it ended; its owner
# (resource type, name) as Event Grid and ARM name it)
EventListener = Callable[[dict[str, Any], tuple[str, str]], None]


class Simulator:
    """IMDS Scheduled Events for a set of simulated VMs. Thread-safe: one re-entrant lock."""

    def __init__(
        self,
        time_scale: float = 1.0,
        approval_mode: Literal["any", "all"] = "any",
        clock: Callable[[], float] = time.time,
        location: str = "westeurope",
        rate_limit: float | None = None,
    ) -> None:
        """`rate_limit`: answer 429 beyond this many requests per second per VM, as IMDS
        does (5/s on Azure); None (default) means no limit."""
        if not time_scale > 0:
            raise SimulatorError("time_scale must be greater than 0")
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
        self.errors: list[str] = []

    # ------------------------------------------------------------------ VMs

    def add_vm(
        self,
        name: str,
        availability_set: str | None = None,
        scale_set: str | None = None,
        spot: bool = False,
    ) -> str:
        """Add a VM. A VM belongs to at most one set; its set-mates see its events."""
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
            vm = Vm(name, availability_set, scale_set, spot)
            vm.history.append({"DocumentIncarnation": 1, "Events": []})
            self._vms[name.casefold()] = vm
            self._dirty = True
            if scale_set and scale_set not in self._scale_sets:
                self._scale_sets[scale_set] = DEFAULT_TERMINATE_TIMEOUT
            self._settle()
        return name

    def add_scale_set(
        self, name: str, count: int, terminate_timeout: float = DEFAULT_TERMINATE_TIMEOUT
    ) -> list[str]:
        """Add instances `name_0..name_{count-1}` with terminate notifications enabled."""
        if not isinstance(count, int) or not 1 <= count <= 1000:
            raise SimulatorError("a scale set has 1 to 1000 instances")
        if not MIN_TERMINATE_TIMEOUT <= terminate_timeout <= MAX_TERMINATE_TIMEOUT:
            raise SimulatorError("notBeforeTimeout must be between PT5M and PT15M")
        with self._lock:
            self._scale_sets[name] = float(terminate_timeout)
            return [self.add_vm(f"{name}_{i}", scale_set=name) for i in range(count)]

    def add_availability_set(self, name: str, vms: Iterable[str]) -> list[str]:
        with self._lock:
            return [self.add_vm(vm, availability_set=name) for vm in vms]

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
                "terminate_timeout": self._scale_sets.get(vm.scale_set) if vm.scale_set else None,
            }

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
                not_before=now + notice / self.time_scale if status == SCHEDULED else None,
                impact=impact / self.time_scale,
                cancel_at=now + cancel_after / self.time_scale
                if cancel_after is not None
                else None,
                status=status,
                scenario=scenario,
                started_at=now if status == STARTED else None,
            )
            self._events[event_id] = event
            self._dirty = True
            self._settle()
            return event_id

    def _default_notice(self, event_type: str, resources: list[str]) -> float:
        if event_type == TERMINATE:
            timeouts = [
                self._scale_sets[vm.scale_set]
                for vm in (self.vm(r) for r in resources)
                if vm.scale_set in self._scale_sets
            ]
            return min(timeouts) if timeouts else DEFAULT_TERMINATE_TIMEOUT
        return DEFAULT_NOTICE.get(event_type, FALLBACK_NOTICE)

    def play(self, name: str, target: str | None = None) -> list[str]:
        """Play a built-in scenario on a VM or a set; return the EventIds it raised."""
        scenario = SCENARIOS.get(name)
        if scenario is None:
            raise SimulatorError(f"unknown scenario {name!r}; known: {', '.join(SCENARIOS)}")
        with self._lock:
            self._advance()
            names = self._resolve_target(target, scenario)
            if scenario.rolling:
                # One VM (update domain) at a time: the next gets its event when this one ends.
                return [self._raise(scenario, names[:1], follow=names[1:])]
            # A scale-in deletes instances one Terminate event each, all with the same
            # NotBefore; everything else is one event naming all affected VMs.
            groups = [[n] for n in names] if scenario.event_type == TERMINATE else [names]
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

    def _resolve_target(self, target: str | None, scenario: Scenario | None) -> list[str]:
        """VM names, set names (comma-separated), or None (a sensible default) -> the VMs."""
        needs = scenario.needs if scenario else None
        label = scenario.name if scenario else "this event"
        if target is None:
            if needs == "spot":
                spots = [vm.name for vm in self._vms.values() if vm.spot]
                if not spots:
                    raise SimulatorError(f"{label} needs a Spot VM: add one (--spot NAME)")
                return spots[:1]
            if needs == "set":
                sets = [
                    vm.availability_set or vm.scale_set
                    for vm in self._vms.values()
                    if vm.availability_set or vm.scale_set
                ]
                if not sets:
                    return [self.root_vm()]
                target = sets[0]
            elif needs == "scale-set":
                if not self._scale_sets:
                    raise SimulatorError(
                        f"{label} needs a scale-set instance: add a scale set (--scale-set NAME:N)"
                    )
                target = next(iter(self._scale_sets))
            else:
                return [self.root_vm()]
        names: list[str] = []
        for part in (p.strip() for p in target.split(",")):
            if part:
                names.extend(n for n in self._resolve_one(part, needs, label) if n not in names)
        if not names:
            raise SimulatorError(f"target {target!r} names no VM")
        return names

    def _resolve_one(self, target: str, needs: str | None, label: str) -> list[str]:
        vm = self._vms.get(target.casefold())
        if vm is not None:
            if needs == "spot" and not vm.spot:
                raise SimulatorError(f"{label} needs a Spot VM; {vm.name} is not one")
            if needs == "scale-set" and not vm.scale_set:
                raise SimulatorError(f"{label} needs a scale-set instance; {vm.name} is not one")
            return [vm.name]
        members = [
            v
            for v in self._vms.values()
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

    # ------------------------------------------------------------------ ARM

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

    def subscribe(self, listener: Listener) -> None:
        """Call `listener(vm, incarnation, document)` on every document change (under the lock:
        keep it quick and do not block)."""
        with self._lock:
            self._listeners.append(listener)

    # ------------------------------------------------------------------ faults

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

    def take_short_nonce(self, vm: str) -> bool:
        """A short-nonce fault applies to this attested request (see FaultBook)."""
        with self._lock:
            return self._faults.take_short_nonce(vm)

    def take_faults(self, vm: str, endpoint: str) -> FaultAction:
        """Count one valid request and say how the server must misbehave on it, if at all."""
        with self._lock:
            target = self.vm(vm)
            target.requests[endpoint] += 1
            if self._over_rate_limit(target):
                return FaultAction(kind="status", status=429)
            action = self._faults.take(target.name, endpoint)
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

    # ------------------------------------------------------------------ state

    def state(self) -> dict[str, Any]:
        """Everything, as JSON-ready data (the control API's GET /_sim/state)."""
        with self._lock:
            self._settle()
            now = self.clock()
            return {
                "now": datetime.fromtimestamp(now, UTC).isoformat(),
                "time_scale": self.time_scale,
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
