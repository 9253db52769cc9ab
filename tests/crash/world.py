"""The outside world of one scenario and the hosts that run the app inside it.

Reused from the project's own tests: the FakeClock, the signature-checking Relay stand-in,
make_settings and the attested envelopes (tests.functions.conftest), the real local HTTP
receivers for channels and drain hooks (tests.notify.receiver), the admission step as
deployed (tests.identity_harness). Only Service Bus is a stand-in here (`Topic`), as in
tests/notify/fakebus.py: Service Bus has no local emulator.

A `Host` is one Functions host: its own Store object (so no in-memory cache of rows
survives it), Pipeline, identity cache, drains store and deliveries ledger, all over the
same Azurite tables (one table prefix per scenario, emptied after each run). After a crash
the harness builds a new one.
"""

from __future__ import annotations

import functools
import re
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests
from azure.data.tables import TableServiceClient

from functions.model.event import Notification
from functions.model.policy import Policy, PolicyLoad
from functions.notify import dispatch
from functions.notify.delivery import RetryPolicy, Transport
from functions.notify.settings import ChannelSettings
from functions.pipeline.context import Pipeline
from functions.store.deliveries import DeliveryLedger
from functions.store.drains import DrainStore
from functions.store.rows import transport_options
from functions.store.state import Store
from functions.terminate.settings import DrainSettings, UndrainSettings
from functions.terminate.wiring import pipeline_context, row_drainer
from tests import identity_harness
from tests.crash.faults import Faults
from tests.functions.conftest import VERIFIER, FakeClock, Relay, make_settings
from tests.notify.receiver import Answer, Receiver, Recorded

ROOT = Path(__file__).resolve().parents[2]
SERVICE_BUS_BICEP = ROOT / "infra" / "modules" / "servicebus.bicep"
CHANNELS = dispatch.CHANNELS  # every channel the app has, each on its own subscription
SUBSCRIPTIONS = ("terminate", *CHANNELS)
WEBHOOK_SECRET = "crash-explorer-webhook-secret-0123456789"


def bicep_lock_seconds(path: Path = SERVICE_BUS_BICEP) -> float:
    """The documents queue's and the topic subscriptions' lockDuration (ISO 8601, PT10S):
    how long Service Bus waits for a dead host before it delivers the message again. Every
    entity takes the module's `lockDuration` parameter (or a literal)."""
    text = path.read_text()
    pattern = r"(?:lockDuration:\s*|param lockDuration string = )'PT(?:(\d+)M)?(?:(\d+)S)?'"
    found = set(re.findall(pattern, text))
    if len(found) != 1:
        raise ValueError(f"{path}: expected one lockDuration for every entity, found {found}")
    minutes, seconds = found.pop()
    return int(minutes or 0) * 60 + int(seconds or 0)


def bicep_max_delivery_count(path: Path = SERVICE_BUS_BICEP) -> int:
    match = re.search(r"param maxDeliveryCount int = (\d+)", path.read_text())
    if match is None:
        raise ValueError(f"{path}: no maxDeliveryCount parameter")
    return int(match.group(1))


class Topic:
    """The `notifications` topic: duplicate detection on MessageId, one copy of each
    message per subscription, peek-lock (a message stays until its handler returns)."""

    def __init__(self) -> None:
        self.messages: list[Notification] = []
        self.seen: set[str] = set()
        self.completed: dict[str, set[str]] = {name: set() for name in SUBSCRIPTIONS}
        self.deliveries: Counter[tuple[str, str]] = Counter()

    def send(self, note: Notification) -> None:
        mid = note.message_id()
        if mid in self.seen:
            return  # requiresDuplicateDetection
        self.seen.add(mid)
        self.messages.append(note)

    def pending(self, subscription: str) -> list[Notification]:
        done = self.completed[subscription]
        return [n for n in self.messages if n.message_id() not in done]

    def complete(self, subscription: str, note: Notification) -> None:
        self.completed[subscription].add(note.message_id())


class HostPublisher:
    """A host's topic sender: each send is an outgoing request the faults count."""

    def __init__(self, topic: Topic, faults: Faults) -> None:
        self.topic = topic
        self.faults = faults

    def publish(self, notification: Notification) -> None:
        label = f"topic {notification.message_id()}"
        index, lose = self.faults.request(label)
        self.topic.send(notification)
        if index:
            self.faults.done(index, label, write=True)
        if lose:
            self.faults.die_after(label)


