"""The demo's impact ledger (issue 33): each Freeze's cost as its VMs' relays measured it.

The simulator plays every Freeze as a guest pause (simulator/guest.py) and each relay runs
under the guest clock shim (simulator/guest_clock.py), so a relay's monotonic clock stands
still while its VM is paused, as a frozen guest's does. After the plan has played, the
demo reads each Freeze's ledger from the store the way an operator would
(functions/ledger.py), prints it, checks that the relays measured the pause the simulator
played, and keeps it for the report. A relay's wall clock is this host's: a step of it
(local/host_clock.py, issue 47) is in what the relay measured too, and counted as such.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from functions.ledger import LedgerLine, read_ledger, summary
from local.report import Outcome, short_id

if TYPE_CHECKING:
    from local.demo_state import DemoState
    from local.watcher import EventTrack

CLOCK_DIR = "guest-clocks"  # under the demo's working directory: one clock file per VM
LEAD = 1.0  # seconds from Started to the pause, so the relay sees Started first
WAIT = 10.0  # seconds to wait for the documents that say the Freeze left IMDS


def relay_command(demo: DemoState, vm: str, argv: list[str]) -> list[str]:
    """A relay's command line run under the guest clock shim of its VM."""
    from simulator import guest_clock

    return [argv[0], guest_clock.__file__, str(demo.workdir / CLOCK_DIR / f"{vm}.json"), *argv[1:]]


def ledger_outcomes(demo: DemoState) -> list[Outcome]:
    """Print each Freeze's ledger and check it; (lane label, its lines) stay on
    `demo.ledgers`, for the report and for tests once the store is gone."""
    demo.ledgers = []
    if demo.watcher is None or getattr(demo, "store", None) is None:
        return []
    relays = set(getattr(demo, "relays", {}) or {})
    outcomes = []
    for track in sorted(demo.watcher.snapshot().values(), key=lambda t: t.first_seen):
        if track.event_type != "Freeze" or track.started_at is None:
            continue
        measured = [vm for vm in track.resources if vm in relays]
        lines = _wait_for_lines(demo, track.event_id, measured)
        demo.ledgers.append((f"{track.what} {', '.join(track.resources)}", lines))
        for line in lines:
            demo.timeline.add("relay", short_id(track.event_id), f"ledger: {summary(line)}")
        for vm in measured:
            outcomes.append(_check(demo, track, vm, lines))
    return outcomes


def _wait_for_lines(demo: DemoState, event_id: str, vms: list[str]) -> list[LedgerLine]:
    """The ledger once every relay's line says the event left (or after WAIT seconds)."""
    deadline = time.monotonic() + WAIT
    while True:
        _, lines = read_ledger(demo.store, event_id)
        left = {line.vm for line in lines if line.left_at is not None}
        if set(vms) <= left or time.monotonic() > deadline:
            return lines
        time.sleep(0.2)


def _check(demo: DemoState, track: EventTrack, vm: str, lines: list[LedgerLine]) -> Outcome:
    """The relay's line shows the pause the simulator played: as long a polling gap, and
    a wall-clock jump of about as much (its monotonic clock stood still meanwhile), plus
    whatever this host's own wall clock stepped while the event was in IMDS (the relay's
    wall clock is the host's: it measured that step too)."""
    event_id = track.event_id
    name = f"Freeze {short_id(event_id)} on {vm}: its relay measured the pause (ledger)"
    played = demo.sim.pauses(vm)
    line = next((x for x in lines if x.vm == vm), None)
    if not played:
        return Outcome(name, False, "the simulator played no pause")
    if line is None or not line.measured or line.left_at is None:
        return Outcome(name, False, "no ledger line saying the event left IMDS")
    start, end = played[-1]
    pause = end - start
    host = demo.host_clock.stepped(track.first_seen_wall, line.left_at)
    assert line.max_poll_gap_s is not None and line.wall_jump_s is not None
    ok = line.max_poll_gap_s >= pause - 0.3 and abs(line.wall_jump_s - pause - host) <= 0.5
    stepped = f", this host's clock stepped {host:+g} s meanwhile" if host else ""
    detail = (
        f"paused {pause:g} s{stepped}; longest poll gap {line.max_poll_gap_s:g} s, "
        f"wall clock {line.wall_jump_s:+g} s, Started {line.start_delay_s} s after "
        f"{line.start_delay_from}, gone {line.started_for_s} s after Started"
    )
    return Outcome(name, ok, detail)
