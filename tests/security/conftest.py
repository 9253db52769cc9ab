"""A small fleet to attack: two VMs of one availability set, each with what a relay holds.

Each VM has its relay's own key file (relay.keystore, in its own state directory), its IMDS
(the simulator: attested documents, compute metadata, tokens) and a real callback server
(relay.callback) listening where Azure says the VM is: its own loopback address
(127.0.0.N, from the simulator's Resource Graph) on the bridge's one port. Messages are made
by the relay's own sending path (relay.attest.AttestingSender: the VM's key, an attested
document from the VM's IMDS for the exact bytes), so an attacker's message is what a
compromised relay can really produce. The app side is the real one: the admission step
(attestation checked against the simulator's issuer, facts from the simulator's Resource
Graph through the app's resolver), ingest, approval and the watchdog, on Azurite.
"""

from __future__ import annotations

import errno
import json
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import requests

from functions.clock import SystemClock
from functions.identity.attestation import AttestationVerifier
from functions.identity.facts import ResourceGraphResolver
from functions.identity.registry import CachedResolver, IdentityStore
from functions.model.policy import Policy, PolicyLoad, sample_rules
from functions.pipeline.admission import Admission
from functions.pipeline.context import Pipeline
from functions.pipeline.ingest import ingest_message
from functions.pipeline.publish import LocalPublisher
from functions.pipeline.results import IngestResult
from functions.settings import Settings
from functions.store.state import Store
from relay.attest import Attester, AttestingSender
from relay.callback import CallbackApp, CallbackServer
from relay.imds import ImdsClient
from relay.keystore import KeyStore
from relay.models import parse_envelope
from simulator import Simulator, SimulatorServer
from simulator import identity as azure
from simulator.arm import simulated_vm_id
from tests.conftest import free_port
from tests.identity.test_facts import SimulatorCredential

APP_SECRET = b"security-suite-app-secret-0123456789abcdef"


class Captured:
    """The relay's innermost sender: keeps what would go to Service Bus (the attacker's
    send right is that queue, nothing more)."""

    def __init__(self) -> None:
        self.bodies: list[str] = []

    def describe(self) -> str:
        return "captured"

    def send(self, envelope: Any, body: str) -> None:
        self.bodies.append(body)


@dataclass
class Vm:
    """One VM: its relay's key file, its IMDS, its callback, and its sending path."""

    name: str
    vm_id: str
    address: str
    state: Path
    imds: ImdsClient
    keys: KeyStore
    captured: Captured = field(default_factory=Captured)
    callback: CallbackServer | None = None
    sequence: int = 0

    def __post_init__(self) -> None:
        vm = {"name": self.name, "vm_id": self.vm_id}
        self.sender = AttestingSender(self.captured, Attester(self.imds), self.keys, vm=vm)

    def message(
        self,
        events: list[dict[str, Any]] | None = None,
        *,
        kind: str = "document",
        incarnation: int | None = None,
        claims: dict[str, Any] | None = None,
        **fields: Any,
    ) -> str:
        """What this VM's relay sends for `events` (its own vm claims overridable, as a
        compromised relay would), attested by this VM's IMDS for these exact bytes."""
        self.sequence += 1
        document = None
        if events is not None:
            document = {"DocumentIncarnation": incarnation or self.sequence, "Events": events}
        data: dict[str, Any] = {
            "schema": 1,
            "kind": kind,
            "vm": {"name": self.name, "vm_id": self.vm_id, **(claims or {})},
            "relay_version": "security-suite",
            "sequence": self.sequence,
            "observed_at": datetime.now(UTC).isoformat(),
            "document": document,
            "events": "own",
            **fields,
        }
        text = json.dumps(data)
        self.sender.send(parse_envelope(text), text)
        return self.captured.bodies[-1]


