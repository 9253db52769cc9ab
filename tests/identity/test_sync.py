"""The bulk identity sync against the simulator's Resource Graph (over HTTP, its documented
limits, 1,000-row pages and 15-per-5-s quota) and the identities table on Azurite."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import requests
from azure.data.tables import TableServiceClient

from functions.identity import graph_state, sync
from functions.identity.facts import ResourceGraphRefused, ResourceGraphResolver, StaticResolver
from functions.identity.keys import CallbackKey
from functions.identity.registry import CachedResolver, Identity, IdentityStore
from functions.identity.sync import Cursor, load_cursor, save_cursor, sync_identities
from functions.model.event import Notification, Transition
from functions.web.pages import graph_warning
from simulator import Simulator, SimulatorServer
from simulator.resource_graph import vm_row
from tests.identity.test_facts import SimulatorCredential
from tests.simulator.test_resource_graph import OLD_FACTS_QUERY

pytestmark = pytest.mark.azurite

APP = b"S" * 40
T0 = datetime(2026, 11, 24, 10, 0, tzinfo=UTC)
SUB = "aaaaaaaa-0000-0000-0000-000000000000"
BASE = f"/subscriptions/{SUB}/resourceGroups/rg/providers"


def vm_id(i: int) -> str:
    return f"{i:08x}-0000-4000-8000-000000000000"


def standalone(i: int, nic: int = 0, primary: bool = True) -> dict[str, Any]:
    rid = f"{BASE}/Microsoft.Compute/virtualMachines/vm{i:06d}"
    row = vm_row(
        table="resources",
        resource_id=rid,
        subscription_id=SUB,
        resource_group="rg",
        vm_id=vm_id(i),
        nic_id=f"{BASE}/Microsoft.Network/networkInterfaces/vm{i:06d}-nic{nic}",
        address=f"10.{nic}.{i // 250 % 250}.{i % 250 + 4}",
    )
    row["nicPrimary"] = "true" if primary else "false"
    return row


def uniform(i: int) -> dict[str, Any]:
    rid = f"{BASE}/Microsoft.Compute/virtualMachineScaleSets/web/virtualMachines/{i}"
    return vm_row(
        table="computeresources",
        resource_id=rid,
        subscription_id=SUB,
        resource_group="rg",
        vm_id=vm_id(900000 + i),
        nic_id=f"{rid}/networkInterfaces/web-nic",
        address=f"10.9.{i // 250}.{i % 250 + 4}",
    )


class Clock:
    """The quota's clock and the sync's: sleeping moves both."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


@pytest.fixture
def server() -> Iterator[SimulatorServer]:
    server = SimulatorServer(Simulator(time_scale=60.0)).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def store(azurite: str) -> IdentityStore:
    service = TableServiceClient.from_connection_string(azurite)
    prefix = "t" + uuid.uuid4().hex[:12]
    return IdentityStore.from_service(service, APP, prefix=prefix).ensure_table()


def resolver(server: SimulatorServer) -> ResourceGraphResolver:
    return ResourceGraphResolver(
        requests.Session(), SimulatorCredential(server), server.arm_url, subscriptions=[SUB]
    )


def run(server, store, clock, *, budget=600.0, page_rows=1000, every=timedelta(hours=3)):
    return sync_identities(
        resolver(server).graph,
        store.table,
        lambda: T0,
        every=every,
        budget_seconds=budget,
        sleep=clock.sleep,
        monotonic=clock,
        page_rows=page_rows,
    )


