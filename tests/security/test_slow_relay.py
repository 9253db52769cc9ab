"""Issue 37: what one VM's relay does costs only that VM's event.

Root on one enrolled VM is enough to try: it reports a made-up User event naming only
itself (its EventId sorts first, its NotBefore days out) and its relay answers /v1/start
one byte a second. On 2cd3d60 the sweep reconciled every open event in turn, inline, and
the callback's timeout bounded each socket read, not the answer: every sweep waited on that
event, and a long enough drip reached functionTimeout, after which no event after it was
ever swept again. Now the sweep only finds what is due and hands each event to the work
queue (here the local host's workers), and each exchange has a deadline for the whole of
it: honest events are approved at once, the sweep takes no time, the dripping relay costs
its own event one attempt's budget.

Also: a `Resources` list a VM made up costs a bounded number of reads, not one per name.
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
    clock,
    envelope,
    event,
    make_pipeline,
    new_relay,
    relay,
    store,
    write_liveness,
)

pytestmark = pytest.mark.azurite

HONEST = 12
BUDGET = 6  # seconds: one approval attempt's, which a dripping relay takes whole


@pytest.fixture
def dripping() -> Iterator[str]:
    """A relay callback that answers one byte every 0.5 s, for ever."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    stop = threading.Event()

    def answer(conn: socket.socket) -> None:
        try:
            conn.recv(65536)
            for byte in b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n" + b"x" * 1000:
                if stop.wait(0.5):
                    return
                conn.send(bytes([byte]))
        except OSError:
            pass
        finally:
            conn.close()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                return
            threading.Thread(target=answer, args=(conn,), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.getsockname()[1]}"
    finally:
        stop.set()
        server.close()


class Running:
    """The app's clock from T0, running in real time (an attempt's budget is real seconds,
    as in Azure); `advance` jumps it forward."""

    def __init__(self) -> None:
        self.began, self.offset = time.monotonic(), timedelta()

    def now(self):
        return T0 + self.offset + timedelta(seconds=time.monotonic() - self.began)

    def advance(self, seconds: float) -> None:
        self.offset += timedelta(seconds=seconds)

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


def test_a_dripping_relay_costs_only_its_own_event(store, relay, dripping):  # noqa: F811
    running = Running()
    # Every event waits for a window that opens an hour on; then all are due at once.
    policy = Policy(
        rules=(Rule(name="all", action="approve"),),
        windows=(Window(days=("Sat",), start="11:00", end="23:00"),),  # T0: Sat 10:00 UTC
        timezone="UTC",
        max_concurrent_per_set=100,
    )
    pipeline, _ = make_pipeline(store, running, policy, approval_budget_seconds=BUDGET)
    far = T0 + timedelta(days=6)
    made_up = event("AAA-MADE-UP", "Redeploy", resources=("liar",), not_before=far, source="User")
    ingest_message(envelope("liar", 1, [made_up], callback_url=dripping), pipeline)
    names = [f"vm{i:02d}" for i in range(HONEST)]
    for name in names:
        ev = event(f"EV-{name}", resources=(name,), not_before=T0 + timedelta(hours=3))
        ingest_message(envelope(name, 1, [ev], callback_url=relay.url), pipeline)
    assert relay.requests == []  # every one waits for the window
    running.advance(3600)  # the window opens; every relay heartbeats
    for name in (*names, "liar"):
        write_liveness(store, name, running.now())
    work = LocalWorkQueue(pipeline, workers=16)
    pipeline.work_queue = work
    try:
        started = time.monotonic()
        report = run_watchdog(pipeline)
        sweep = time.monotonic() - started
        assert report.due == HONEST + 1
        # On 2cd3d60 the sweep reconciled inline and waited out the drip (BUDGET s and more).
        assert sweep < BUDGET / 2, f"the sweep took {sweep:.1f} s: it must wait on no relay"
        deadline = time.monotonic() + 3 * BUDGET
        while len(relay.starts()) < HONEST and time.monotonic() < deadline:
            time.sleep(0.05)
        honest = time.monotonic() - started
        assert sorted(relay.starts()) == sorted(f"EV-{n}" for n in names)
        # Approved while the liar's relay is still dripping (its attempt takes BUDGET s).
        assert not work.idle(), "the liar's work item ended first: nothing was shown"
        while not work.idle() and time.monotonic() < deadline:
            time.sleep(0.05)
        took = time.monotonic() - started
        assert honest < took, f"honest events {honest:.1f} s, the liar's item {took:.1f} s"
        # The whole exchange is bounded: the liar costs its own item one attempt's budget.
        assert took < 2 * BUDGET, f"the dripping relay held its own work item {took:.1f} s"
    finally:
        work.close()
    liar = store.get_event("AAA-MADE-UP")
    assert liar.approval == "pending"  # asked again later, its own time only
    assert any("DeadlineExceeded" in a.outcome for a in liar.approval_attempts)


def test_a_made_up_resources_list_costs_a_bounded_number_of_reads(store, clock, relay, mocker):  # noqa: F811
    """999 names no relay reported: the approval reads the reporters (one query) and a
    few other named VMs, never one row per name, at ingest or at any later sweep."""
    from functions.pipeline import relay_phase

    pipeline, _ = make_pipeline(store, clock)
    relay.default = (503, {"error": "busy"})  # never approves: the approval stays pending
    names = ("liar", *(f"ghost-{i:03d}" for i in range(999)))
    made_up = event("EV-GHOSTS", "Redeploy", resources=names, source="User")
    reads = mocker.spy(store, "get_vm")
    ingest_message(envelope("liar", 1, [made_up], callback_url=relay.url), pipeline)
    at_ingest = reads.call_count
    assert at_ingest <= 2 + relay_phase.MAX_UNREPORTED_READS, at_ingest
    reads.reset_mock()
    clock.advance(120)
    run_watchdog(pipeline)
    assert reads.call_count <= 2 + relay_phase.MAX_UNREPORTED_READS, reads.call_count
