"""StartRequests at most once per attempt (issue 31): the /v1/start answers IMDS accepted.

The app sends a stable `AttemptId` with each /v1/start (the same one for the same VM and
event, also after a crash of the function app and a redelivery). If the relay's 200 never
reaches the app (a crash after it, a lost response), the app asks again, and without this
the relay would POST StartRequests to IMDS a second time. So the relay remembers, by
AttemptId, the answers whose StartRequests IMDS accepted (200), and answers a repeat with
the same result, marked `"repeated": true`, without asking IMDS again (nor reading it: the
event may have Started since, which would otherwise be a 409 the app cannot count as an
approval). A failure (IMDS 5xx, refused, unreadable) is not remembered, so a genuine retry
goes through. Requests with an AttemptId are handled one at a time (under `lock`), so two
with the same one cannot both reach IMDS; approvals are rare, each bounded by IMDS timeouts.

Bounded: the newest `limit` (256) ids, each forgotten a day after IMDS accepted it, in
`STATE_DIR/start-attempts.json` (written atomically before the 200 is sent), so a relay
restart keeps them. The one window left: a relay crash between IMDS's 200 and that write;
a repeat then POSTs again, which IMDS answers 200 without effect (already approved).
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path

from relay.logs import event
from relay.outbox import atomic_write

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

log = logging.getLogger("relay.callback")

FILE_NAME = "start-attempts.json"
LIMIT = 256
TTL_SECONDS = 86400.0
# 1..128 letters, digits and `_.:-`: what may appear in logs and the file.
valid_attempt_id = re.compile(r"[\w.:-]{1,128}", re.ASCII).fullmatch


class StartLog:
    def __init__(
        self,
        state_dir: Path,
        limit: int = LIMIT,
        ttl: float = TTL_SECONDS,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.path = state_dir / FILE_NAME
        self.limit, self.ttl, self._clock = limit, ttl, clock
        self.lock = threading.Lock()  # held by a /v1/start with an AttemptId, throughout
        self._done = self._load()

    def _load(self) -> dict[str, dict[str, Any]]:
        try:
            data = json.loads(self.path.read_bytes())
            return {k: v for k, v in data.items() if isinstance(v, dict) and "at" in v}
        except FileNotFoundError:
            return {}
        except (OSError, ValueError, AttributeError) as exc:
            # Losing it can only cost a second StartRequests, which IMDS takes as a no-op.
            event(log, logging.ERROR, "start attempts unreadable; starting afresh", error=str(exc))
            return {}

    def get(self, attempt_id: str) -> dict[str, Any] | None:
        """The remembered `{"at", "event_ids", "answer"}` of this id, unless expired."""
        entry = self._done.get(attempt_id)
        return entry if entry and entry.get("at", 0) + self.ttl > self._clock() else None

    def remember(self, attempt_id: str, event_ids: list[str], answer: dict[str, Any]) -> None:
        """IMDS accepted this attempt's StartRequests: keep it, durably if the disk allows
        (if not, in memory: the error is logged and the approval stands). Under `lock`."""
        now = self._clock()
        kept = sorted(
            ((k, v) for k, v in self._done.items() if v.get("at", 0) + self.ttl > now),
            key=lambda item: item[1]["at"],
        )
        self._done = dict(kept[max(0, len(kept) - self.limit + 1) :])
        self._done[attempt_id] = {"at": now, "event_ids": event_ids, "answer": answer}
        try:
            atomic_write(self.path, json.dumps(self._done).encode(), mode=0o600)
        except OSError as exc:
            event(log, logging.ERROR, "cannot record a start attempt", error=str(exc))

    def __len__(self) -> int:
        return len(self._done)
