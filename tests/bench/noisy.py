"""The noisy neighbour (issue 46 item 3): one VM's made-up events cost honest VMs nothing.
`make bench` phase `noisy_neighbour`:

- HONEST VMs (200), each with a Redeploy the policy holds for a maintenance window, and
  one VM (`liar`) with MADE_UP (100) made-up Freezes whose relay accepts every connection
  and never answers (two hours' worth of new events at the default per-VM bound, all open
  at once); the liar's events sort first, so the sweep hands them over first;
- the window opens (the app's clock moves on; everything else is real time) and the sweep
  runs every SWEEP_EVERY seconds, handing every due event to the local host's work queue
  (host.json `maxConcurrentCalls` workers), on an Azurite of its own;
- the same wave runs again without the liar, on fresh tables.

Keys: `noisy_neighbour_delay_p99_s`: the honest approvals' p99 (from the window opening to
StartRequests received by their relay) minus the same wave's without the liar;
`noisy_neighbour_p99_s` and `noisy_neighbour_alone_p99_s`, the two p99s;
`noisy_neighbour_exchanges_at_once`: the most exchanges the liar's relay had open at once.
The negative control (tests/bench/test_noisy.py): the same with each VM's lane turned off
(functions.pipeline.lanes) misses the target.
"""

from __future__ import annotations

import socket
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

from functions.model.policy import Policy, Rule, Window
from functions.pipeline.watchdog import run_watchdog
from functions.store.state import Store
from local.host import LocalWorkQueue, TriggerConfig
from tests.bench.wave import deliver

HONEST = 200
MADE_UP = 100
BUDGET = 5  # seconds: one approval attempt's (a silent relay takes it whole)
SWEEP_EVERY = 2.0  # seconds between sweeps (the timer: every minute in Azure)
GIVE_UP = 180.0  # seconds: a wave not approved by then is reported as such


class Silent:
    """A relay that accepts every connection and never answers; `most`: the most
    connections open at once."""

    def __init__(self) -> None:
        self.server = socket.socket()
        self.server.bind(("127.0.0.1", 0))
        self.server.listen(256)
        self.url = f"http://127.0.0.1:{self.server.getsockname()[1]}"
        self.lock = threading.Lock()
        self.open = self.most = self.opened = 0
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
            while conn.recv(65536):
                pass
        except OSError:
            pass
        finally:
            conn.close()
            with self.lock:
                self.open -= 1

    def close(self) -> None:
        self.stop.set()
        self.server.close()


@contextmanager
def silent_relay() -> Iterator[Silent]:
    relay = Silent()
    try:
        yield relay
    finally:
        relay.close()


def wave(
    connection_string: str, *, liar: bool, fair: bool = True, honest: int = HONEST
) -> dict[str, Any]:
    """One wave: `honest` VMs' events (and the liar's, with `liar`) due at once; returns
    the honest approvals' p99 and max (s) and what the liar's relay saw."""
    from tests.functions.conftest import T0, FakeClock, Relay, envelope, event, make_pipeline

    relay = Relay()
    clock = FakeClock()
    policy = Policy(
        rules=(Rule(name="all", action="approve"),),
        # T0 is Saturday 10:00 UTC: the window opens a minute after every VM reported.
        windows=(Window(days=("Sat",), start="10:01", end="23:00"),),
        timezone="UTC",
        max_concurrent_per_set=honest + MADE_UP,
    )
    names = [f"noisy-{i:04d}" for i in range(honest)]
    store = Store.from_connection_string(connection_string, "noisy" + uuid.uuid4().hex[:8])
    store.ensure_tables()
    # 100 new events of one VM are two hours' worth at the default bound (50 an hour,
    # MAX_NEW_EVENTS_PER_VM_HOUR): the bench has them all open at once.
    pipeline, _ = make_pipeline(
        store, clock, policy, approval_budget_seconds=BUDGET, max_new_events_per_vm_hour=MADE_UP
    )
    if not fair:
        pipeline.relay_lanes = None  # the negative control
    work = LocalWorkQueue(pipeline, TriggerConfig.from_host_json().max_concurrent_calls)
    try:
        with silent_relay() as silent:
            near = T0 + timedelta(hours=1)
            if liar:  # the made-up events sort first: the sweep hands them over first
                made_up = [
                    event(f"AAA-{i:03d}", "Freeze", resources=("liar",), not_before=near)
                    for i in range(MADE_UP)
                ]
                deliver(envelope("liar", 1, made_up, callback_url=silent.url), pipeline)

            def report(name: str) -> None:
                ev = event(f"ZZZ-{name}", "Redeploy", resources=(name,), not_before=near)
                deliver(envelope(name, 1, [ev], callback_url=relay.url), pipeline)

            with ThreadPoolExecutor(max_workers=8) as pool:
                list(pool.map(report, names))
            assert relay.requests == [] and silent.opened == 0, "the window holds every event"
            clock.advance(61)  # the window opens
            pipeline.work_queue = work
            opened = time.monotonic()
            while len(relay.requests) < honest and time.monotonic() - opened < GIVE_UP:
                started = time.monotonic()
                run_watchdog(pipeline)
                while time.monotonic() < started + SWEEP_EVERY and len(relay.requests) < honest:
                    time.sleep(0.05)
            times = sorted(r["at"] - opened for r in relay.requests if "at" in r)
            most = silent.most
    finally:
        work.pool.shutdown(wait=True, cancel_futures=True)
        relay.close()
    p99 = times[min(len(times) - 1, int(len(times) * 0.99))] if times else GIVE_UP
    return {
        "approved": len({i for r in relay.requests for i in r["EventIds"]}),
        "p99": p99,
        "max": times[-1] if times else GIVE_UP,
        "most": most,
    }


def run(connection_string: str, honest: int = HONEST, fair: bool = True) -> dict[str, Any]:
    """The wave alone, then beside the liar; `fair=False` (the negative control,
    tests/bench/test_noisy.py) turns each VM's lane off in the second."""
    alone = wave(connection_string, liar=False, honest=honest)
    beside = wave(connection_string, liar=True, fair=fair, honest=honest)
    return {
        "noisy_neighbour_honest": honest,
        "noisy_neighbour_made_up": MADE_UP,
        "noisy_neighbour_approved": beside["approved"],
        "noisy_neighbour_unapproved": honest - beside["approved"],
        "noisy_neighbour_alone_p99_s": round(alone["p99"], 1),
        "noisy_neighbour_p99_s": round(beside["p99"], 1),
        "noisy_neighbour_delay_p99_s": round(beside["p99"] - alone["p99"], 1),
        "noisy_neighbour_exchanges_at_once": beside["most"],
    }
