"""Issue 46: one VM's made-up events get a bounded share of the reconcile workers.

Root on one enrolled VM: its relay reports 48 made-up Freezes and then never answers
/v1/start (it accepts the connection and says nothing). On 2f59d6a each of the 48 work
items held a worker for the attempt's whole budget, 16 at once, ahead of 12 honest events:
honest approvals waited for three rounds of budgets (13.7 s instead of 1.7 s at a 4 s
budget; here 30 s at a 10 s one). Now each host keeps one lane per VM (functions.pipeline.
lanes): one exchange with that VM's relay at a time and one approval waiting for it, the
others not asked (retry later), most before anything is claimed; so the 12 honest events
are approved while the liar's first exchange still waits, and the liar never has more
than one exchange open. Checked by conditions (what the relays saw, and in which order),
not by timing.

Also: a document with many events from a VM whose relay never answers costs one
exchange's budget, not one per event.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from datetime import timedelta

import pytest

from functions.model.policy import Policy, Rule, Window
from functions.pipeline.ingest import ingest_message
from functions.pipeline.watchdog import run_watchdog
from local.host import LocalWorkQueue
from tests.functions.conftest import (  # noqa: F401  (fixtures)
    T0,
    envelope,
    event,
    make_pipeline,
    new_relay,
    relay,
    store,
    write_liveness,
)
from tests.security.test_slow_relay import Running

pytestmark = pytest.mark.azurite

MADE_UP = 48
HONEST = 12
BUDGET = 10  # seconds: one approval attempt's, which a silent relay takes whole


class Silent:
    """A relay that accepts every connection and never answers: counts them, and how many
    were open at once, and when the first one ended."""

    def __init__(self) -> None:
        self.server = socket.socket()
        self.server.bind(("127.0.0.1", 0))
        self.server.listen(64)
        self.url = f"http://127.0.0.1:{self.server.getsockname()[1]}"
        self.lock = threading.Lock()
        self.opened = self.open = self.most = 0
        self.first_closed = threading.Event()
        self.stop = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            with self.lock:
                self.opened += 1
                self.open += 1
                self.most = max(self.most, self.open)
            threading.Thread(target=self._hold, args=(conn,), daemon=True).start()

    def _hold(self, conn: socket.socket) -> None:
        try:
            while conn.recv(65536):  # until the app gives up and closes
                pass
        except OSError:
            pass
        finally:
            conn.close()
            with self.lock:
                self.open -= 1
            self.first_closed.set()

    def close(self) -> None:
        self.stop.set()
        self.server.close()


@pytest.fixture
def silent() -> Iterator[Silent]:
    quiet = Silent()
    try:
        yield quiet
    finally:
        quiet.close()


def _held_by_a_window(store, running):  # noqa: F811
    policy = Policy(
        rules=(Rule(name="all", action="approve"),),
        windows=(Window(days=("Sat",), start="11:00", end="23:00"),),  # T0: Sat 10:00 UTC
        timezone="UTC",
        max_concurrent_per_set=1000,
    )
    return make_pipeline(store, running, policy, approval_budget_seconds=BUDGET)[0]


def test_made_up_events_of_one_silent_relay_hold_one_worker_not_all(store, relay, silent):  # noqa: F811
    running = Running()
    pipeline = _held_by_a_window(store, running)
    near = T0 + timedelta(hours=1, minutes=10)
    made_up = [
        event(f"AAA-{i:02d}", "Freeze", resources=("liar",), not_before=near)
        for i in range(MADE_UP)
    ]
    ingest_message(envelope("liar", 1, made_up, callback_url=silent.url), pipeline)
    names = [f"vm{i:02d}" for i in range(HONEST)]
    for name in names:
        ev = event(f"ZZ-{name}", resources=(name,), not_before=T0 + timedelta(hours=3))
        ingest_message(envelope(name, 1, [ev], callback_url=relay.url), pipeline)
    assert relay.requests == [] and silent.opened == 0  # every one waits for the window
    running.advance(3600)  # the window opens; every relay heartbeats
    for name in (*names, "liar"):
        write_liveness(store, name, running.now())
    work = LocalWorkQueue(pipeline, workers=16)
    pipeline.work_queue = work
    try:
        run_watchdog(pipeline)  # the made-up events sort first: their items come first
        while len(relay.starts()) < HONEST and not silent.first_closed.is_set():
            time.sleep(0.02)
        # Every honest event approved while the liar's first exchange still waits.
        assert sorted(relay.starts()) == sorted(f"ZZ-{n}" for n in names), (
            f"{len(relay.starts())} of {HONEST} honest approvals before the liar's first "
            f"exchange ended ({silent.opened} exchanges with it, {silent.most} at once)"
        )
        assert not silent.first_closed.is_set()
        assert silent.most == 1, f"{silent.most} workers held by one VM's relay at once"
        deadline = time.monotonic() + 3 * BUDGET
        while not work.idle() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert work.idle()
    finally:
        work.close()
    # The made-up events are still pending, asked again later (one exchange at a time);
    # all but the first were not asked: most before anything was claimed or written.
    assert all(store.get_event(f"AAA-{i:02d}").approval == "pending" for i in range(MADE_UP))
    assert pipeline.relay_lanes.not_asked >= MADE_UP - 1
    assert silent.opened == 1


def test_a_document_of_many_events_costs_one_silent_exchange_not_one_each(store, silent):  # noqa: F811
    """Ingest approves what is due at once, in the document's processing: a document of 6
    events from a VM whose relay never answers spent 6 budgets one after another."""
    running = Running()
    policy = Policy(rules=(Rule(name="all", action="approve"),), max_concurrent_per_set=100)
    pipeline, _ = make_pipeline(store, running, policy, approval_budget_seconds=3)
    write_liveness(store, "liar", running.now())
    made_up = [event(f"DOC-{i}", "Freeze", resources=("liar",)) for i in range(6)]
    ingest_message(envelope("liar", 1, made_up, callback_url=silent.url), pipeline)
    assert silent.opened == 1, f"{silent.opened} exchanges with a relay that never answers"
    rows = [store.get_event(f"DOC-{i}") for i in range(6)]
    assert all(r.approval == "pending" for r in rows)
    assert (
        sum(any(a.outcome.startswith("not asked") for a in r.approval_attempts) for r in rows) == 5
    )
