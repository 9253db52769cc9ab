"""Fair work: one VM's relay gets a bounded share of the host's workers (issue 46).

Every approval through a relay is one exchange with that VM's relay, and its time is the
relay's to spend: one that never answers holds its worker for the attempt's whole budget
(`APPROVAL_BUDGET_SECONDS`). On 2f59d6a nothing bounded how many workers one VM could hold
that way: 48 made-up Freezes from one VM whose relay never answers sat in 16 workers, 4 s
each, ahead of 12 honest events (13.7 s to approve them instead of 1.7 s; at the defaults
about 7 minutes per instance). The same held inside one message: a document naming many
events spent one budget after another on the same silent relay.

So each host keeps one lane per VM (its name, as the rows key it):
- one exchange at a time: another approval for the same VM waits for the lane at most
  PATIENCE (an honest relay answers in milliseconds), and is not asked at all once the
  exchange in progress is older than that;
- a relay that did not answer (a connection refused or timed out, the exchange's deadline
  passed) is not asked by other approvals for COOLDOWN: one exchange per COOLDOWN finds
  out whether it answers again.
An approval not asked is `retry_later` at once (its worker goes back to the queue; the
event is due again as any pending approval is, functions.pipeline.due.retry_after), and
says why in its attempts. The approval that holds the lane keeps its own retries within
its budget, so a VM's own events cost that VM's time, and at most one worker per host
(plus PATIENCE for the few that arrive while its exchange starts).

In memory, per host: a host that dies forgets its lanes, and the next one finds out again
with one exchange. Nothing here decides anything about an event.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

PATIENCE = 1.0  # seconds another approval waits for a VM's exchange in progress
COOLDOWN = timedelta(seconds=30)  # a relay that did not answer is asked once per this
MAX_LANES = 100_000  # VMs remembered (the oldest quiet marks go first)


@dataclass
class _Lane:
    holder: object | None = None
    since: float = 0.0  # monotonic, when the exchange in progress started
    quiet_until: datetime | None = None
    quiet_since: datetime | None = None  # the first of the no-answers in a row
    quiet_by: object | None = None
    why: str = ""
    waiting: int = 0  # approvals waiting for the exchange in progress (at most one)
    free: threading.Condition = field(default_factory=threading.Condition)


class RelayLanes:
    """One lane per VM's relay, on one host (functions.pipeline.context.Pipeline)."""

    def __init__(
        self,
        patience: float = PATIENCE,
        cooldown: timedelta = COOLDOWN,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.patience = patience
        self.cooldown = cooldown
        self.monotonic = monotonic
        self._lock = threading.Lock()
        self._lanes: dict[str, _Lane] = {}
        self.not_asked = 0  # approvals not asked (counted, for the bench and the logs)

    def _lane(self, vm: str) -> _Lane:
        with self._lock:
            lane = self._lanes.get(vm.casefold())
            if lane is None:
                if len(self._lanes) >= MAX_LANES:
                    idle = [k for k, v in self._lanes.items() if v.holder is None]
                    for key in idle[: max(1, len(idle) // 2)]:
                        del self._lanes[key]
                lane = self._lanes[vm.casefold()] = _Lane()
            return lane

    def enter(self, vm: str, holder: object, now: datetime) -> str | None:
        """Take the VM's lane for one exchange: None, or why its relay is not asked now.
        `holder`: the approval attempt (its own retries are never refused). One other
        approval may wait for the exchange in progress, for what is left of PATIENCE."""
        lane = self._lane(vm)
        with lane.free:
            quiet = self._quiet(lane, holder, now)
            if quiet is None and lane.holder is not None and lane.holder is not holder:
                if lane.waiting:
                    return self._refused("its relay is busy with another approval")
                lane.waiting += 1
                try:
                    while lane.holder is not None and lane.holder is not holder:
                        left = lane.since + self.patience - self.monotonic()
                        if left <= 0:
                            return self._refused("its relay is busy with another approval")
                        lane.free.wait(left)
                finally:
                    lane.waiting -= 1
                quiet = self._quiet(lane, holder, now)
            if quiet is not None:
                return self._refused(quiet)
            lane.holder, lane.since = holder, self.monotonic()
            return None

    @staticmethod
    def _quiet(lane: _Lane, holder: object, now: datetime) -> str | None:
        until = lane.quiet_until
        if until is None or lane.quiet_by is holder or now >= until:
            return None
        return f"its relay did not answer ({lane.why}); asked again after {until:%H:%M:%S}"

    def closed(
        self, names: list[str], now: datetime, handover: timedelta | None = None
    ) -> str | None:
        """Why none of these VMs' relays would be asked now (each silent lately, or busy
        with an exchange older than PATIENCE), or None: an approval may find one. Read
        before any row is claimed or written, so an item of a VM whose relay is closed
        costs its worker next to nothing. `handover`: a relay silent for that long no
        longer closes anything (ARM's turn: the approval goes on to it)."""
        if not names:
            return None
        reasons = []
        for name in names:
            with self._lock:
                lane = self._lanes.get(name.casefold())
            if lane is None:
                return None
            with lane.free:
                since = lane.quiet_since
                if handover is not None and since is not None and now >= since + handover:
                    return None
                if lane.quiet_until is not None and now < lane.quiet_until:
                    reasons.append(f"{name}'s relay did not answer ({lane.why})")
                elif lane.holder is not None and (
                    lane.waiting or self.monotonic() - lane.since > self.patience
                ):
                    reasons.append(f"{name}'s relay is busy with another approval")
                else:
                    return None
        return self._refused("; ".join(reasons))

    def leave(self, vm: str, holder: object, now: datetime, answered: bool, why: str) -> None:
        """The exchange ended; `answered`: the relay gave an HTTP answer (any status)."""
        lane = self._lane(vm)
        with lane.free:
            if lane.holder is holder:
                lane.holder = None
            if answered:
                lane.quiet_until, lane.quiet_by, lane.why = None, None, ""
                lane.quiet_since = None
            else:
                lane.quiet_until, lane.quiet_by, lane.why = now + self.cooldown, holder, why
                lane.quiet_since = lane.quiet_since or now
            lane.free.notify_all()

    def _refused(self, why: str) -> str:
        with self._lock:
            self.not_asked += 1
        return why