def test_a_fleet_is_enrolled_by_the_page_and_its_first_messages_ask_azure_nothing(server, store):
    rows = [standalone(i) for i in range(2300)] + [uniform(i) for i in range(150)]
    server.arm.graph.inventory = lambda: rows
    clock = Clock()
    server.arm.graph.clock = clock
    report = run(server, store, clock)
    assert report.finished_pass and report.pages == 4  # 1000 + 1000 + 300, then 150
    assert report.queries == 4 and server.arm.graph.queries == 4
    assert report.vms_written == 2450 and report.unusable == 0
    # 8 partitions: a page is at most 2 transactions per partition; plus the cursor.
    assert report.table_requests <= 2 + 8 * 2 * 3 + 8
    assert store.get(vm_id(1234)).facts.address == "10.0.4.238"
    web = store.get(vm_id(900007)).facts
    assert (web.name, web.scale_set, web.address) == ("web_7", "web", "10.9.0.11")
    # A VM's first message: its key is stored beside the synced facts, no query.
    upstream = CountingResolver()
    cache = CachedResolver(store, upstream, clock=lambda: T0 + timedelta(minutes=1))
    key = CallbackKey.generate()
    assert cache.enroll(vm_id(42), key).keys == (key,)
    assert upstream.calls == 0


class CountingResolver(StaticResolver):
    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def resolve(self, vm_id: str) -> Any:
        self.calls += 1
        return super().resolve(vm_id)


def test_rows_azure_describes_badly_are_counted_and_the_rest_written(server, store):
    twin = {**standalone(3), "id": standalone(3)["id"] + "-twin"}  # two resources, one vmId
    rows = [standalone(1), {**standalone(2), "vmId": "not-a-uuid"}, standalone(3), twin]
    server.arm.graph.inventory = lambda: rows
    report = run(server, store, Clock())
    assert report.finished_pass and report.vms_written == 1 and report.unusable == 2
    assert store.get(vm_id(1)) is not None and store.get(vm_id(3)) is None


def test_the_sync_merges_facts_and_never_touches_a_vms_keys(server, store):
    rows = [standalone(1)]
    server.arm.graph.inventory = lambda: rows
    clock = Clock()
    run(server, store, clock)
    key = CallbackKey.generate()
    store.remember_key(vm_id(1), key)
    rows[0] = standalone(1, nic=3)  # the VM's address changed in Azure
    run(server, store, clock, every=timedelta(0))
    identity = store.get(vm_id(1))
    assert identity.facts.address.startswith("10.3.") and identity.keys == (key,)


def test_the_quota_is_respected_and_a_pass_resumes_where_its_budget_ended(server, store):
    rows = [standalone(i) for i in range(95)]
    server.arm.graph.inventory = lambda: rows
    server.arm.graph.quota = 3  # 3 queries a 5-second window
    clock = Clock()
    server.arm.graph.clock = clock
    first = run(server, store, clock, budget=12.0, page_rows=10)
    assert not first.finished_pass and first.pages >= 6
    assert first.quota_waits >= 1 and all(0 < s <= 5 for s in clock.slept)
    cursor = load_cursor(store.table)
    assert cursor.skip_token and cursor.pass_started == T0
    clock.now += 300  # the next timer run
    second = run(server, store, clock, page_rows=10)
    assert second.finished_pass
    assert first.pages + second.pages == 11  # 10 pages of resources, 1 of computeresources
    assert first.vms_written + second.vms_written == 95
    throttled = [c for c in server.arm.calls if c.status == 429]
    assert throttled == []  # it waited for the window; it never ran into a 429
    assert all(store.get(vm_id(i)) is not None for i in range(95))


def test_a_vm_cut_in_two_by_a_page_keeps_its_primary_nic(server, store):
    rows = [standalone(i) for i in range(4)]
    rows.insert(3, standalone(2, nic=5, primary=False))  # vm2's second NIC: page 2
    server.arm.graph.inventory = lambda: rows
    report = run(server, store, Clock(), page_rows=3)
    assert report.finished_pass and report.vms_written == 4
    assert store.get(vm_id(2)).facts.address == "10.0.0.6"  # the primary NIC's, not 10.5.x


def test_a_pass_is_not_started_before_it_is_due(server, store):
    server.arm.graph.inventory = lambda: [standalone(1)]
    clock = Clock()
    assert run(server, store, clock).finished_pass
    again = run(server, store, clock)
    assert not again.due and again.queries == 0 and again.table_requests == 1


