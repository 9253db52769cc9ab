"""Per-VM bounds that must cost nothing to enforce (issue 27): a VM over one costs no Table
request at all, so flooding buys it nothing.

Heartbeats: one VM's liveness is worth one write a HEARTBEAT_MIN_SECONDS; more (a relay
looping, or a compromised one flooding the heartbeats queue) are counted and dropped in
memory before any Table request. Kept per worker: a VM's heartbeats arrive on its own
session, so one worker sees nearly all of them; at worst each worker writes one a minute.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from datetime import datetime, timedelta

HEARTBEAT_MIN_SECONDS = 60  # relays heartbeat every 300 s by default
REMEMBERED_VMS = 200_000  # bounds the memory: about 20 MB at most


class HeartbeatBound:
    """When each VM's heartbeat was last let through, on this worker."""

    def __init__(self, min_seconds: float = HEARTBEAT_MIN_SECONDS) -> None:
        self.interval = timedelta(seconds=min_seconds)
        self._last: OrderedDict[str, datetime] = OrderedDict()
        self._lock = threading.Lock()
        self.dropped = 0

    def allow(self, vm: str, now: datetime) -> bool:
        """True (and remembered) when `vm`'s last heartbeat let through is older than the
        interval; False, counted, otherwise."""
        key = vm.casefold()
        with self._lock:
            last = self._last.get(key)
            if last is not None and now - last < self.interval and now >= last:
                self.dropped += 1
                return False
            self._last[key] = now
            self._last.move_to_end(key)
            while len(self._last) > REMEMBERED_VMS:
                self._last.popitem(last=False)
            return True
