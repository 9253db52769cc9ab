"""The bench's measuring instruments: the counting proxy before Azurite, and the harness
that counts what a set of real relays forwards for one event."""

from __future__ import annotations

import uuid

import pytest
from azure.core import MatchConditions
from azure.core.exceptions import ResourceModifiedError
from azure.data.tables import TableServiceClient, UpdateMode

from tests.bench import set_relays
from tests.bench.wire import WireCounter
from tests.tablecount import TableCounter

pytestmark = pytest.mark.azurite


def test_proxy_counts_what_it_forwards(azurite: str) -> None:
    name = "tc" + uuid.uuid4().hex[:10]
    with WireCounter(azurite) as counter:
        via = TableServiceClient.from_connection_string(counter.connection_string)
        via.create_table(name)
        assert counter.total() == 0 and counter.total(exclude=()) == 1  # table calls apart
        counter.reset()
        table = via.get_table_client(name)
        table.create_entity({"PartitionKey": "p1", "RowKey": "a", "v": 1})
        got = table.get_entity("p1", "a")
        assert [e["v"] for e in table.query_entities("PartitionKey eq 'p1'")] == [1]
        table.update_entity(
            {"PartitionKey": "p1", "RowKey": "a", "v": 2},
            mode=UpdateMode.REPLACE,
            etag=got.metadata["etag"],
            match_condition=MatchConditions.IfNotModified,
        )
        with pytest.raises(ResourceModifiedError):  # refused by Azurite, still a request
            table.update_entity(
                {"PartitionKey": "p1", "RowKey": "a", "v": 3},
                mode=UpdateMode.REPLACE,
                etag=got.metadata["etag"],
                match_condition=MatchConditions.IfNotModified,
            )
        table.upsert_entity({"PartitionKey": "p2", "RowKey": "b", "v": 1})
        table.submit_transaction(
            [
                ("create", {"PartitionKey": "p3", "RowKey": "1"}),
                ("create", {"PartitionKey": "p3", "RowKey": "2"}),
                ("upsert", {"PartitionKey": "p3", "RowKey": "3"}),
            ]
        )
        table.delete_entity("p1", "a")

        assert counter.by_kind() == {
            "insert": 1, "get": 1, "query": 1, "update": 2, "upsert": 1, "batch": 1, "delete": 1
        }  # fmt: skip
        assert counter.total() == 8
        assert counter.by_table() == {name: 7, "$batch": 1}
        # What the scalability targets count: each entity of the batch, per partition.
        assert counter.entities() == 10
        assert counter.partitions() == {(name, "p1"): 6, (name, "p2"): 1, (name, "p3"): 3}
        assert counter.hottest_partition_share() == pytest.approx(6 / 10)
        written, writes = counter.bytes_written(name)
        assert writes == 7 and written > 0  # insert, 2 updates, upsert, 3 in the batch
        size, rows = counter.stored(name)  # p1/a was deleted; the others remain
        assert rows == 4 and 0 < size < written

    # It forwarded: Azurite itself holds exactly the rows written through the proxy.
    direct = TableServiceClient.from_connection_string(azurite).get_table_client(name)
    rows = {(e["PartitionKey"], e["RowKey"]) for e in direct.list_entities()}
    assert rows == {("p2", "b"), ("p3", "1"), ("p3", "2"), ("p3", "3")}


def test_a_second_counter_counts_only_its_own_traffic(azurite: str) -> None:
    name = "tc" + uuid.uuid4().hex[:10]
    TableServiceClient.from_connection_string(azurite).create_table(name)
    with TableCounter(azurite) as one, TableCounter(azurite) as two:
        TableServiceClient.from_connection_string(one.connection_string).get_table_client(
            name
        ).upsert_entity({"PartitionKey": "p", "RowKey": "r"})
        assert (one.total(), two.total()) == (1, 0)


@pytest.mark.slow
def test_documents_per_event_on_a_three_vm_set() -> None:
    """Three real relays over the simulator; one event naming the first VM goes Scheduled,
    Started, gone. The named VM forwards exactly those three documents; a set-mate forwards
    all three (whole documents) or none (its own events only), never part of them."""
    result = set_relays.run(3)
    assert set(result.per_vm) == {"set-vm-00", "set-vm-01", "set-vm-02"}
    assert result.named == "set-vm-00"
    assert result.per_vm[result.named] == 3
    assert result.contents[result.named] == [["Scheduled"], ["Started"], []]
    for vm, forwarded in result.per_vm.items():
        assert forwarded in (0, 3), vm
        assert result.contents[vm] == ([["Scheduled"], ["Started"], []] if forwarded else [])
    assert result.total == sum(result.per_vm.values())
    assert result.per_setmate == (result.total - 3) / 2


def test_relays_heartbeat_with_one_table_request_each(azurite: str) -> None:
    """The bench's count for the model: real relays writing into the liveness table, counted on
    the wire; one Insert Or Merge per heartbeat and nothing else (no read, no retry)."""
    from tests.bench import relay_heartbeats

    result = relay_heartbeats.run(azurite, relays=2, seconds=3.0)
    assert result["relay_heartbeats_measured"] >= 4
    counts = result["_counts"]
    assert counts["table_requests_per_relay_heartbeat"] == 1.0
    assert (
        counts["table_entities_per_relay_heartbeat"] == counts["table_requests_per_relay_heartbeat"]
    )


def test_the_budget_wave_sees_a_wave_over_its_budget_and_one_held_to_it(azurite: str) -> None:
    """The bench's budget phase (tests/bench/budget_wave.py), small and quick: 10 VMs of
    one service, a budget of 20 % (2 out at once). Without the budget in the policy the
    instrument sees every VM out at once (8 over); with it, never more than 2, in rounds."""
    from tests.bench import budget_wave

    # Out 3 s each: long enough for all ten to be out at once on a busy machine (with
    # 0.3 s the first were back before the last was approved: 6 or 7 over, under load).
    loose = budget_wave.run(azurite, 10, enforced=False, impact=3.0)
    assert loose["budget_approved"] == 10 and loose["budget_peak_over_limit"] == 8, loose
    held = budget_wave.run(azurite, 10, impact=0.3)
    assert held["budget_approved"] == 10 and held["budget_limit"] == 2, held
    assert held["budget_peak_over_limit"] == 0 and held["budget_peak_rows"] == 2, held
    assert held["budget_unapproved"] == 0 and held["budget_slots_held_at_end"] == 0, held
    assert held["budget_wait_max_s"] >= 4 * 0.3, held  # the fifth round, after four impacts
