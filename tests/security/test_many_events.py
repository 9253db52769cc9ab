"""One document with many new events costs one unit of work per event, not one approval
budget after another (issue 46, "one document costs one approval budget per event").

On 2f59d6a ingest approved every event a document listed inline, one after another: with
a 3 s budget and a relay that never answers, 6 new events held the VM's message (and its
Service Bus session) 21.8 s; at the defaults 50 events take about 50 minutes, past
functionTimeout. Now ingest records them and hands their keys to the work queue, whose
workers reconcile each with its own budget, in parallel.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest

from functions.model.policy import Policy, Rule
from functions.pipeline.ingest import ingest_message
from local.host import LocalWorkQueue
from tests.functions.conftest import envelope, event, make_pipeline, store  # noqa: F401
from tests.security.test_slow_relay import Running

pytestmark = pytest.mark.azurite

BUDGET = 3  # seconds: one approval attempt's, which a relay that never answers takes whole
EVENTS = 6


@pytest.fixture
def silent_relay() -> Iterator[str]:
    """A relay callback that accepts the connection and never answers."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(32)
    held: list[socket.socket] = []
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                return
            held.append(conn)  # read nothing, answer nothing

    threading.Thread(target=serve, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.getsockname()[1]}"
    finally:
        stop.set()
        server.close()
        for conn in held:
            conn.close()


def test_a_document_with_many_new_events_hands_them_to_the_work_queue(store, silent_relay):  # noqa: F811
    running = Running()
    policy = Policy(rules=(Rule(name="all", action="approve"),), max_concurrent_per_set=100)
    pipeline, _ = make_pipeline(store, running, policy, approval_budget_seconds=BUDGET)
    work = LocalWorkQueue(pipeline, workers=16)
    pipeline.work_queue = work
    events = [event(f"EV-{i}", resources=("vm1",)) for i in range(EVENTS)]
    try:
        began = time.monotonic()
        result = ingest_message(envelope("vm1", 1, events, callback_url=silent_relay), pipeline)
        took = time.monotonic() - began
        assert result.outcome == "processed"
        # On 2f59d6a: EVENTS budgets one after another (21.8 s). Now the document waits
        # on no relay: its events are its work queue's items.
        assert took < BUDGET, f"the document took {took:.1f} s"
        deadline = time.monotonic() + 4 * BUDGET
        while not work.idle() and time.monotonic() < deadline:
            time.sleep(0.05)
        # Each item spent its own budget, in parallel: about one budget for all of them.
        assert work.idle() and time.monotonic() - began < 2.5 * BUDGET
        assert work.done == EVENTS
    finally:
        work.close()
    for i in range(EVENTS):
        record = store.get_event(f"EV-{i}")
        assert record.approval == "pending" and record.approval_attempts  # tried, retried later
