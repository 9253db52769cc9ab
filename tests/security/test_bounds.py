"""Bounds before cost (issue 27): a VM over a per-VM bound costs no Resource Graph query
and at most one Table write, whatever it sends.

The attacker's relay makes a new callback key for every message (its key file deleted
before each send, as a reinstall would): each new key would make the app ask Resource
Graph again. Heartbeats arrive faster than any relay sends them.
"""

from __future__ import annotations

from functions.pipeline.heartbeats import ingest_heartbeats
from relay.keystore import KeyStore
from tests.security.conftest import Fleet
from tests.tablecount import TableCounter


def resource_graph_queries(fleet: Fleet) -> int:
    return sum(1 for c in fleet.server.arm.calls if "resourcegraph" in c.path.casefold())


def fresh_key(fleet: Fleet, name: str) -> None:
    vm = fleet.vms[name]
    vm.keys.path.unlink()
    vm.keys = KeyStore(vm.state)  # a new 32-byte key, as after a reinstall
    vm.sender.keys = vm.keys


def test_a_new_key_every_message_costs_resource_graph_only_up_to_the_bound(fleet: Fleet):
    bound = fleet.pipeline.settings.max_new_keys_per_vm_day
    fleet.deliver(fleet.vms["attacker"].message([]))
    before = resource_graph_queries(fleet)
    outcomes = []
    for _ in range(bound + 5):
        fresh_key(fleet, "attacker")
        outcomes.append(fleet.deliver(fleet.vms["attacker"].message([])))
    assert resource_graph_queries(fleet) - before <= bound, fleet.server.arm.calls
    rejected = [r for r in outcomes if r.outcome == "rejected"]
    assert len(rejected) == 5 and all("MAX_NEW_KEYS_PER_VM_DAY" in r.reason for r in rejected)
    # Legitimate: the victim's first key, the same day, is enrolled.
    assert fleet.deliver(fleet.vms["victim"].message([])).outcome == "processed"


def test_a_message_over_a_bound_costs_at_most_one_table_write(fleet: Fleet, azurite: str):
    from functions.pipeline.ingest import ingest_message
    from functions.store.state import Store

    fleet.pipeline.settings = fleet.pipeline.settings.model_copy(
        update={"max_messages_per_vm_hour": 10}
    )
    attacker = fleet.vms["attacker"]
    for _ in range(10):
        assert fleet.deliver(attacker.message([])).outcome == "processed"
    bound = fleet.pipeline.settings.max_new_keys_per_vm_day
    for _ in range(bound):
        fresh_key(fleet, "attacker")
        fleet.deliver(attacker.message([]))
    over = [attacker.message([])]
    fresh_key(fleet, "attacker")
    over.append(attacker.message([]))  # over both bounds: messages and new keys
    with TableCounter(azurite) as counter:
        counted = Store.from_connection_string(counter.connection_string, fleet.store.prefix)
        store, fleet.pipeline.store = fleet.pipeline.store, counted
        try:
            for body in over:
                counter.reset()
                queries = resource_graph_queries(fleet)
                result = ingest_message(body, fleet.pipeline, message_id="over")
                writes = sum(
                    n
                    for (kind, _), n in counter.counts().items()
                    if kind in ("insert", "upsert", "update", "batch", "delete")
                )
                assert result.outcome == "rejected", result
                assert writes <= 1, counter.counts()
                assert resource_graph_queries(fleet) == queries
        finally:
            fleet.pipeline.store = store


def test_heartbeats_are_bounded_per_vm(fleet: Fleet):
    """A flood of heartbeats from one VM, batch after batch, is one liveness write a
    minute; the victim's heartbeat in the same batches is written."""
    attacker, victim = fleet.vms["attacker"], fleet.vms["victim"]
    for vm in (attacker, victim):
        fleet.deliver(vm.message([]))
    writes = 0
    for batch in range(5):
        bodies = [attacker.message(kind="heartbeat") for _ in range(20)]
        if batch == 0:
            bodies.append(victim.message(kind="heartbeat"))
        result = ingest_heartbeats(bodies, fleet.pipeline)
        writes += result.requests
        assert result.rejected == 0
    assert writes <= 2, writes  # the attacker's first (and the victim's, same batch)
    assert fleet.store.get_vm("victim").last_seen is not None
