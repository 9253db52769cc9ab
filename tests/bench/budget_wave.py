"""A wave under a disruption budget (issue 39). `make bench` phase `budget`:

- BUDGET_VMS (60) VMs of one service (tag `service=shop`) over three scale sets in two
  zones, placed as the identity sync places them (its placement rows and the group's
  size: Azure's facts), and a budget `shop` of 20 % of the service (12 VMs out at once);
  the per-set guard is set wide open, so only the budget holds anything back;
- every VM's Reboot is held by a maintenance window, which then opens: all 60 are due at
  once (the app's clock moves on a minute; everything else runs in real time);
- the sweep hands every due event to the local host's work queue (LocalWorkQueue, the
  host.json `maxConcurrentCalls` workers) every SWEEP_EVERY seconds, as the timer would;
- each VM whose relay gets StartRequests reports its event Started STARTED_AFTER seconds
  later and gone IMPACT seconds after that, as IMDS shows it: that gives its slot back and
  wakes the events waiting for it.

Keys: `budget_peak_over_limit` (VMs out at once beyond the budget's limit, at worst: out
from the StartRequests its relay received until it reported the event gone, and the slot
row's holders sampled meanwhile; target 0); `budget_unapproved` (VMs never approved before
the wave was given up; target 0); `budget_wait_p99_s` and `budget_wait_max_s` (from the
window's opening to each VM's StartRequests, one never approved counted at the time the
wave was given up); `budget_slots_held_at_end` (the slot row's holders once the wave is
over: a slot that leaked); `budget_peak`, `budget_limit`, `budget_approved`, `budget_s`
(the wave's wall time).
"""

from __future__ import annotations

import heapq
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

from functions.model.budgets import Budget, Placement
from functions.model.policy import Policy, Rule, Window
from functions.pipeline.watchdog import run_watchdog
from functions.store.budget_slots import BudgetSlots
from functions.store.placements import Placements
from functions.store.state import Store
from local.host import LocalWorkQueue, TriggerConfig
from tests.bench.wave import MovingClock, deliver

BUDGET_VMS = 60
SETS = (("shop-a", "1"), ("shop-b", "2"), ("shop-c", "1"))  # three scale sets, two zones
SHARE = "20%"
GROUP = "tag:service=shop"
STARTED_AFTER = 0.3  # seconds from StartRequests to the VM reporting it Started
IMPACT = 2.0  # seconds from Started to the VM reporting it gone
SWEEP_EVERY = 2.0
GIVE_UP = 50.0  # seconds: a wave not over by then is reported as such


def run(
    connection_string: str,
    vms: int = BUDGET_VMS,
    *,
    enforced: bool = True,
    impact: float = IMPACT,
) -> dict[str, Any]:
    """The wave; `enforced` False: the same policy without its budget (what the wave does
    without one, measured against the same limit); `impact`: seconds a VM is Started."""
    from tests.functions.conftest import T0, Relay, envelope, event, make_pipeline

    relay = Relay()
    clock = MovingClock()
    names = [f"{SETS[i % len(SETS)][0]}_{i // len(SETS)}" for i in range(vms)]
    budget = Budget(name="shop", group_by=("tag:service",), max_unavailable=SHARE)
    policy = Policy(
        rules=(Rule(name="all", action="approve"),),
        # T0 is Saturday 10:00 UTC: the window opens a minute after every VM reported.
        windows=(Window(days=("Sat",), start="10:01", end="23:00"),),
        timezone="UTC",
        max_concurrent_per_set=vms,
        budgets=(budget,) if enforced else (),
    )
    limit = budget.limit(vms)
    store = Store.from_connection_string(connection_string, "bud" + uuid.uuid4().hex[:8])
    store.ensure_tables()
    pipeline, _ = make_pipeline(store, clock, policy, approval_budget_seconds=5)
    _place(store, names, T0)
    not_before = T0 + timedelta(hours=2)
    events = {
        name: event(f"SHOP-{name}", resources=(name,), not_before=not_before) for name in names
    }

    def report(name: str, sequence: int, listed: list[dict[str, Any]]) -> None:
        body = envelope(name, sequence, listed, callback_url=relay.url, observed_at=clock.now())
        deliver(body, pipeline)

    try:
        with ThreadPoolExecutor(max_workers=8) as pool:
            list(pool.map(lambda n: report(n, 1, [events[n]]), names))
        assert relay.requests == [], "the window holds every event"
        work = LocalWorkQueue(pipeline, TriggerConfig.from_host_json().max_concurrent_calls)
        pipeline.work_queue = work
        fleet = _Fleet(relay, events, report, impact)
        rows = _SlotWatch(store, budget.name)
        clock.advance(61)  # the window opens: every event is due
        opened = time.monotonic()
        clock.run()  # from now on the app's time moves with real time
        try:
            while len(fleet.ended) < vms and time.monotonic() - opened < GIVE_UP:
                started = time.monotonic()
                run_watchdog(pipeline)
                while time.monotonic() < started + SWEEP_EVERY and len(fleet.ended) < vms:
                    fleet.step()
                    time.sleep(0.02)
            took = time.monotonic() - opened
            fleet.close(finish=True)  # every report sent and ingested
            # Then the work their ends queued (the reconciles that give slots back), for
            # as long as a sweep would take to come round again.
            settled = time.monotonic() + 2 * SWEEP_EVERY
            while not work.idle() and time.monotonic() < settled:
                time.sleep(0.05)
        finally:
            fleet.close()
            rows.close()
            work.pool.shutdown(wait=False, cancel_futures=True)
        # Every VM that reported its event gone gave its slot back (its leaving document
        # releases it): holders left are slots that leaked, or VMs still out.
        slot = BudgetSlots(store.events).get_budget_slot(budget.name, GROUP)
        held = len(slot.holders) if slot is not None else 0
    finally:
        relay.close()
    # Every VM counts: one never approved at the time the wave was given up, so a wave
    # whose slots never come back misses its wait instead of dropping those VMs (issue 47).
    given_up = max(took, GIVE_UP)
    waits = sorted(fleet.approved[n] - opened if n in fleet.approved else given_up for n in names)
    peak = _peak(fleet.approved, fleet.ended)
    p99 = waits[min(len(waits) - 1, int(len(waits) * 0.99))] if waits else None
    return {
        "budget_vms": vms,
        "budget_limit": limit,
        "budget_approved": len(fleet.approved),
        "budget_unapproved": vms - len(fleet.approved),
        "budget_slots_held_at_end": held,
        "budget_peak": peak,
        "budget_peak_rows": rows.peak,
        "budget_peak_over_limit": max(0, max(peak, rows.peak) - limit),
        "budget_wait_p99_s": round(p99, 1) if p99 is not None else None,
        "budget_wait_max_s": round(waits[-1], 1) if waits else None,
        "budget_s": round(took, 1),
        "_waits": [round(w, 2) for w in waits],
    }


