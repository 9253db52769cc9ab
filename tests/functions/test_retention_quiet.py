"""Retention asks storage only when something can have expired (functions.pipeline.
watchdog._retention): once a pass finds nothing at a cutoff day, the sweeps until that
cutoff moves on make none of its two range queries, and a pass that found something is
followed by another at the next sweep (a backlog drains a bounded share a minute).

Counted on the wire (tests.tablecount): on 1551d95 every sweep made both queries, 13
requests a quiet sweep instead of 11, whatever the day."""

from __future__ import annotations

from datetime import timedelta

from functions.pipeline.watchdog import run_watchdog
from functions.store.events import ended_partition
from functions.store.keys import row_key
from functions.store.state import Store
from tests.functions.conftest import Handed, make_pipeline
from tests.tablecount import TableCounter


def _retention_queries(counter: TableCounter, store: Store) -> int:
    """Queries of the rejected table: only retention asks it (its other query, of the
    events table's ended index, is counted with the sweep's other events queries)."""
    counts = counter.counts()
    return counts.get(("query", f"{store.prefix}rejected"), 0)


def test_a_quiet_day_asks_once_and_the_next_day_asks_again(azurite, clock):
    seeded = Store.from_connection_string(azurite, "rq" + row_key("a")[:8]).ensure_tables()
    with TableCounter(azurite) as counter:
        store = Store.from_connection_string(counter.connection_string, seeded.prefix)
        pipeline, _ = make_pipeline(store, clock, retention_days=30)
        pipeline.work_queue = Handed()

        counter.reset()
        run_watchdog(pipeline)  # the host's first pass: asks
        first = counter.total()
        assert _retention_queries(counter, store) == 1

        clock.advance(60)
        counter.reset()
        run_watchdog(pipeline)  # same cutoff day, nothing found before: asks nothing
        assert _retention_queries(counter, store) == 0
        assert counter.total() == first - 2, counter.counts()

        # An event closed late, under a day already past the cutoff (a reconcile that ran
        # long after the end): found once the cutoff moves to the next day, not before.
        old_day = (clock.now() - timedelta(days=40)).strftime("%Y-%m-%d")
        store.events.upsert_entity(
            {
                "PartitionKey": ended_partition(old_day),
                "RowKey": row_key("EV-LATE"),
                "EventId": "EV-LATE",
            }
        )
        clock.advance(60)
        assert run_watchdog(pipeline).expired == []
        midnight = (clock.now() + timedelta(days=1)).replace(hour=0, minute=0, second=1)
        clock.advance((midnight - clock.now()).total_seconds())
        counter.reset()
        assert run_watchdog(pipeline).expired == ["EV-LATE"]
        assert _retention_queries(counter, store) == 1

        # It found something: the next sweep asks again (and finds it all gone).
        clock.advance(60)
        counter.reset()
        assert run_watchdog(pipeline).expired == []
        assert _retention_queries(counter, store) == 1


def test_a_new_host_asks_at_its_first_sweep(azurite, clock):
    """The memory is the host's (its Store): a fresh host (a restart, a scale-out) asks at
    its first sweep, whatever another host found."""
    store = Store.from_connection_string(azurite, "rq" + row_key("b")[:8]).ensure_tables()
    old_day = (clock.now() - timedelta(days=40)).strftime("%Y-%m-%d")
    pipeline, _ = make_pipeline(store, clock, retention_days=30)
    pipeline.work_queue = Handed()
    assert run_watchdog(pipeline).expired == []
    store.events.upsert_entity(
        {"PartitionKey": ended_partition(old_day), "RowKey": row_key("EV-X"), "EventId": "EV-X"}
    )
    again = Store.from_connection_string(azurite, store.prefix)
    fresh, _ = make_pipeline(again, clock, retention_days=30)
    fresh.work_queue = Handed()
    assert run_watchdog(fresh).expired == ["EV-X"]
