"""Disruption budgets' facts from Azure (issue 39): the identity sync reads each VM's tags and
zone from Resource Graph (the simulator's, over HTTP, with its documented limits) and
writes where Azure places each VM by name, and each budget group's size, into the
identities table on Azurite. Nothing a VM sends reaches these rows."""

from __future__ import annotations

import ast
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import requests
from azure.data.tables import TableServiceClient

from functions.identity import sync
from functions.identity.facts import ResourceGraphResolver
from functions.identity.registry import IdentityStore
from functions.identity.sync import load_cursor, sync_identities
from functions.model.budgets import Budget, Placement, slots_for
from functions.model.envelope import ScheduledEvent
from functions.store.placements import Placements
from simulator import Simulator, SimulatorServer, instance
from simulator.arm import simulated_vm_id
from tests.identity.test_facts import SimulatorCredential
from tests.identity.test_sync import Clock

pytestmark = pytest.mark.azurite

APP = b"S" * 40
T0 = datetime(2026, 11, 24, 10, 0, tzinfo=UTC)
ROOT = Path(__file__).resolve().parents[2]
CHECKOUT = Budget(
    name="checkout-web",
    group_by=("tag:service",),
    match={"tags": {"service": "checkout"}},
    max_unavailable=1,
)
PER_ZONE = Budget(name="per-zone", group_by=("tag:service", "zone"), max_unavailable="50%")


def fleet(sim: Simulator) -> None:
    """One service over three scale sets in two zones and two single VMs, another service,
    and a VM with neither tags nor zone."""
    checkout = {"service": "checkout", "tier": "web"}
    sim.add_scale_set("checkout-a", 3, zone="1", tags=checkout)
    sim.add_scale_set("checkout-b", 2, zone="2", tags=checkout)
    sim.add_scale_set("checkout-c", 1, zone="1", tags=checkout)
    sim.add_vm("checkout-1", zone="1", tags=checkout)
    sim.add_vm("checkout-2", zone="3", tags={**checkout, "owner": "team-a"})
    sim.add_scale_set("search", 2, zone="1", tags={"service": "search"})
    sim.add_vm("legacy")


@pytest.fixture
def server() -> Iterator[SimulatorServer]:
    sim = Simulator(time_scale=60.0)
    fleet(sim)
    server = SimulatorServer(sim).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def store(azurite: str) -> IdentityStore:
    service = TableServiceClient.from_connection_string(azurite)
    prefix = "b" + uuid.uuid4().hex[:12]
    return IdentityStore.from_service(service, APP, prefix=prefix).ensure_table()


def run(
    server,
    store,
    *,
    budgets=(CHECKOUT, PER_ZONE),
    at=T0,
    page_rows=1000,
    seconds=600.0,
    clock: Clock | None = None,
):
    graph = ResourceGraphResolver(
        requests.Session(), SimulatorCredential(server), server.arm_url
    ).graph
    clock = clock or Clock()
    return sync_identities(
        graph,
        store.table,
        lambda: at,
        every=timedelta(hours=3),
        budget_seconds=seconds,
        sleep=clock.sleep,
        monotonic=clock,
        page_rows=page_rows,
        budgets=tuple(budgets),
    )


EXPECTED = {
    "checkout-web": {"tag:service=checkout": 8},
    "per-zone": {
        "tag:service=checkout|zone=eastus-1@00000000": 5,
        "tag:service=checkout|zone=eastus-2@00000000": 2,
        "tag:service=checkout|zone=eastus-3@00000000": 1,
        "tag:service=search|zone=eastus-1@00000000": 2,
    },
}


def sizes(store: IdentityStore) -> dict[str, dict[str, int]]:
    placements = Placements(store.table)
    found = {name: placements.sizes(name) for name in ("checkout-web", "per-zone")}
    return {name: groups for name, groups in found.items() if groups}


def test_a_pass_places_every_vm_by_name_and_sizes_each_group(server, store):
    report = run(server, store)
    assert report.finished_pass and report.placements_written == 11
    assert report.groups_sized == 5 and report.groups_dropped == 0
    assert sizes(store) == EXPECTED
    placements = Placements(store.table)
    (placed,) = placements.for_name("CHECKOUT-A_1")  # names as Azure compares them
    assert placed == Placement(
        name="checkout-a_1",
        vm_id=simulated_vm_id("checkout-a_1"),
        subscription=instance.SUBSCRIPTION_ID,
        resource_group=instance.RESOURCE_GROUP.lower(),
        zone="1",
        region="eastus",
        scale_set="checkout-a",
        availability_set=None,
        tags={"service": "checkout", "tier": "web"},
        fetched_at=T0,
    )
    (legacy,) = placements.for_name("legacy")
    assert legacy.zone is None and legacy.tags == {}
    assert placements.for_name("nobody") == []
    assert placements.size("per-zone", "tag:service=checkout|zone=eastus-1@00000000") == 5
    assert placements.size("per-zone", "tag:service=checkout|zone=eastus-9@00000000") is None
    # The interface the decider calls: a Reboot of checkout-a_1 needs these slots.
    reboot = ScheduledEvent(
        EventId="E",
        EventType="Reboot",
        EventStatus="Scheduled",
        Resources=["checkout-a_1"],
        NotBefore="Mon, 23 Nov 2026 10:00:00 GMT",
    )
    assert [tuple(s) for s in slots_for((CHECKOUT, PER_ZONE), reboot, placed, placements.size)] == [
        ("checkout-web", "tag:service=checkout", 1),
        ("per-zone", "tag:service=checkout|zone=eastus-1@00000000", 2),
    ]