@dataclass
class Servers:
    """The receivers of every outside effect, started once per scenario and cleared per run.

    Channel posts are attributed to the announcement being delivered when they arrive
    (`World.delivering`): the harness delivers one message at a time."""

    relay: Relay
    hook: Receiver
    channels: dict[str, Receiver]
    posts: list[tuple[str, str, Recorded]] = field(default_factory=list)
    # Azure Resource Manager and its managed identity (simulator.SimulatorServer), for a
    # scenario with the ARM approver; None otherwise.
    arm: Any = None

    def clear(self) -> None:
        self.relay.requests.clear()
        self.relay.targets.clear()
        self.relay.seen.clear()
        self.relay.script.clear()
        self.relay.drop = set()
        self.relay.bad_signatures = 0
        self.hook.requests.clear()
        for receiver in self.channels.values():
            receiver.requests.clear()
        self.posts.clear()
        if self.arm is not None:
            self.arm.arm.calls.clear()

    def http_servers(self) -> list[Any]:
        """Every receiver's socketserver, for the checkpoints (tests.crash.checkpoint)."""
        found = [self.relay.server, self.hook.server]
        found += [receiver.server for receiver in self.channels.values()]
        if self.arm is not None and self.arm._httpd is not None:
            found.append(self.arm._httpd)
        return found

    def close(self) -> None:
        self.relay.close()
        self.hook.stop()
        for receiver in self.channels.values():
            receiver.stop()
        if self.arm is not None:
            self.arm.stop()


def start_servers(
    delivering: Callable[[], str], hook_status: Callable[[str], int] = lambda _path: 200
) -> Servers:
    relay = Relay()
    hook = Receiver(Answer(200, {"drained": True})).start()
    hook.handler = lambda record: Answer(hook_status(record.path), {"path": record.path})
    answers = {"teams": Answer(202), "pagerduty": Answer(202, {"status": "success"})}
    channels = {name: Receiver(answers.get(name, Answer(200))).start() for name in CHANNELS}
    servers = Servers(relay, hook, channels)
    for name, receiver in channels.items():

        def answer(record: Recorded, channel: str = name, rec: Receiver = receiver) -> Answer:
            servers.posts.append((channel, delivering(), record))
            return rec.default

        receiver.handler = answer
    return servers


@dataclass
class Config:
    """What a scenario deploys: the policy and the app settings it differs in."""

    policy: Policy | PolicyLoad | None = None
    settings: dict[str, Any] = field(default_factory=dict)
    drain: dict[str, Any] = field(default_factory=dict)  # DrainSettings fields
    undrain: dict[str, Any] = field(default_factory=dict)
    # The customer's drain hook answers this status per path (default 200).
    hook_status: dict[str, int] = field(default_factory=dict)
    arm: bool = False  # the hosts get a managed-identity credential for the ARM approver
    # Called before each run (outside the count): Azure's own state back to the start.
    reset: Callable[[Servers], None] | None = None
    # Called with the run's Store once its tables exist (outside the count): rows only
    # the identity sync writes (placements for budgets), as Azure's facts before the run.
    seed: Callable[[Store], None] | None = None
    # Events of one disruption budget group that allows `budget_limit` out at once: the
    # `budget` invariant checks the bridge's own approvals never put more out together.
    budget_events: tuple[str, ...] = ()
    budget_limit: int = 1


class Host:
    """One Functions host: fresh objects over the shared tables (no cache survives it)."""

    def __init__(self, world: World) -> None:
        self.world = world
        self.store = Store.from_connection_string(world.connection, world.prefix)
        self.pipeline = Pipeline(
            self.store,
            world.settings,
            HostPublisher(world.topic, world.faults),
            requests.Session(),
            world.clock,
            admission=identity_harness.admission(self.store, world.clock.now, ensure=False),
            liveness_verifier=VERIFIER,
        )
        if world.config.arm:
            from azure.identity import ManagedIdentityCredential

            # A fresh host fetches its token again (the simulator's identity endpoint).
            self.pipeline.credential = ManagedIdentityCredential()
        self.drains = DrainStore.from_service(self.store.service, world.prefix)
        # As in Azure (functions.triggers.core): the one decider runs the drain from the
        # row when the `decided` notification's handler never did.
        self.pipeline.drainer = row_drainer(
            self.pipeline,
            lambda: pipeline_context(self.pipeline, self.drains, (WEBHOOK_SECRET.encode(),)),
            lambda: world.drain_settings,
            lambda: world.undrain_settings,
        )
        self.ledger = DeliveryLedger.from_service(self.store.service, world.prefix)
        clock = world.clock
        self.transport = Transport(
            requests.Session(),
            RetryPolicy(attempts=3, backoff_seconds=1, max_wait_seconds=5),
            sleep=clock.sleep,
            clock=clock.now,
        )


@functools.cache
def harness_service(connection: str) -> TableServiceClient:
    """The harness's own Table client for `connection` (Azurite), built once per process:
    it creates, reads and drops each run's tables outside the count (`Faults.paused`), so
    nothing of it needs to be fresh per run, unlike a Host's own Store."""
    endpoint = TableServiceClient.from_connection_string(connection).url
    return TableServiceClient.from_connection_string(connection, **transport_options(endpoint))


