"""The guest clock shim: run a relay whose monotonic clock stands still while its VM is paused.

    python simulator/guest_clock.py CLOCK_FILE -m relay --imds-url ... (the relay's arguments)
    python simulator/guest_clock.py CLOCK_FILE scheduled-events-relay.pyz --imds-url ...

The simulator's Freeze playback (simulator/guest.py) pauses a VM's IMDS and writes the
pause windows (`{"pauses": [[start, end], ...]}`, epoch seconds) to CLOCK_FILE. A frozen
guest's clocks stand still; when it runs again time sync sets its wall clock right, but
not its monotonic clock. This shim gives the relay process exactly that: `time.monotonic`
minus the paused time so far, `time.time` untouched. Nothing in the relay changes, so the
wall-clock jump and the polling gap it reports (relay/watcher.py) are its own measurements.

Run by path, not as `-m simulator.…`: the simulator package imports pydantic and the
function app's models, which a relay process must not carry. Standard library only,
Python 3.9 and newer, like the relay.
"""

from __future__ import annotations

import json
import os
import runpy
import sys
import time

_real_monotonic = time.monotonic
_real_time = time.time


class _Pauses:
    """The clock file's windows, re-read when it changes (one stat per clock reading)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.stamp: object = None
        self.windows: list[tuple[float, float]] = []

    def paused_before(self, now: float) -> float:
        try:
            info = os.stat(self.path)
            stamp: object = (info.st_mtime_ns, info.st_size)
        except OSError:
            stamp = None
        if stamp != self.stamp:
            self.stamp = stamp
            self.windows = _read(self.path) if stamp is not None else []
        return sum(max(0.0, min(end, now) - start) for start, end in self.windows if start < now)


def _read(path: str) -> list[tuple[float, float]]:
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
        return [(float(s), float(e)) for s, e in data["pauses"] if float(e) > float(s)]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        # The simulator writes the file whole (os.replace): a bad one is a bug, say so.
        print(f"guest_clock: {path}: unreadable ({exc}); no pauses", file=sys.stderr)
        return []


class _Step:
    """A step of the guest's wall clock (the chaos suite's, tests/chaos): seconds in the
    file CLOCK_FILE.step, re-read when it changes; none while there is no such file."""

    def __init__(self, path: str) -> None:
        self.path = path + ".step"
        self.stamp: object = None
        self.seconds = 0.0

    def now(self) -> float:
        try:
            info = os.stat(self.path)
            stamp: object = (info.st_mtime_ns, info.st_size)
        except OSError:
            stamp = None
        if stamp != self.stamp:
            self.stamp = stamp
            try:
                with open(self.path, encoding="utf-8") as handle:
                    self.seconds = float(handle.read().strip() or 0)
            except (OSError, ValueError):
                self.seconds = 0.0
        return self.seconds


def install(path: str) -> None:
    """Replace time.monotonic in this process (before the relay imports it), and
    time.time by the wall clock plus any step of it (CLOCK_FILE.step). `datetime.now`
    reads the system clock in C and is not stepped: the relay's `observed_at` keeps
    the host's time."""
    pauses = _Pauses(path)
    step = _Step(path)

    def monotonic() -> float:
        return _real_monotonic() - pauses.paused_before(_real_time())

    def wall() -> float:
        return _real_time() + step.now()

    time.monotonic = monotonic  # type: ignore[assignment]
    time.time = wall  # type: ignore[assignment]


def main(argv: list[str]) -> int:
    if len(argv) < 2 or (argv[1] == "-m" and len(argv) < 3):
        print("usage: guest_clock.py CLOCK_FILE (-m MODULE | PATH) [ARGS...]", file=sys.stderr)
        return 2
    install(argv[0])
    if argv[1] == "-m":
        # As `python -m MODULE` would: the working directory first on the path, then the
        # repository this file belongs to (where `relay` is).
        module = argv[2]
        sys.path[0] = os.getcwd()
        sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        sys.argv = [module, *argv[3:]]
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    else:  # a script or a zipapp (the relay's pyz), as `python PATH` would run it
        sys.path[0] = argv[1]
        sys.argv = argv[1:]
        runpy.run_path(argv[1], run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