def test_the_facts_rows_carry_tags_and_zone_too(server, store):
    run(server, store)
    identity = store.get(simulated_vm_id("checkout-2"))
    assert identity.facts.zone == "3"
    assert identity.facts.tags == {"service": "checkout", "tier": "web", "owner": "team-a"}


def test_without_budgets_the_pass_writes_no_placement(server, store):
    report = run(server, store, budgets=())
    assert report.finished_pass and report.placements_written == 0
    assert report.placements_swept is None  # nothing to keep up: not even a query
    assert Placements(store.table).for_name("checkout-1") == []


def short_runs(server) -> Clock:
    """One query per 5-second window: a 6-second run reads a page or two, then stops."""
    clock = Clock()
    server.arm.graph.quota, server.arm.graph.clock = 1, clock
    return clock


def test_counts_survive_a_pass_cut_over_several_runs(server, store):
    """The counts ride in the cursor row: a pass of many short runs counts as one does."""
    clock = short_runs(server)
    runs = 0
    while True:
        runs += 1
        clock.now += 300
        report = run(server, store, page_rows=2, seconds=6, clock=clock)
        if report.finished_pass:
            break
        cursor = load_cursor(store.table)
        assert cursor.tally and cursor.pass_started == T0
    assert runs >= 3
    assert sizes(store) == EXPECTED


def test_a_change_of_groups_mid_pass_starts_the_pass_again(server, store):
    clock = short_runs(server)
    assert not run(server, store, page_rows=2, seconds=6, clock=clock).finished_pass
    assert load_cursor(store.table).pass_started == T0
    later = T0 + timedelta(minutes=5)
    only = Budget(name="per-zone", group_by=("zone",), max_unavailable=1)
    report = None
    while report is None or not report.finished_pass:
        clock.now += 300
        report = run(server, store, budgets=(only,), at=later, page_rows=2, seconds=6, clock=clock)
    assert Placements(store.table).sizes("per-zone") == {
        "zone=eastus-1@00000000": 7,
        "zone=eastus-2@00000000": 2,
        "zone=eastus-3@00000000": 1,
    }
    assert Placements(store.table).sizes("checkout-web") == {}  # a budget gone: its sizes too


def test_a_change_of_groups_makes_a_pass_due_at_once(server, store):
    run(server, store)
    soon = T0 + timedelta(minutes=5)
    assert not run(server, store, at=soon).due  # same budgets: the next pass in 3 h
    limits_only = Budget(**{**PER_ZONE.model_dump(), "max_unavailable": 3})
    assert not run(server, store, budgets=(CHECKOUT, limits_only), at=soon).due  # no regroup
    wider = Budget(**{**CHECKOUT.model_dump(), "match": {"tags": {"tier": "web"}}})
    assert run(server, store, budgets=(wider, PER_ZONE), at=soon).finished_pass
    assert Placements(store.table).sizes("checkout-web") == {"tag:service=checkout": 8}


def test_what_azure_no_longer_lists_leaves_at_the_next_pass(server, store):
    run(server, store)
    server.sim._vms.pop("checkout-1")  # deleted in Azure
    server.sim.place("checkout-2", zone="2")  # moved (a redeployed zonal VM is a new one)
    later = T0 + timedelta(hours=3)
    report = run(server, store, at=later)
    assert report.finished_pass and report.placements_swept == 1
    placements = Placements(store.table)
    assert placements.for_name("checkout-1") == []
    assert placements.for_name("checkout-2")[0].zone == "2"
    assert placements.sizes("per-zone") == {
        "tag:service=checkout|zone=eastus-1@00000000": 4,
        "tag:service=checkout|zone=eastus-2@00000000": 3,
        "tag:service=search|zone=eastus-1@00000000": 2,
    }
    # Budgets removed: the next pass deletes their rows.
    gone = run(server, store, budgets=(), at=later + timedelta(hours=3))
    assert gone.finished_pass and gone.placements_swept == 10
    assert sizes(store) == {}


def test_a_stale_placement_is_not_read(server, store):
    run(server, store)
    placements = Placements(store.table)
    assert placements.for_name("checkout-1", T0 + timedelta(hours=5), timedelta(hours=6))
    assert not placements.for_name("checkout-1", T0 + timedelta(hours=7), timedelta(hours=6))


def test_names_azure_repeats_are_each_read(server, store):
    """Two VMs named alike in two resource groups: both placements come back."""
    run(server, store)
    twin = Placement(name="checkout-1", vm_id=str(uuid.uuid4()), zone="2", fetched_at=T0)
    Placements(store.table).put([twin])
    found = Placements(store.table).for_name("checkout-1")
    assert sorted(p.zone for p in found) == ["1", "2"]


def test_groups_past_the_bound_are_counted_as_dropped(server, store, monkeypatch):
    monkeypatch.setattr(sync, "MAX_GROUPS", 3)
    report = run(server, store)
    assert report.groups_sized == 3
    counted = sum(sum(groups.values()) for groups in sizes(store).values())
    assert counted + report.groups_dropped == 8 + 10  # each VM in each of its groups


def test_only_the_sync_writes_placements():
    """A VM can never move itself into or out of a group: placement and size rows are
    written from Resource Graph's rows by the identity sync, and by nothing else."""
    writers = set()
    for path in (ROOT / "functions").rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("put", "write_sizes", "sweep")
                and "placements" in ast.unparse(node.func.value).casefold()
            ):
                writers.add(path.relative_to(ROOT).as_posix())
    assert writers == {"functions/identity/sync.py"}
