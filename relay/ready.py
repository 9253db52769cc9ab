"""A load balancer's readiness probe (issue 33): `GET /readyz` on `--ready-listen`.

200 `{"ready": true}` normally; 503 `{"ready": false, "reason", "events"}` from the moment
a drain starts on this VM until it is undone, and, with `--unready-while-started`, while an
event naming this VM is Started. An Azure Load Balancer then takes the VM out of rotation
while it is drained (a scale-in, a reboot, an eviction) and puts it back after, with no
script of the operator's touching the load balancer (webdevops'
azure-scheduledevents-manager has the same idea as /readyz and /drainz).

A drain is a hook run on a signed /v1/hook that undoes nothing (the app's
`DRAIN__RELAY_HOOK`); it is undone when a hook run with `"Undoes": <that hook>` for the
same EventId finishes (the app's `UNDRAIN__RELAY_HOOK`, sent when the event is Completed or
Cancelled), whatever its exit: the event is over and a failed undrain is the app's to
report. With the probe on, two built-in hooks (no script, `hooks`) let the app drain
through it alone where no hook of the operator's applies (issue 38, `DRAIN__READINESS`):
`readyz:drain` (503 from then), and `readyz:undrain` with `"Undoes": "readyz:drain"`. Their
names have a `:`, which an operator's hook name cannot. relay.hooks calls `hook_started`
before a script can have any effect and `hook_finished` once it is over (or found
interrupted by a crash). The draining EventIds are kept in `STATE_DIR/readiness.json`,
written atomically before the hook runs, so a drain in progress is still 503 after a relay
restart; an unreadable file is 503 too (a drained VM must not get traffic back by accident)
until the file is removed.

The server is relay.callback_http's, bounded and in its own thread (never the poll loop's):
GET and HEAD on the one path, 404 elsewhere, 405 for other methods. The answer reads only
memory: the draining set and the Started EventIds the watcher noted at its last change.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path

from relay.callback_http import CallbackServer
from relay.drainfacts import AZURE_PROBE_SOURCE
from relay.logs import event
from relay.outbox import atomic_write

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

log = logging.getLogger("relay.ready")

PATH = "/readyz"
FILE_NAME = "readiness.json"


class Readiness:
    hooks = {"readyz:drain": None, "readyz:undrain": None}  # built in: relay.hooks

    def __init__(
        self,
        state_dir: Path,
        started: Callable[[], tuple[str, ...]] = tuple,
        while_started: bool = False,
        probe_source: str = AZURE_PROBE_SOURCE,
    ) -> None:
        self.path = state_dir / FILE_NAME
        self._started, self.while_started = started, while_started
        self._lock = threading.Lock()
        self.probe_source, self.probe_at = probe_source, 0
        self.draining: dict[str, list[str]] = {}  # casefolded EventId -> [EventId, hook]
        try:
            saved = json.loads(self.path.read_bytes())["draining"]
            self.draining = {k: [str(i), str(h)] for k, (i, h) in saved.items()}
        except FileNotFoundError:
            pass
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            event(log, logging.ERROR, "readiness.json unreadable: answering 503", error=str(exc))
            self.draining = {"": ["(unreadable)", ""]}

    def serve(self, address: str) -> CallbackServer:
        """The probe's own server: GET/HEAD on PATH only, 4 requests at once, 5 s each."""
        server = CallbackServer(address, self, 0.5, 4, 5.0, PATH, read_only=True)
        return server.start()

    def health(self, peer: str = "") -> tuple[int, dict[str, Any]]:
        """The probe's answer (the server's GET handler calls it with the caller's address:
        Azure's probe source is recorded as `probe_at`, relay.drainfacts)."""
        if peer.rpartition(":")[2] == self.probe_source:  # ::ffff:168.63.129.16 too
            self.probe_at = int(time.time())
        events, reason = sorted(v[0] for v in self.draining.values()), "draining"
        if not events and self.while_started:
            events, reason = list(self._started()), "event started"
        if events:
            return 503, {"ready": False, "reason": reason, "events": events}
        return 200, {"ready": True}

    def hook_started(self, name: str, event_id: str, undoes: str | None) -> None:
        if undoes is None:
            self._change(event_id, [event_id, name], "readiness: draining")

    def hook_finished(self, name: str, event_id: str, undoes: str | None, status: str) -> None:
        entry = self.draining.get(event_id.casefold())
        if undoes is not None and entry is not None and entry[1] == undoes:
            self._change(event_id, None, f"readiness: undrained ({name} {status})")

    def _change(self, event_id: str, entry: list[str] | None, message: str) -> None:
        with self._lock:
            draining = dict(self.draining)
            if entry is None:
                draining.pop(event_id.casefold(), None)
            else:
                draining[event_id.casefold()] = entry
            self.draining = draining  # one assignment: the probe never sees half a change
            try:
                atomic_write(self.path, json.dumps({"draining": draining}).encode())
            except OSError as exc:  # memory still says it; a restart may not
                event(log, logging.ERROR, "readiness: cannot record", error=str(exc))
        event(log, logging.INFO, message, event_id=event_id, draining=len(draining))
