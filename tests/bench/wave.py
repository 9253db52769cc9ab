"""The wave (issue 37): a fleet-wide maintenance wave approved on time, whatever one relay
does. `make bench` phase `wave`:

- WAVE_VMS VMs (2,000), each with a disruptive event (a Redeploy) that the policy holds
  for a maintenance window opening a minute after they were reported;
- the window opens (the app's clock moves on a minute; everything else is real time);
- 1 % of the VMs' relays drip their answer one byte a second, or hang;
- the sweep runs every SWEEP_EVERY seconds, as the timer would, and hands every due event
  to the work queue: the local host's workers (host.json `maxConcurrentCalls`), each event
  its own unit of work, on Azurite behind a counting proxy.

Keys: `wave_events` (the event rows the app recorded); `wave_approve_p99_s`,
`wave_approve_max_s` (every honest VM: from the window opening to StartRequests received
by its relay, one never approved counted at the time the wave was given up, GIVE_UP at
least); `wave_honest_unapproved` (honest VMs never approved; target 0); `wave_sweep_s_max`
(one sweep's own wall time); `wave_table_requests_per_event` (every Table request from the
window's opening to the last honest approval, per event: what Azure would bill).
"""

from __future__ import annotations

import socket
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Any

from functions.model.policy import Policy, Rule, Window
from functions.pipeline.ingest import ingest_message
from functions.pipeline.watchdog import run_watchdog
from functions.store.state import Store
from local.host import LocalWorkQueue, TriggerConfig
from tests.functions.conftest import FakeClock
from tests.tablecount import TableCounter

WAVE_VMS = 2_000
SLOW_SHARE = 0.01  # relays that drip or hang
SWEEP_EVERY = 2.0  # seconds between sweeps (the timer: every minute in Azure)
GIVE_UP = 240.0  # seconds: a wave not approved by then is reported as such


class MovingClock(FakeClock):
    """The app's clock in a wave: still while the fleet reports (T0, then moved on to the
    window's opening), then, from `run()`, moving with real time, as the app's does. A clock
    that stood still there made every wake-up of one event the same work item (its
    MessageId carries the moment it became due) and Service Bus's duplicate detection, as
    the local queue now plays it (issue 46), dropped all but the first."""

    def __init__(self) -> None:
        super().__init__()
        self._since: float | None = None

    def run(self) -> None:
        with self._lock:
            self._since = time.monotonic()

    def now(self) -> datetime:
        with self._lock:
            moved = 0.0 if self._since is None else time.monotonic() - self._since
            return self.current + timedelta(seconds=moved)


def deliver(body: str, pipeline: Any, deliveries: int = 3) -> None:
    """One relay message through ingest, delivered again when it fails or asks to be
    retried, as Service Bus redelivers one (the bench's fleets report concurrently to one
    Azurite). Any other outcome than "processed" stops the bench: a fleet whose reports
    were rejected or went stale would measure a wave that never was (issue 47)."""
    for attempt in range(deliveries):
        last = attempt == deliveries - 1
        try:
            result = ingest_message(body, pipeline)
        except Exception:
            if last:
                raise
            continue
        if result.outcome == "processed":
            return
        if result.outcome != "retry" or last:
            raise RuntimeError(f"a report was not processed: {result.outcome} {result.reason}")