@dataclass
class Fleet:
    server: SimulatorServer
    pipeline: Pipeline
    publisher: LocalPublisher
    store: Store
    vms: dict[str, Vm]
    port: int

    @property
    def sim(self) -> Simulator:
        return self.server.sim

    def deliver(self, body: str, enqueued_at: datetime | None = None) -> IngestResult:
        """The documents queue: where every relay (and so an attacker) can send;
        `enqueued_at`: when Service Bus stored the message (its EnqueuedTimeUtc)."""
        return ingest_message(
            body, self.pipeline, message_id=uuid.uuid4().hex, enqueued_at=enqueued_at
        )

    def imds_events(self, vm: str) -> list[dict[str, Any]]:
        return list(self.sim.document(vm)["Events"])

    def rejected(self) -> list[str]:
        return [row["reason"] for row in self.store.rejected_rows()]


def _settings(port: int, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "approval_budget_seconds": 3,
        "approvers": "relay",
        "relay_callback_port": port,
        "app_secret": APP_SECRET.decode(),
        **overrides,
    }
    # Microsoft's sample (opt-in hold): these tests were written against held Platform
    # and approved User events (the default before issue 45).
    return Settings(**values).with_policy(PolicyLoad(policy=Policy(rules=sample_rules())))


@pytest.fixture
def fleet(azurite: str, tmp_path: Path) -> Iterator[Fleet]:
    with open_fleet(azurite, tmp_path) as made:
        yield made


@contextmanager
def open_fleet(azurite: str, tmp_path: Path) -> Iterator[Fleet]:
    """The fleet on Azurite at `azurite` (a connection string), its VMs' state in
    `tmp_path`: the `fleet` fixture, and the bench's hostile-message cost
    (tests/security/hostile.py)."""
    sim = Simulator(time_scale=1.0)
    sim.add_availability_set("as1", ["victim", "attacker"])
    server = SimulatorServer(sim).start()
    port = free_port()
    store = Store.from_connection_string(azurite, "s" + uuid.uuid4().hex[:12]).ensure_tables()
    session = requests.Session()
    resolver = ResourceGraphResolver(session, SimulatorCredential(server), server.arm_url)
    registry = IdentityStore.from_service(store.service, APP_SECRET, store.prefix).ensure_table()
    admission = Admission(
        verifier=AttestationVerifier(roots_pem=azure.test_issuer().root_pem),
        identities=CachedResolver(registry, resolver),
        callback_port=port,
    )
    publisher = LocalPublisher()
    pipeline = Pipeline(
        store, _settings(port), publisher, session, SystemClock(), admission=admission
    )
    vms: dict[str, Vm] = {}
    apps: dict[str, CallbackApp] = {}
    try:
        for name in ("victim", "attacker"):
            imds = ImdsClient(server.vm_url(name))
            vm_id = simulated_vm_id(name)
            address = _address(resolver, vm_id)
            keys = KeyStore(tmp_path / name)
            vms[name] = Vm(name, vm_id, address, tmp_path / name, imds, keys)
            apps[name] = CallbackApp(keys, vm_id, name, imds)
        # The port was free when chosen; a parallel worker may bind it first: choose again.
        for attempt in range(20):
            try:
                for name, vm in vms.items():
                    vm.callback = CallbackServer(
                        f"{vm.address}:{port}", apps[name], poll_interval=0.05
                    ).start()
                break
            except OSError as exc:
                if exc.errno != errno.EADDRINUSE or attempt == 19:
                    raise
                for vm in vms.values():
                    if vm.callback is not None:
                        vm.callback.stop()
                        vm.callback = None
                port = free_port()
        pipeline.settings = _settings(port)
        admission.callback_port = port
        yield Fleet(server, pipeline, publisher, store, vms, port)
    finally:
        for vm in vms.values():
            if vm.callback is not None:
                vm.callback.stop()
        server.stop()


def _address(resolver: ResourceGraphResolver, vm_id: str) -> str:
    facts = resolver.resolve(vm_id)
    assert facts.address and facts.address.startswith("127."), facts
    return facts.address
