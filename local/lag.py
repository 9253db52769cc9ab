"""How starved the demo is on this machine, and what it does about it (issue 45).

`make demo` plays 15 minutes of notice in 15 s (60x): a second of scheduling delay is a
minute of Azure's time, so on a busy machine deadlines slip and outcomes fail that the
bridge would meet. The demo measures its own lag, the way a timer sees it: how much later
than asked a short sleep returns (its overshoot), beside the load average per core.

- Before it starts (`choose_scale`): a busy machine plays at a slower time scale, said on
  the first line of the timeline; `--time-scale` given by hand is kept as given.
- While it plays (`LagMeter`): the overshoot is sampled all along; when an outcome fails
  and the machine was busy, the summary says so (`verdict`), so a failure of the
  machine's is not read as the bridge's.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass

SAMPLE_SLEEP = 0.02  # each probe sleeps this long and measures how much longer it took
SAMPLE_EVERY = 0.2
# Busy: a timer a tenth of a poll interval (0.25 s) late, or twice as many runnable
# processes as cores; very busy: five times that.
BUSY_LAG = 0.025
BUSY_LOAD = 2.0
VERY_BUSY_LAG = 0.125
VERY_BUSY_LOAD = 5.0


def load_per_core() -> float:
    """The 1-minute load average over the cores this process may run on (0 if unknown)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    try:
        return os.getloadavg()[0] / max(cores, 1)
    except OSError:
        return 0.0


def overshoot(samples: int = 10) -> float:
    """The 90th percentile of how late `samples` short sleeps returned, in seconds."""
    late = []
    for _ in range(samples):
        start = time.monotonic()
        time.sleep(SAMPLE_SLEEP)
        late.append(max(0.0, time.monotonic() - start - SAMPLE_SLEEP))
    return percentile(late, 0.9)


def percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@dataclass(frozen=True)
class Pace:
    """The time scale to play at, and why (empty when the requested one stands)."""

    scale: float
    note: str = ""


def choose_scale(requested: float, lag: float, load: float) -> Pace:
    """Slow the time scale on a busy machine: half on a busy one, a third on a very busy
    one (never faster than asked). `lag`: timer overshoot (s); `load`: load per core."""
    measured = f"timer lag {lag * 1000:.0f} ms, load {load:.1f} per core"
    if lag >= VERY_BUSY_LAG or load >= VERY_BUSY_LOAD:
        factor = 3.0
    elif lag >= BUSY_LAG or load >= BUSY_LOAD:
        factor = 2.0
    else:
        return Pace(requested)
    scale = requested / factor
    return Pace(
        scale,
        f"this machine is busy ({measured}): playing at {scale:g}x instead of "
        f"{requested:g}x, so a second of delay is less of Azure's time (--time-scale to choose)",
    )


class LagMeter:
    """Samples the timer's overshoot in a thread while the demo plays."""

    def __init__(self) -> None:
        self.samples: list[float] = []
        self.loads: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="lag-meter")

    def start(self) -> LagMeter:
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(SAMPLE_EVERY):
            self.samples.append(overshoot(1))
            self.loads.append(load_per_core())

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)

    def verdict(self, failed: int, scale: float = 60.0) -> str:
        """What the summary says about the machine: "" when it kept up, or no outcome
        failed; else that the failures may be the machine's."""
        lag = percentile(self.samples, 0.9)
        load = max(self.loads, default=0.0)
        if failed == 0 or (lag < BUSY_LAG and load < BUSY_LOAD):
            return ""
        return (
            f"this machine was busy while the demo played (timer lag p90 {lag * 1000:.0f} ms, "
            f"load up to {load:.1f} per core): a failed outcome may be the machine's, not the "
            f"bridge's; run it again with a slower --time-scale (e.g. {scale / 2:g})"
        )