@contextmanager
def slow_relays() -> Iterator[str]:
    """A callback that answers one byte a second (odd connections) or never (even ones)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(256)
    stop = threading.Event()
    count = [0]

    def answer(conn: socket.socket, drip: bool) -> None:
        try:
            conn.recv(65536)
            if drip:
                for byte in b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n" + b"x" * 100:
                    if stop.wait(1.0):
                        return
                    conn.send(bytes([byte]))
            stop.wait(600)
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
            count[0] += 1
            threading.Thread(target=answer, args=(conn, count[0] % 2 == 1), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.getsockname()[1]}"
    finally:
        stop.set()
        server.close()


def run(connection_string: str, vms: int = WAVE_VMS) -> dict[str, Any]:
    from tests.functions.conftest import T0, Relay, envelope, event, make_pipeline

    relay = Relay()
    clock = MovingClock()
    names = [f"wave-{i:05d}" for i in range(vms)]
    slow = set(names[:: int(1 / SLOW_SHARE)])
    policy = Policy(
        rules=(Rule(name="all", action="approve"),),
        # T0 is Saturday 10:00 UTC: the window opens a minute after every VM reported.
        windows=(Window(days=("Sat",), start="10:01", end="23:00"),),
        timezone="UTC",
        max_concurrent_per_set=vms,
    )
    prefix = "wave" + uuid.uuid4().hex[:8]
    try:
        with slow_relays() as drip, TableCounter(connection_string) as counter:
            # The fleet reports straight to Azurite; only the wave goes through the counter.
            direct = Store.from_connection_string(connection_string, prefix).ensure_tables()
            reporting, _ = make_pipeline(direct, clock, policy, approval_budget_seconds=5)
            not_before = T0 + timedelta(hours=2)

            def report(name: str) -> None:
                ev = event(f"WAVE-{name}", "Redeploy", resources=(name,), not_before=not_before)
                url = drip if name in slow else relay.url
                deliver(envelope(name, 1, [ev], callback_url=url), reporting)

            with ThreadPoolExecutor(max_workers=16) as pool:
                list(pool.map(report, names))
            assert relay.requests == [], "the window holds every event"
            events = recorded_events(direct)
            store = Store.from_connection_string(counter.connection_string, prefix)
            pipeline, _ = make_pipeline(store, clock, policy, approval_budget_seconds=5)
            clock.advance(61)  # the window opens
            triggers = TriggerConfig.from_host_json()
            work = LocalWorkQueue(pipeline, triggers.max_concurrent_calls)
            pipeline.work_queue = work
            counter.reset()
            opened = time.monotonic()
            clock.run()
            sweeps: list[float] = []
            honest = {f"WAVE-{name}" for name in names if name not in slow}
            try:
                # Until every honest VM's relay got StartRequests (distinct VMs, not a count
                # of requests: one VM asked twice is still one), or the wave is given up.
                while len(approved_at(relay, honest)) < len(honest) and (
                    time.monotonic() - opened < GIVE_UP
                ):
                    started = time.monotonic()
                    run_watchdog(pipeline)
                    sweeps.append(time.monotonic() - started)
                    wait_until = started + SWEEP_EVERY
                    while time.monotonic() < wait_until and len(approved_at(relay, honest)) < len(
                        honest
                    ):
                        time.sleep(0.05)
                requests = counter.total()
                ended = time.monotonic() - opened
            finally:
                # Items still running (the dripping relays' attempts) end within their
                # budget; waited for here, before the counting proxy closes under them.
                work.pool.shutdown(wait=True, cancel_futures=True)
            approved = approved_at(relay, honest)
    finally:
        relay.close()
    # Every honest VM counts: one never approved at the time the wave was given up, so a
    # wave that leaves VMs behind misses its percentiles instead of dropping them (issue 47).
    times = sorted(approved.get(ev, opened + max(ended, GIVE_UP)) - opened for ev in honest)
    p99 = times[min(len(times) - 1, int(len(times) * 0.99))] if times else None
    return {
        "wave_events": events,
        "wave_slow_relays": len(slow),
        "wave_honest_approved": len(approved),
        "wave_honest_unapproved": len(honest) - len(approved),
        "wave_approve_p99_s": round(p99, 1) if p99 is not None else None,
        "wave_approve_max_s": round(times[-1], 1) if times else None,
        "wave_sweep_s_max": round(max(sweeps), 2) if sweeps else None,
        "wave_sweeps": len(sweeps),
        "wave_table_requests_per_event": round(requests / max(1, events), 2),
    }


def approved_at(relay: Any, wanted: set[str]) -> dict[str, float]:
    """Each wanted event's first StartRequests its relay received and approved (200, IMDS
    200), by EventId."""
    first: dict[str, float] = {}
    for request in list(relay.requests):
        if request.get("status") != 200 or request.get("imds_status") != 200:
            continue
        for event_id in request["EventIds"]:
            if event_id in wanted and event_id not in first:
                first[event_id] = request["at"]
    return first


def recorded_events(store: Store) -> int:
    """The event rows the app holds: the wave's size as measured, not as asked for."""
    rows = store.events.query_entities("RowKey eq 'event'", select=["PartitionKey"])
    return sum(1 for _ in rows)
