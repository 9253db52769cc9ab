"""The impact ledger's relay half (relay/watcher.py `Ledger`): what a relay measures of an event.

The measurements come from the real relay against the IMDS simulator playing a Freeze
(simulator/guest.py): its IMDS answers nothing while the guest is paused, and, run under
the guest clock shim (simulator/guest_clock.py), the relay's monotonic clock stands still
meanwhile, as a frozen guest's does. What the relay writes must parse with the function
app's model (functions.model.envelope), which is what ingest keeps.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest

from functions.model.envelope import MAX_LEDGER_ENTRIES, LedgerEntry, parse_envelope
from relay.imds import ImdsClient
from relay.models import VmRef
from relay.outbox import Outbox
from relay.senders import FileSender, SendLoop
from relay.watcher import Ledger, Watcher
from tests.relay.conftest import ROOT, RelayProcess, json_files, wait_for

SHIM = ROOT / "simulator" / "guest_clock.py"
T0 = 1_800_000_000.0  # an epoch second for the synthetic clocks


def item(event_id: str, status: str = "Scheduled", **more: Any) -> dict[str, Any]:
    return {"EventId": event_id, "EventStatus": status, "EventType": "Freeze", **more}


def test_gap_jump_start_and_leave_from_the_polls_alone() -> None:
    ledger = Ledger()
    nb = "Mon, 11 Apr 2022 22:26:58 GMT"
    ledger.observe([item("E1", NotBefore=nb, DurationInSeconds=5)], 100.0, T0)
    ledger.observe([item("E1", NotBefore=nb, DurationInSeconds=5)], 101.0, T0 + 1)
    ledger.observe([item("E1", "Started", NotBefore="", DurationInSeconds=5)], 102.0, T0 + 2)
    ledger.observe([item("E1", "Started", NotBefore="", DurationInSeconds=5)], 102.5, T0 + 2.5)
    # The guest pauses: its monotonic clock moves 0.5 s, its wall clock (set right) 6.5 s.
    ledger.observe([], 103.0, T0 + 9)
    (entry,) = ledger.entries()
    assert entry == {
        "event_id": "E1",
        "started_seen": "2027-01-15T08:00:02+00:00",  # the first poll that showed it
        "left_at": "2027-01-15T08:00:09+00:00",
        "max_poll_gap_s": 6.5,  # the larger of the two clocks' intervals
        "wall_jump_s": 6.0,  # 6.5 s of wall time against 0.5 s of its own
    }
    assert LedgerEntry.model_validate(entry).left_at is not None  # what the app reads
    # Told once: after the envelope carrying it is queued, an event that left is gone.
    ledger.queued()
    assert ledger.entries() == []


def test_a_paused_guest_whose_clocks_ran_shows_a_gap_and_no_jump() -> None:
    ledger = Ledger()
    ledger.observe([item("E1", "Started")], 10.0, T0)
    ledger.observe([item("E1", "Started")], 16.5, T0 + 6.5)
    (entry,) = ledger.entries()
    assert entry["max_poll_gap_s"] == 6.5 and entry["wall_jump_s"] == 0.0
    assert "left_at" not in entry and entry["started_seen"] == "2027-01-15T08:00:00+00:00"


def test_bounded_whatever_imds_lists() -> None:
    ledger = Ledger()
    ledger.observe([item(f"E{i}") for i in range(100)], 1.0, T0)
    entries = ledger.entries()
    assert len(entries) == MAX_LEDGER_ENTRIES == 16  # the relay cuts to what the app takes
    ledger.observe([], 2.0, T0 - 20 * 366 * 86400)  # a wall clock set 20 years back
    left = ledger.entries()
    assert len(left) == MAX_LEDGER_ENTRIES and all(e["left_at"] for e in left)
    jump = -20 * 366 * 86400.0 - 1
    assert all(e["wall_jump_s"] == jump for e in left)  # what it saw, not refused
    assert LedgerEntry.model_validate(left[0]).wall_jump_s == jump


def _run_watcher(simulator: Any, tmp_path: Path) -> tuple[Watcher, threading.Event, SendLoop]:
    outbox = Outbox(tmp_path / "state")
    stop = threading.Event()
    watcher = Watcher(
        ImdsClient(simulator.vm_url("vm0")),
        outbox,
        VmRef(name="vm0"),
        poll_interval=0.05,
        timeout=0.5,
        first_timeout=5,
        max_backoff=0.1,
        stop=stop,
    )
    sending = SendLoop(outbox, FileSender(tmp_path / "forward"), max_backoff=0.05).start()
    threading.Thread(target=watcher.run, daemon=True).start()
    return watcher, stop, sending


def _documents(forward: Path) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in json_files(forward)]


def _left(forward: Path, event_id: str) -> dict[str, Any] | None:
    """The ledger entry of `event_id` once a document says it left IMDS."""
    for envelope in _documents(forward):
        for entry in envelope.get("ledger") or []:
            if entry["event_id"] == event_id and entry.get("left_at"):
                return entry
    return None


def test_the_relay_measures_a_freeze_played_by_the_simulator(
    simulator: Any, tmp_path: Path
) -> None:
    """In-process (the test's own clocks run on): the pause shows as a polling gap only."""
    sim = simulator.sim
    sim.add_vm("vm0")
    sim.play_freezes(lead=0.3)
    watcher, stop, sending = _run_watcher(simulator, tmp_path)
    try:
        wait_for(lambda: _documents(tmp_path / "forward"))
        # 1 s of notice, 4 s Started at the fixture's 60x; a 2 s pause 0.3 s into it.
        event_id = sim.add_event("Freeze", resources=["vm0"], duration=2, notice=60, impact=240)
        entry = wait_for(lambda: _left(tmp_path / "forward", event_id), timeout=15)
    finally:
        stop.set()
        sending.stop()
    (start, end) = sim.pauses("vm0")[0]
    assert end - start == 2.0
    assert 1.9 <= entry["max_poll_gap_s"] <= 3.0, entry
    assert abs(entry["wall_jump_s"]) < 0.2, entry
    assert entry["started_seen"] < entry["left_at"]
    # Every document that carries a ledger is what the function app accepts.
    for envelope in _documents(tmp_path / "forward"):
        parsed = parse_envelope(envelope)
        assert (parsed.ledger is not None) == ("ledger" in envelope)
    assert watcher.ledger.entries() == []


def test_a_relay_process_in_a_frozen_guest_measures_the_gap_and_the_clock_jump(
    simulator: Any, relay_pyz: Path, tmp_path: Path
) -> None:
    """The relay's pyz, run under the guest clock shim: its monotonic clock stands still
    while the simulator pauses the guest, its wall clock is right after, as on a VM."""
    sim = simulator.sim
    sim.add_vm("vm0")
    clocks = tmp_path / "clocks"
    sim.play_freezes(clock_dir=clocks, lead=0.5)
    forward = tmp_path / "forward"
    args = [
        str(clocks / "vm0.json"),
        str(relay_pyz),
        f"--imds-url={simulator.vm_url('vm0')}",
        f"--state-dir={tmp_path / 'state'}",
        f"--forward=file:{forward}",
        "--poll-interval=0.1",
        "--imds-timeout=10",
    ]
    relay = RelayProcess(SHIM, args, tmp_path / "relay.log")
    try:
        wait_for(lambda: json_files(forward), timeout=20)
        event_id = sim.add_event("Freeze", resources=["vm0"], duration=3, notice=60, impact=180)
        entry = wait_for(lambda: _left(forward, event_id), timeout=20)
    finally:
        assert relay.stop() in (0, -15), relay.log_path.read_text()[-2000:]
    # The 3 s pause: as long a gap between successful polls, and a wall clock 3 s ahead
    # of the relay's own (monotonic) time.
    assert 2.9 <= entry["max_poll_gap_s"] <= 4.0, entry
    assert 2.7 <= entry["wall_jump_s"] <= 3.3, entry
    assert entry["started_seen"] < entry["left_at"]
    assert (
        parse_envelope(_documents(forward)[-1]).ledger_for(event_id).wall_jump_s
        == (entry["wall_jump_s"])
    )


@pytest.mark.parametrize("argv", [[], ["clock.json"], ["clock.json", "-m"]])
def test_the_shim_says_how_to_call_it(argv: list[str]) -> None:
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, str(SHIM), *argv], capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 2 and "usage: guest_clock.py" in done.stderr