def run_tables(connection: str, prefix: str) -> list[str]:
    """The names of the tables under `prefix`, asked by name range (Azurite then answers
    with the run's own tables, not with every table of every test the worker ran)."""
    service = harness_service(connection)
    # Table names are alphanumeric: every name starting with `prefix` sorts below prefix~.
    found = service.query_tables(
        "TableName ge @low and TableName lt @high",
        parameters={"low": prefix, "high": prefix + "~"},
    )
    return sorted(t.name for t in found if t.name.startswith(prefix))


@dataclass
class Made:
    """What every run of a scenario deploys alike, made once per scenario: the app's
    settings (frozen), the drain, undrain and channel settings (copied per run), and the
    tables: created by the first run, emptied after each (`World.clear_tables`), so each
    run starts on existing empty tables as the first did, and the host's own creates find
    them there; `drop` removes them when the scenario is done."""

    settings: Any = None
    drain: DrainSettings | None = None
    undrain: UndrainSettings | None = None
    channels: ChannelSettings | None = None
    prefix: str = ""  # the scenario's tables, "" until the first run creates them

    def drop(self, connection: str) -> None:
        if self.prefix:
            service = harness_service(connection)
            for name in run_tables(connection, self.prefix):
                service.delete_table(name)
            self.prefix = ""


class World:
    """One run's shared state: the scenario's Azurite tables (empty at the start), the
    FakeClock, the topic, the servers (shared by the runs of a scenario), the fault plan."""

    def __init__(
        self,
        connection: str,
        servers: Servers,
        faults: Faults,
        config: Config,
        tag: str = "",
        made: Made | None = None,
    ) -> None:
        self.connection = connection
        made = made if made is not None else Made()
        self.made = made
        fresh = not made.prefix
        self.prefix = made.prefix or "x" + uuid.uuid4().hex[:10]
        made.prefix = self.prefix
        self.tables: list[str] | None = None  # the run's table names, once read
        self.clock = FakeClock()
        self.topic = Topic()
        self.servers = servers
        self.faults = faults
        self.config = config
        if made.settings is None:
            made.settings = make_settings(config.policy, **config.settings)
            made.drain = DrainSettings(**{"http_url": f"{servers.hook.url}/drain", **config.drain})
            made.undrain = UndrainSettings(
                **{"http_url": f"{servers.hook.url}/undrain", **config.undrain}
            )
            made.channels = _channel_settings(servers)
        assert made.drain is not None and made.undrain is not None and made.channels is not None
        self.settings = made.settings  # frozen: shared by the runs
        self.drain_settings = made.drain.model_copy(deep=True)
        self.undrain_settings = made.undrain.model_copy(deep=True)
        self.channel_settings = made.channels.model_copy(deep=True)
        self.delivering = ""  # the MessageId a channel is delivering right now
        faults.now = self.clock.now
        servers.relay.clock = self.clock.now  # each /v1/start stamped with this run's time
        with faults.paused():
            if config.reset is not None:
                config.reset(servers)
            store = Store(harness_service(connection), self.prefix)
            if fresh:
                store.ensure_tables()
                DeliveryLedger.from_service(store.service, self.prefix).ensure_table()
            if config.seed is not None:
                config.seed(store)
            self.host = self.boot()

    def boot(self) -> Host:
        with self.faults.paused():
            return Host(self)

    def clear_tables(self, rows: dict[str, list[dict[str, Any]]] | None = None) -> None:
        """The run's tables emptied, so the next run starts on the same empty tables: each
        table that holds a row (`rows`: as tests.crash.state.table_rows read them after the
        run; None: every table of the run) dropped and created again under its name.
        Azurite drops a table at once, and two requests per table cost a third of one
        delete transaction per partition (34 ms a run instead of 128 ms, measured on eight
        tables). A row left behind would show in the next run's end state as a difference:
        it could not pass unseen."""
        with self.faults.paused():
            service = harness_service(self.connection)
            if rows is None:  # the run stopped before its tables were read
                names = run_tables(self.connection, self.prefix)
            else:
                names = [self.prefix + table for table, entities in rows.items() if entities]
            for name in names:
                service.delete_table(name)
                service.create_table(name)


def _channel_settings(servers: Servers) -> ChannelSettings:
    urls = {name: receiver.url for name, receiver in servers.channels.items()}
    return ChannelSettings(
        teams_webhook_url=f"{servers.channels['teams'].url}/teams",
        **({"slack_webhook_url": f"{urls['slack']}/services/T0/B0/x"} if "slack" in urls else {}),
        pagerduty_routing_key="R0123456789ABCDEF0123456789ABCDEF",
        pagerduty_events_url=f"{servers.channels['pagerduty'].url}/v2/enqueue",
        webhook_url=f"{servers.channels['webhook'].url}/hook",
        webhook_secret=WEBHOOK_SECRET,
    )