def test_an_expired_skip_token_restarts_the_table_instead_of_failing(server, store):
    server.arm.graph.inventory = lambda: [standalone(i) for i in range(5)]
    save_cursor(store.table, Cursor(skip_token="expired", pass_started=T0))
    report = run(server, store, Clock())
    assert report.finished_pass and report.vms_written == 5


class Recorder:
    def __init__(self) -> None:
        self.notes: list[Notification] = []

    def publish(self, note: Notification) -> None:
        self.notes.append(note)


def test_a_refused_query_stops_the_sync_and_is_announced_once_then_resolved(
    server, store, monkeypatch
):
    server.arm.graph.inventory = lambda: [standalone(i) for i in range(5)]
    monkeypatch.setattr(sync, "vm_query", lambda table, vm_id=None: OLD_FACTS_QUERY)
    clock = Clock()
    errors = []
    for _ in range(2):
        with pytest.raises(ResourceGraphRefused) as info:
            run(server, store, clock)
        errors.append(info.value)
    assert load_cursor(store.table).pass_started == T0  # kept for the next run
    assert errors[0].status == 400 and "CrossTableUnionNotSupported" in errors[0].message
    events, published = store.table, Recorder()  # any table serves the state row here
    assert graph_state.note_refused(events, published, errors[0], T0)
    assert not graph_state.note_refused(events, published, errors[1], T0)  # same error
    assert graph_state.graph_state(events)["code"] == "BadRequest"
    warning = graph_warning(graph_state.graph_state(events))
    assert "REFUSES" in warning and "CrossTableUnionNotSupported" in warning
    (note,) = published.notes
    assert note.transition is Transition.CONFIG_INVALID and note.page
    assert "CrossTableUnionNotSupported" in note.detail
    monkeypatch.undo()
    assert run(server, store, clock, every=timedelta(0)).finished_pass
    assert graph_state.note_answered(events, published, T0)
    assert [n.transition for n in published.notes][-1] is Transition.CONFIG_VALID
    assert graph_state.graph_state(events) is None
    assert graph_warning(None) == ""
    assert not graph_state.note_answered(events, published, T0)


def test_admission_keeps_a_known_vm_and_waits_for_an_unknown_one_on_a_refusal(store):
    class Refusing:
        def resolve(self, vm_id: str) -> Any:
            raise ResourceGraphRefused(403, "AuthorizationFailed", "no Reader on the scope")

    known = Identity(facts=_facts(vm_id(7)))
    store.save(known)
    cache = CachedResolver(
        store, Refusing(), max_age_seconds=60, clock=lambda: T0 + timedelta(hours=1)
    )
    key = CallbackKey.generate()
    assert cache.enroll(vm_id(7), key).facts.name == "vm7"  # stale facts still serve
    with pytest.raises(ResourceGraphRefused):
        cache.enroll(vm_id(8), key)


def _facts(v: str) -> Any:
    from functions.identity.facts import VmFacts

    return VmFacts(
        vm_id=v,
        name="vm7",
        resource_id=f"{BASE}/Microsoft.Compute/virtualMachines/vm7",
        subscription_id=SUB,
        resource_group="rg",
        address="10.0.0.7",
        fetched_at=T0,
    )


def test_a_transaction_whose_connection_dropped_is_sent_again(server, store):
    from azure.core.exceptions import ServiceResponseError

    server.arm.graph.inventory = lambda: [standalone(i) for i in range(3)]

    class Flaky:
        """The identities table, whose first transaction loses its connection."""

        def __init__(self, table: Any) -> None:
            self.table, self.dropped = table, 0

        def submit_transaction(self, operations: Any) -> Any:
            if not self.dropped:
                self.dropped += 1
                raise ServiceResponseError("Connection aborted.")
            return self.table.submit_transaction(operations)

        def __getattr__(self, name: str) -> Any:
            return getattr(self.table, name)

    flaky = Flaky(store.table)
    report = sync_identities(
        resolver(server).graph,
        flaky,
        lambda: T0,
        every=timedelta(hours=3),
        budget_seconds=60,
    )
    assert flaky.dropped == 1 and report.finished_pass and report.vms_written == 3
    assert all(store.get(vm_id(i)) is not None for i in range(3))
