"""The impact ledger's relay half (relay/watcher.py `_clocks`): what a relay measures.

Each document carries `polls`: since the previous document, the longest time between two
successful IMDS polls and the net jump of the wall clock against the monotonic one. The
measurements come from the real relay against the IMDS simulator playing a Freeze
(simulator/guest.py): its IMDS answers nothing while the guest is paused, and, run under
the guest clock shim (simulator/guest_clock.py), the relay's monotonic clock stands still
meanwhile, as a frozen guest's does. What the relay writes must parse with the function
app's model (functions.model.envelope).
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest

from functions.model.envelope import parse_envelope
from relay.imds import ImdsClient
from relay.models import VmRef
from relay.outbox import Outbox
from relay.senders import FileSender, SendLoop
from relay.watcher import Watcher
from tests.relay.conftest import ROOT, RelayProcess, json_files, wait_for

SHIM = ROOT / "simulator" / "guest_clock.py"
T0 = 1_800_000_000.0  # an epoch second for the synthetic clocks


def test_gap_and_jump_from_the_polls_alone(tmp_path: Path) -> None:
    watcher = Watcher(ImdsClient("http://127.0.0.1:9"), Outbox(tmp_path), VmRef(name="vm0"))
    watcher._clocks(100.0, T0)
    watcher._clocks(101.0, T0 + 1)
    # The guest pauses: its monotonic clock moves 0.5 s, its wall clock (set right) 6.5 s.
    watcher._clocks(101.5, T0 + 7.5)
    watcher._clocks(102.5, T0 + 8.5)
    assert (watcher._gap, watcher._jump) == (6.5, 6.0)  # the larger interval; the net jump
    watcher._queue_document({"DocumentIncarnation": 1, "Events": []})
    (message,) = [json.loads(p.read_text()) for p in sorted(tmp_path.rglob("*-document.json"))]
    assert message["polls"] == {"max_gap_s": 6.5, "wall_jump_s": 6.0}
    assert parse_envelope(message).polls.max_gap_s == 6.5  # what the app reads
    # Since that document: counted afresh. A clock stepped back years is what it saw.
    assert (watcher._gap, watcher._jump) == (0.0, 0.0)
    watcher._clocks(103.5, T0 - 20 * 366 * 86400)
    assert watcher._jump == -20 * 366 * 86400.0 - 8.5 - 1


def test_a_paused_guest_whose_clocks_ran_shows_a_gap_and_no_jump(tmp_path: Path) -> None:
    watcher = Watcher(ImdsClient("http://127.0.0.1:9"), Outbox(tmp_path), VmRef(name="vm0"))
    watcher._clocks(10.0, T0)
    watcher._clocks(16.5, T0 + 6.5)
    assert (watcher._gap, watcher._jump) == (6.5, 0.0)


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


def _freeze(forward: Path, event_id: str) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """The documents showing `event_id` Started and then gone, once both are there."""
    started = None
    for envelope in _documents(forward):
        events = {e["EventId"]: e["EventStatus"] for e in envelope["document"]["Events"]}
        if started is None and events.get(event_id) == "Started":
            started = envelope
        elif started is not None and event_id not in events:
            return started, envelope
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
        started, gone = wait_for(lambda: _freeze(tmp_path / "forward", event_id), timeout=15)
    finally:
        stop.set()
        sending.stop()
    (start, end) = sim.pauses("vm0")[0]
    assert end - start == 2.0
    # The Started period (what the document without the event says): the 2 s pause.
    assert 1.9 <= gone["polls"]["max_gap_s"] <= 3.0, gone["polls"]
    assert abs(gone["polls"]["wall_jump_s"]) < 0.2, gone["polls"]
    assert started["polls"]["max_gap_s"] < 1.0, started["polls"]  # no pause while Scheduled
    # Every document carries its clocks, as the function app reads them.
    for envelope in _documents(tmp_path / "forward"):
        assert parse_envelope(envelope).polls is not None
    assert watcher.documents >= 3


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
        _, gone = wait_for(lambda: _freeze(forward, event_id), timeout=20)
    finally:
        assert relay.stop() in (0, -15), relay.log_path.read_text()[-2000:]
    # The 3 s pause: as long a gap between successful polls, and a wall clock 3 s ahead
    # of the relay's own (monotonic) time.
    polls = parse_envelope(gone).polls
    assert 2.9 <= polls.max_gap_s <= 4.0, polls
    assert 2.7 <= polls.wall_jump_s <= 3.3, polls


@pytest.mark.parametrize("argv", [[], ["clock.json"], ["clock.json", "-m"]])
def test_the_shim_says_how_to_call_it(argv: list[str]) -> None:
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, str(SHIM), *argv], capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 2 and "usage: guest_clock.py" in done.stderr
