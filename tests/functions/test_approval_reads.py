"""What one approval reads (issue 47, the wave's cost): the event's reporter rows once.

The approver reads them for each VM's own view; the `approved` announcement names the VMs
that reported the event, from those same rows, not from a second query of the partition
(on 2f59d6a publishing reloaded them for the card: 9.15 Table requests per event in the
bench's wave, one of them this query)."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

from azure.data.tables import UpdateMode

from functions.model.policy import Policy, Rule, Window
from functions.pipeline.ingest import ingest_message
from functions.pipeline.reconcile import reconcile_key
from functions.store.state import Store
from tests.functions.conftest import T0, envelope, event, make_pipeline
from tests.tablecount import TableCounter


def _counted(counter: TableCounter, clock: Any) -> tuple[Store, Any]:
    """A store of fresh tables behind the counting proxy, and a pipeline whose policy
    holds every event for a window that opens a minute later (as in the bench's wave)."""
    store = Store.from_connection_string(counter.connection_string, "t" + uuid.uuid4().hex[:12])
    policy = Policy(
        rules=(Rule(name="all", action="approve"),),
        windows=(Window(days=("Sat",), start="10:01", end="23:00"),),
        timezone="UTC",
    )
    pipeline, _ = make_pipeline(store.ensure_tables(), clock, policy)
    return store, pipeline


def count_reporter_queries(store: Any) -> list[str]:
    """Every query of an event's reporter rows from now on (their RowKey range)."""
    seen: list[str] = []
    query = store.events.query_entities

    def counted(query_filter: str, *args: Any, **kwargs: Any) -> Any:
        if "RowKey gt @lo" in query_filter:
            seen.append(query_filter)
        return query(query_filter, *args, **kwargs)

    store.events.query_entities = counted
    return seen


def test_an_approval_reads_the_reporter_rows_once_and_its_card_names_the_reporters(
    store, clock, relay
):
    # Held for a window that opens a minute later (as in the bench's wave), then approved
    # by the sweep's unit of work: reconcile_key.
    policy = Policy(
        rules=(Rule(name="all", action="approve"),),
        windows=(Window(days=("Sat",), start="10:01", end="23:00"),),
        timezone="UTC",
    )
    pipeline, publisher = make_pipeline(store, clock, policy)
    names = ("vm-a", "vm-b")
    ev = event("EV-R", "Redeploy", resources=names, not_before=T0 + timedelta(hours=2))
    for name in names:
        body = envelope(name, 1, [ev], callback_url=relay.url, availability_set="as-r")
        assert ingest_message(body, pipeline).outcome == "processed"
    assert relay.requests == []
    clock.advance(61)
    queries = count_reporter_queries(store)
    result = reconcile_key(pipeline, "EV-R", me="test")
    assert result.approval is not None and result.approval.outcome == "approved"
    assert len(queries) == 1, queries
    (card,) = [n for n in publisher.published if n.transition.value == "approved"]
    assert card.event is not None and card.event.reported_by == names


def test_the_sweeps_approval_reads_the_event_and_its_reporters_in_one_query(azurite, clock, relay):
    """The sweep's unit of work reads the event row and its reporter rows in one partition
    query (no point read of the row before it), and writes the outcome with its audit row in
    one transaction of the event's partition, and finds the relay of a VM whose own
    reporter row is fresh from that row's attested vmId, reading no VM row: 5 Table
    requests for one relay approval (read, claim, identity, outcome with its audit row,
    open index); 8 with the row read on its own, 7 with the audit row in a table of its
    own, 6 with the VM row read."""
    with TableCounter(azurite) as counter:
        store, pipeline = _counted(counter, clock)
        ev = event("EV-Q", "Redeploy", resources=("vm-q",), not_before=T0 + timedelta(hours=2))
        body = envelope("vm-q", 1, [ev], callback_url=relay.url)
        assert ingest_message(body, pipeline).outcome == "processed"
        clock.advance(61)
        # A worker of its own, as the sweep's: it remembers no row of the event.
        worker = Store.from_connection_string(counter.connection_string, store.prefix)
        pipeline.store = worker
        counter.reset()
        result = reconcile_key(pipeline, "EV-Q", me="work:1")
        assert result.approval is not None and result.approval.outcome == "approved"
        counts = counter.counts()
    events = worker.events.table_name
    assert ("get", events) not in counts, counts
    assert counts[("query", events)] == 1, counts
    assert not [key for key in counts if key[1].endswith("vms")], counts
    assert counter.total() == 5, counts
    assert counts[("batch", "")] == 1, counts
    assert not [key for key in counts if key[1].endswith("audit")], counts
    outcomes = [r["outcome"] for r in worker.audit_rows("EV-Q") if r["action"] == "approve"]
    assert outcomes.count("approved via relay:vm-q") == 1, outcomes


def test_a_stale_or_unattested_reporter_row_is_found_through_its_vm_row(azurite, clock, relay):
    """The reporter row stands in for the VM row only while it is fresh and names its
    attested vmId: a row older than RELAY_SILENT_AFTER_SECONDS (its relay may have gone
    quiet since) or one written before reporter rows kept the vmId goes through the VM row
    and the liveness hint, as before, and is still approved."""
    from functions.store.reporters import REPORTER, VM_ID

    with TableCounter(azurite) as counter:
        store, pipeline = _counted(counter, clock)
        for event_id, vm in (("EV-OLD", "vm-old"), ("EV-NOID", "vm-noid")):
            ev = event(event_id, "Redeploy", resources=(vm,), not_before=T0 + timedelta(hours=2))
            body = envelope(vm, 1, [ev], callback_url=relay.url)
            assert ingest_message(body, pipeline).outcome == "processed"
        # vm-noid's row as a release before this one wrote it: no vmId.
        row = store.events.get_entity("ev-noid", REPORTER + "vm-noid")
        row.pop(VM_ID)
        store.events.upsert_entity(row, mode=UpdateMode.REPLACE)
        clock.advance(61)
        counter.reset()
        assert reconcile_key(pipeline, "EV-NOID", me="w").approval.outcome == "approved"
        assert ("get", store.vms.table_name) in counter.counts(), counter.counts()
        # vm-old heard 61 s ago by its document, then quiet past the silence threshold:
        # its VM row (and the liveness table) decide, and both say silent.
        clock.advance(pipeline.settings.relay_silent_after_seconds)
        counter.reset()
        result = reconcile_key(pipeline, "EV-OLD", me="w")
        assert result.approval is None or result.approval.outcome != "approved", result
        assert ("get", store.vms.table_name) in counter.counts(), counter.counts()
