"""How many times one document writes its event row (issue 31: at most twice in the
common path, `event_row_writes_per_doc`).

Counted at the Store, on the conditional writes of event rows that landed (an insert or
an ETag replace), per document, over the common paths: a new event approved through its
VM's relay; a Freeze three VMs of an availability set report (the first decides, the
others add their reporter rows); the document saying Started; the document that no longer
lists it (the end). Used by `make bench` and by tests/functions/test_row_writes.py.
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from functions.model.policy import Policy, Rule
from functions.pipeline.ingest import ingest_message
from functions.store.events import EVENT_ROW
from functions.store.state import Store


def count_event_writes(store: Store) -> Counter[str]:
    """Patch `store` so each landed write of an event row is counted by its partition."""
    writes: Counter[str] = Counter()
    insert, replace = store._insert, store._replace

    def counted_insert(table: Any, pk: str, rk: str, record: Any, extra: dict) -> bool:
        done = insert(table, pk, rk, record, extra)
        if done and table is store.events and rk == EVENT_ROW:
            writes[pk] += 1
        return done

    def counted_replace(table: Any, pk: str, rk: str, record: Any, extra: dict) -> None:
        replace(table, pk, rk, record, extra)
        if table is store.events and rk == EVENT_ROW:
            writes[pk] += 1

    store._insert = counted_insert  # type: ignore[method-assign]
    store._replace = counted_replace  # type: ignore[method-assign]
    return writes


def measure(connection: str) -> dict[str, Any]:
    """Writes of one event row per document on the common paths: the max and the mean."""
    from tests.functions.conftest import FakeClock, Relay, envelope, event, make_pipeline

    store = Store.from_connection_string(connection, "w" + uuid.uuid4().hex[:10]).ensure_tables()
    writes = count_event_writes(store)
    clock = FakeClock()
    relay = Relay()
    per_doc: list[int] = []
    try:
        pipeline, _ = make_pipeline(
            store, clock, Policy(rules=(Rule(name="all", action="approve"),))
        )

        def doc(send: Callable[[], object]) -> None:
            writes.clear()
            send()
            per_doc.append(max(writes.values(), default=0))

        one = {"callback_url": relay.url}
        reboot = event("EV-W1", source="User", resources=("w1",))
        doc(lambda: ingest_message(envelope("w1", 1, [reboot], **one), pipeline))
        started = event("EV-W1", status="Started", resources=("w1",), not_before=None)
        clock.advance(60)
        doc(lambda: ingest_message(envelope("w1", 2, [started], **one), pipeline))
        clock.advance(60)
        doc(lambda: ingest_message(envelope("w1", 3, [], **one), pipeline))
        freeze = event(
            "EV-W2", "Freeze", resources=("a1", "a2", "a3"), duration=5, source="Platform"
        )
        for seq, name in enumerate(("a1", "a2", "a3"), start=1):
            body = envelope(name, seq, [freeze], availability_set="as1", callback_url=relay.url)
            doc(lambda body=body: ingest_message(body, pipeline))
        clock.advance(timedelta(minutes=1).total_seconds())
        for seq, name in enumerate(("a1", "a2", "a3"), start=4):
            body = envelope(name, seq, [], availability_set="as1", callback_url=relay.url)
            doc(lambda body=body: ingest_message(body, pipeline))
    finally:
        relay.close()
    return {
        "event_row_writes_per_doc": max(per_doc),
        "event_row_writes_per_doc_mean": round(sum(per_doc) / len(per_doc), 2),
        "event_row_writes_per_doc_each": per_doc,
    }
