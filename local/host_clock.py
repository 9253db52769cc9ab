"""This machine's own wall-clock steps, which every part of the demo lives through (issue 47).

The simulator's clock (time.time), the relays' wall clocks and the watcher's are this
host's. A host that is itself a VM can be paused and resumed (its own live migration, a
snapshot): its monotonic clock stands still meanwhile and time sync then steps its wall
clock right, exactly what the demo plays for a Freeze. A relay then measures that step as a
wall-clock jump beside any Freeze pause of its own (it cannot tell them apart, nor should
it), and the simulator's timeline jumps ahead as far. A fresh CI run of 2026-12-05 (issue 47)
had one of about +9.5 s: web-1's ledger said +14.6 s for its 5 s pause, a 10 s user
reboot was over 2.1 s (monotonic) after it started, and the held platform reboot of web-as
started 9.2 s before its NotBefore.

`HostClock` samples `time.time() - time.monotonic()` and keeps each step, so the demo can
say that its host's clock stepped, and check a relay's ledger against the pause the
simulator played plus the host's steps in the same interval.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

EVERY = 0.1  # seconds between samples
# A step, not drift: time sync slews a clock by microseconds per 0.1 s sample, while a
# timer's overshoot under load moves both clocks alike.
STEP = 0.05


@dataclass(frozen=True)
class ClockStep:
    """The wall clock moved `seconds` against the monotonic one between two samples: the
    wall times of the sample before and the sample after (the latter already stepped)."""

    since: float
    until: float
    seconds: float


class HostClock:
    """Samples this host's clocks on a thread of its own until `stop`."""

    def __init__(
        self,
        on_step: Callable[[ClockStep], None] | None = None,
        wall: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.on_step = on_step
        self._wall, self._monotonic = wall, monotonic
        self._steps: list[ClockStep] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._last = self._read()
        self._thread = threading.Thread(target=self._run, name="host-clock", daemon=True)

    def start(self) -> HostClock:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        self.sample()  # a step since the last sample still counts

    @property
    def steps(self) -> list[ClockStep]:
        with self._lock:
            return list(self._steps)

    def sample(self) -> ClockStep | None:
        """Compare the clocks now with the last sample; keep and return a step."""
        with self._lock:
            wall, offset = now = self._read()
            last_wall, last_offset = self._last
            self._last = now
            moved = offset - last_offset
            if abs(moved) < STEP:
                return None
            step = ClockStep(last_wall, wall, round(moved, 3))
            self._steps.append(step)
        if self.on_step is not None:
            self.on_step(step)
        return step

    def stepped(self, since: datetime | float, until: datetime | float) -> float:
        """Seconds the wall clock stepped between two wall times (epoch seconds or aware
        datetimes, as this host's wall clock read them): every step seen after `since` and
        before `until`."""
        start, end = _epoch(since), _epoch(until)
        return round(
            sum(
                s.seconds
                for s in self.steps
                # A step back ends before it began, in wall time.
                if max(s.since, s.until) > start and min(s.since, s.until) < end
            ),
            3,
        )

    def _read(self) -> tuple[float, float]:
        wall = self._wall()
        return wall, wall - self._monotonic()

    def _run(self) -> None:
        while not self._stop.wait(EVERY):
            self.sample()


def _epoch(when: datetime | float) -> float:
    return when.timestamp() if isinstance(when, datetime) else float(when)


def describe(step: ClockStep) -> str:
    """The timeline's line for a step."""
    at = datetime.fromtimestamp(step.until, UTC).strftime("%H:%M:%S")
    return (
        f"this host's wall clock stepped {step.seconds:+.1f} s against its monotonic clock "
        f"(by {at} UTC): the machine itself was paused, or its time was set; the simulator's "
        "times and every relay's wall clock moved as much"
    )
