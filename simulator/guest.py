"""Freeze playback: a Started Freeze pauses the guests of the VMs it names (issue 33).

On Azure a Freeze (a live migration, memory-preserving host maintenance) pauses the VM for
a few seconds some time after the event goes Started; inside, nothing runs, so its relay
polls nothing, and its clocks stand still until time sync sets the wall clock right. With
`play_freezes()` the simulator plays that, so a real relay really measures it
(relay/watcher.py `_clocks`):
- the pause: `lead` seconds after a Freeze starts, each VM it names is paused for the
  event's DurationInSeconds (real seconds, not scaled: a pause, like a fault delay, is
  not maintenance time; `pause` when the duration is unknown). Every IMDS request of that
  VM waits until the pause ends, as a frozen guest's request would;
- the clocks: with `clock_dir`, the pause is written to `<clock_dir>/<vm>.json`, which the
  guest clock shim (simulator/guest_clock.py) running inside that VM's relay reads: its
  monotonic clock stands still during the pause while its wall clock is right after it,
  so the relay sees a wall-clock jump of about the pause, and a polling gap as long.
Pauses are in the simulator's clock (time.time by default; a fake clock makes the clock
files meaningless to a real process).
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

from functions.model.envelope import FREEZE
from simulator.errors import SimulatorError
from simulator.records import Event, Vm

MAX_PAUSE = 60.0  # seconds: Azure's Freeze pauses last seconds, a test must not hang


class GuestMixin:
    """Freeze playback over the engine's VMs, under the engine's lock (simulator.engine)."""

    _lock: threading.RLock
    _vms: dict[str, Vm]
    _freeze_play: tuple[float, float, Path | None] | None = None
    _paused: dict[str, list[tuple[float, float]]]

    def play_freezes(
        self, clock_dir: str | Path | None = None, lead: float = 1.0, pause: float = 2.0
    ) -> None:
        """From now on, a Freeze that goes Started pauses its VMs' guests (module doc)."""
        for label, value in (("lead", lead), ("pause", pause)):
            if not (isinstance(value, int | float) and 0 <= value <= MAX_PAUSE):
                raise SimulatorError(f"{label} must be a number of seconds in 0..{MAX_PAUSE:g}")
        folder = Path(clock_dir) if clock_dir is not None else None
        if folder is not None:
            folder.mkdir(parents=True, exist_ok=True)
        with self._lock:
            self._freeze_play = (float(lead), float(pause), folder)

    def pauses(self, vm: str) -> list[tuple[float, float]]:
        """(start, end) of every guest pause played on `vm`, oldest first."""
        with self._lock:
            return list(self._paused.get(vm.casefold(), []))

    def _pause_guests(self, event: Event, started: float) -> None:
        """Called as a Freeze goes Started (under the lock)."""
        if self._freeze_play is None or event.event_type != FREEZE:
            return
        lead, default, folder = self._freeze_play
        length = min(float(event.duration), MAX_PAUSE) if event.duration > 0 else default
        window = (started + lead, started + lead + length)
        for name in event.resources:
            vm = self._vms.get(name.casefold())
            if vm is None:
                continue
            windows = self._paused.setdefault(vm.name.casefold(), [])
            windows.append(window)
            if folder is not None:
                _write_clock_file(folder / f"{vm.name}.json", windows)

    def guest_hold(self, vm: str, now: float) -> float:
        """How long a request of `vm` arriving at `now` waits: its guest is paused."""
        with self._lock:
            for start, end in self._paused.get(vm.casefold(), ()):
                if start <= now < end:
                    return end - now
            return 0.0


def _write_clock_file(path: Path, windows: list[tuple[float, float]]) -> None:
    """Replace the file at once (a reader never sees half of it)."""
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(json.dumps({"pauses": [list(w) for w in windows]}), encoding="utf-8")
    os.replace(temporary, path)