def _place(store: Store, names: list[str], at: Any) -> None:
    """What the identity sync writes from Resource Graph: each VM's placement (its scale
    set, zone and tags) and the budget group's size."""
    sets = dict(SETS)
    placements = [
        Placement(
            name=name,
            vm_id=f"vmid-{name}",
            zone=sets[name.rsplit("_", 1)[0]],
            scale_set=name.rsplit("_", 1)[0],
            tags={"service": "shop"},
            fetched_at=at,
        )
        for name in names
    ]
    table = Placements(store.service.get_table_client(f"{store.prefix}identities"))
    table.put(placements)
    table.write_sizes({"shop": {GROUP: len(names)}}, at)


class _Fleet:
    """The VMs as IMDS plays them: Started soon after their StartRequests, gone after a
    fixed impact; each report sent from a worker of its own, like the relays do."""

    def __init__(
        self, relay: Any, events: dict[str, dict[str, Any]], report: Any, impact: float
    ) -> None:
        self.relay, self.events, self.report, self.impact = relay, events, report, impact
        self.by_id = {ev["EventId"]: name for name, ev in events.items()}
        self.approved: dict[str, float] = {}  # VM -> when its relay got StartRequests
        self.ended: dict[str, float] = {}  # VM -> when it reported its event gone
        self._seen = 0
        self._due: list[tuple[float, str, str]] = []  # (when, what, VM)
        self._pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="vm")

    def step(self) -> None:
        for request in self.relay.requests[self._seen :]:
            self._seen += 1
            if request.get("status") != 200:
                continue
            for event_id in request["EventIds"]:
                name = self.by_id.get(event_id)
                if name is None or name in self.approved:
                    continue
                self.approved[name] = request["at"]
                heapq.heappush(self._due, (request["at"] + STARTED_AFTER, "started", name))
        now = time.monotonic()
        while self._due and self._due[0][0] <= now:
            _, what, name = heapq.heappop(self._due)
            if what == "started":
                started = {**self.events[name], "EventStatus": "Started", "NotBefore": ""}
                self._pool.submit(self.report, name, 2, [started])
                heapq.heappush(self._due, (now + self.impact, "ended", name))
            else:
                self.ended[name] = time.monotonic()  # out until now: then its slot goes back
                self._pool.submit(self.report, name, 3, [])

    def close(self, *, finish: bool = False) -> None:
        """Stop; `finish`: every report already due is sent first (none dropped)."""
        self._pool.shutdown(wait=True, cancel_futures=not finish)


class _SlotWatch:
    """The budget's slot row, read every 50 ms: the most holders it ever listed."""

    def __init__(self, store: Store, budget: str) -> None:
        self.rows, self.budget = BudgetSlots(store.events), budget
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="slot-watch")
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            row = self.rows.get_budget_slot(self.budget, GROUP)
            if row is not None:
                self.peak = max(self.peak, len(row.holders))

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def _peak(approved: dict[str, float], ended: dict[str, float]) -> int:
    """The most VMs out at once: each from its StartRequests until it reported the event
    gone (still out at the end if it never did)."""
    changes = [(at, 1) for at in approved.values()]
    changes += [(ended[vm], -1) for vm in approved if vm in ended]
    out = peak = 0
    for _, change in sorted(changes, key=lambda c: (c[0], c[1])):
        out += change
        peak = max(peak, out)
    return peak
