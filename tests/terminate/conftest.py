"""Fixtures for the terminate workflow: a drains table in Azurite, real relays with hooks."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import requests
from azure.data.tables import TableServiceClient

from functions.approvers.relay import RelayTarget
from functions.identity.keys import CallbackKey
from functions.model.drains import RelayFacts
from functions.model.envelope import parse_not_before
from functions.model.event import Decision, EventSnapshot, Links, Notification, Transition
from functions.store.drains import DrainStore
from functions.terminate.targets import DrainTargets
from functions.terminate.workflow import DrainContext, DrainSettings
from local.azurite import free_port
from local.hook_unit import HookUnit
from relay.callback import CallbackApp, CallbackServer
from relay.hooks import HookRunner
from relay.imds import ImdsClient
from relay.keystore import KeyStore
from relay.ready import Readiness
from simulator.arm import simulated_vm_id


def target_of(url: str, vm_id: str, keys: KeyStore) -> RelayTarget:
    """How the app knows a relay: Azure's address (here its loopback URL), the VM's vmId,
    and the key its relay gave in an attested message (current first, then previous)."""
    known = [keys.current_key(), *([keys.previous] if keys.previous else [])]
    return RelayTarget(
        url=url,
        vm_id=vm_id,
        keys=tuple(CallbackKey(key_id=k.id, secret=k.secret) for k in known),
    )


@pytest.fixture
def drains(azurite: str) -> Iterator[DrainStore]:
    service = TableServiceClient.from_connection_string(azurite)
    prefix = f"t{uuid.uuid4().hex[:10]}"
    store = DrainStore.from_service(service, prefix).ensure_table()
    try:
        yield store
    finally:
        service.delete_table(f"{prefix}drains")


class NoWaitClock:
    """Real time, but waits between retries return at once (the retry logic is under test)."""

    def now(self) -> datetime:
        return datetime.now(UTC)

    def sleep(self, seconds: float) -> None:
        pass


@dataclass
class Approvals:
    """Stands in for functions.pipeline.approve.approve_event: records each call and its
    time, and which relays it was allowed to ask (`relays`, in call order)."""

    answer: str = "approved"
    calls: list[tuple[str, datetime, datetime]] = field(default_factory=list)
    relays: list[tuple[str, ...] | None] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __call__(
        self, event_id: str, give_up_at: datetime, relays: tuple[str, ...] | None = None
    ) -> str:
        with self.lock:
            self.calls.append((event_id, give_up_at, datetime.now(UTC)))
            self.relays.append(relays)
        return self.answer


# EventId -> the VMs its note names (terminate_note): the stand-in for the reporter rows
# says each of them reported the event and its own view decided drain.
NAMED: dict[str, tuple[str, ...]] = {}


def every_named_vm_drains(event_id: str, ended: bool) -> DrainTargets:
    """Stands in for the reporter rows (functions.terminate.wiring): every VM the note
    names decided drain on its own view (tests/security holds the real rows to it)."""
    return DrainTargets(drain=NAMED.get(event_id, ()))


@dataclass
class Harness:
    store: DrainStore
    approvals: Approvals = field(default_factory=Approvals)
    published: list[Notification] = field(default_factory=list)
    callbacks: dict[str, RelayTarget] = field(default_factory=dict)
    resolve: Callable[[str], RelayTarget | None] | None = None
    # VM -> its relay's facts (functions.model.drains.RelayFacts); a VM not listed has a
    # relay a load balancer probed just now (its readiness drain works), which is what
    # every test of the drain's steps assumes unless it says otherwise.
    facts: dict[str, RelayFacts | None] = field(default_factory=dict)

    def relay_facts(self, vm: str) -> RelayFacts | None:
        if vm in self.facts:
            return self.facts[vm]
        now = datetime.now(UTC)
        return RelayFacts(heard=now, contract=2, probe_at=now)

    def context(self, **overrides: Any) -> DrainContext:
        values: dict[str, Any] = {
            "store": self.store,
            "session": requests.Session(),
            "publish": self.published.append,
            "approve": self.approvals,
            "relay_target": self.resolve or self.callbacks.get,
            "own_drains": every_named_vm_drains,
            "relay_facts": self.relay_facts,
        }
        values.update(overrides)
        return DrainContext(**values)

    def transitions(self) -> list[str]:
        return [note.transition.value for note in self.published]


@pytest.fixture
def harness(drains: DrainStore) -> Harness:
    return Harness(drains)


def settings(**fields: Any) -> DrainSettings:
    values: dict[str, Any] = {
        "step_timeout_seconds": 5,
        "safety_margin_seconds": 2,
        "approve_reserve_seconds": 1,
        "poll_seconds": 0.2,
    }
    values.update(fields)
    return DrainSettings(**values)


def terminate_note(
    event_id: str | None = None,
    resources: tuple[str, ...] = ("web_0",),
    notice: float = 30,
    event_type: str = "Terminate",
    not_before: datetime | None = None,
    **decision_fields: Any,
) -> Notification:
    """A `decided` drain of an event (a Terminate unless `event_type` says otherwise),
    NotBefore `notice` seconds from now unless given (imds_not_before: the simulator's)."""
    now = datetime.now(UTC)
    decision = {"action": "drain", "rule": "scale-in-drain", "severity": "warning"}
    decision.update(decision_fields)
    event_id = event_id or str(uuid.uuid4()).upper()
    NAMED[event_id] = resources
    return Notification(
        transition=Transition.DECIDED,
        occurred_at=now,
        event=EventSnapshot(
            event_id=event_id,
            event_type=event_type,
            event_status="Scheduled",
            event_source="Platform",
            resources=resources,
            not_before=not_before or now + timedelta(seconds=notice),
            scale_sets=("web",),
            reported_by=resources,
        ),
        decision=Decision(**decision),
        links=Links(status_url="https://bridge.example/api/status"),
    )


def imds_not_before(sim: Any, event_id: str) -> datetime:
    """The event's NotBefore as IMDS writes it (whole seconds): the view the app decides on
    and the relay checks an approval against."""
    value = parse_not_before(sim.describe_event(event_id)["NotBefore"])
    assert value is not None
    return value


@dataclass
class Relays:
    """Real relays (callback + hook runner) for a simulated scale set, reading real IMDS."""

    sim: Any
    targets: dict[str, RelayTarget]
    ran: Path  # each hook run appends "<vm> <event id>" here
    undone: Path | None = None  # each `undrain` hook run appends "<vm> <event id> <status>"
    # Starts the callbacks of a fleet started with `listening=False` (a relay unreachable
    # until then: connection refused at its address).
    listen: Callable[[], None] = lambda: None
    probes: dict[str, Readiness] = field(default_factory=dict)  # VM -> its readiness probe

    def ready(self, vm: str) -> int:
        """What the VM's probe answers a load balancer now (200 or 503)."""
        return self.probes[vm].health()[0]

    def runs(self) -> list[str]:
        return self.ran.read_text().splitlines() if self.ran.exists() else []

    def undrains(self) -> list[str]:
        if self.undone is None or not self.undone.exists():
            return []
        return self.undone.read_text().splitlines()


@pytest.fixture
def relays(tmp_path: Path) -> Iterator[Callable[..., Relays]]:
    from simulator import Simulator, SimulatorServer

    started: list[Any] = []

    def start(
        count: int = 2,
        hook_seconds: float = 0.0,
        hook_wait: float = 5.0,
        listening: bool = True,
        hooks: bool | frozenset[str] = True,
        readiness: bool = False,
    ) -> Relays:
        """`count` relays; `hooks`: with the operator's `drain` and `undrain` scripts (all,
        or the VMs named); `readiness`: with the readiness probe on (relay.ready)."""
        ran = tmp_path / "ran.txt"
        script = tmp_path / "drain.sh"
        script.write_text(
            "#!/bin/sh\n"
            f"sleep {hook_seconds}\n"
            f'echo "$SCHEDULED_EVENT_VM_NAME $SCHEDULED_EVENT_ID" >> {ran}\n'
            'echo "drained $SCHEDULED_EVENT_VM_NAME"\n'
        )
        script.chmod(0o755)
        undone = tmp_path / "undone.txt"
        undrain = tmp_path / "undrain.sh"
        undrain.write_text(
            "#!/bin/sh\n"
            'echo "$SCHEDULED_EVENT_VM_NAME $SCHEDULED_EVENT_ID $SCHEDULED_EVENT_STATUS"'
            f" >> {undone}\n"
            'echo "back in service"\n'
        )
        undrain.chmod(0o755)
        # The hook unit that runs the scripts for every relay here (relay/hooks.py).
        unit_path = tmp_path / f"hooks-{len(started)}.sock"
        unit = HookUnit(unit_path, {"drain": script, "undrain": undrain}, 10).start()
        started.append(unit)
        server = SimulatorServer(Simulator(time_scale=1.0)).start()
        started.append(server)
        server.sim.add_scale_set("web", count)
        targets = {}
        probes: dict[str, Readiness] = {}
        later: list[Any] = []
        lock = threading.Lock()

        def listen() -> None:
            with lock:
                while later:
                    address, app = later.pop(0)
                    started.append(CallbackServer(address, app).start())

        for index in range(count):
            vm = f"web_{index}"
            probe = Readiness(tmp_path / vm) if readiness else None
            scripts = hooks if isinstance(hooks, bool) else vm in hooks
            names: dict[str, Path | None] = {"drain": script, "undrain": undrain} if scripts else {}
            if probe is not None:
                probes[vm] = probe
                names.update(probe.hooks)
            runner = HookRunner(names, tmp_path / vm, 10, vm, unit.path, observer=probe)
            keys = KeyStore(tmp_path / vm / "keys")
            vm_id = simulated_vm_id(vm)
            app = CallbackApp(
                keys, vm_id, vm, ImdsClient(server.vm_url(vm)), runner, hook_wait=hook_wait
            )
            if listening:
                callback = CallbackServer("127.0.0.1:0", app).start()
                started.append(callback)
                targets[vm] = target_of(callback.url, vm_id, keys)
            else:  # its address refuses connections until listen()
                address = f"127.0.0.1:{free_port()}"
                later.append((address, app))
                targets[vm] = target_of(f"http://{address}", vm_id, keys)
        return Relays(server.sim, targets, ran, undone, listen, probes)

    try:
        yield start
    finally:
        for server in reversed(started):
            server.stop()
