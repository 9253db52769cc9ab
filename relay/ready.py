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
restart. An unreadable file is logged as an error and drains nothing: the relay never
takes serving capacity away on its own (issue 44).

Who answers the probe (issue 44). Installed by add-relay.sh, cloud-init or install.sh, the
relay does not: the readiness responder does (relay.responder, a process of its own on a
port systemd holds), so a relay restart, upgrade, crash loop or removal never closes the
probe's port. The relay only publishes what it wants the probe to say, in `--drain-file`
(/run/scheduled-events-relay/drain.json, its runtime directory: gone when the relay is
stopped, kept across restarts), with an expiry (`until`, DRAIN_TTL ahead) renewed every
few seconds while it runs: a relay that died or hangs stops renewing, and its drain ends
by itself. `--ready-listen` (the relay serving /readyz itself, for hosts without systemd
and tests) remains; its port closes whenever the relay stops.

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
from relay.logs import event
from relay.outbox import atomic_write
from relay.responder import AZURE_PROBE_SOURCE, PATH

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

log = logging.getLogger("relay.ready")

FILE_NAME = "readiness.json"
DRAIN_TTL = 60.0  # seconds a published drain outlives the relay that stopped renewing it


class Readiness:
    hooks = {"readyz:drain": None, "readyz:undrain": None}  # built in: relay.hooks

    def __init__(
        self,
        state_dir: Path,
        started: Callable[[], tuple[str, ...]] = tuple,
        while_started: bool = False,
        probe_source: str = AZURE_PROBE_SOURCE,
        publish: Path | None = None,
        ttl: float = DRAIN_TTL,
    ) -> None:
        self.path = state_dir / FILE_NAME
        self.publish, self.ttl = publish, ttl  # the drain file the responder reads
        self._started, self.while_started = started, while_started
        self._lock = threading.RLock()
        self.probe_source, self.probe_at = probe_source, 0
        self.draining: dict[str, list[str]] = {}  # casefolded EventId -> [EventId, hook]
        try:
            saved = json.loads(self.path.read_bytes())["draining"]
            self.draining = {k: [str(i), str(h)] for k, (i, h) in saved.items()}
        except FileNotFoundError:
            pass
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            event(log, logging.ERROR, "readiness.json unreadable: no drain", error=str(exc))

    def serve(self, address: str) -> CallbackServer:
        """The probe's own server: GET/HEAD on PATH only, 4 requests at once, 5 s each."""
        server = CallbackServer(address, self, 0.5, 4, 5.0, PATH, read_only=True)
        return server.start()

    def health(self, peer: str = "") -> tuple[int, dict[str, Any]]:
        """The probe's answer (the server's GET handler calls it with the caller's address:
        Azure's probe source is recorded as `probe_at`, relay.responder)."""
        if peer.rpartition(":")[2] == self.probe_source:  # ::ffff:168.63.129.16 too
            self.probe_at = int(time.time())
        return self.answer()

    def answer(self) -> tuple[int, dict[str, Any]]:
        events, reason = sorted(v[0] for v in self.draining.values()), "draining"
        if not events and self.while_started:
            events, reason = list(self._started()), "event started"
        if events:
            return 503, {"ready": False, "reason": reason, "events": events}
        return 200, {"ready": True}

    def publish_now(self) -> None:
        """Write what the probe should say, valid for `ttl` seconds, for the responder
        (relay.responder): world-readable, it holds EventIds only."""
        if self.publish is None:
            return
        with self._lock:  # one writer of the file at a time (the renewer, a change)
            _, body = self.answer()
            now = time.time()
            body.update(at=int(now), until=int(now + self.ttl))
            try:
                atomic_write(self.publish, json.dumps(body).encode(), 0o644)
            except OSError as exc:  # the responder then ends the drain when it expires
                event(log, logging.ERROR, "readiness: cannot publish", error=str(exc))

    def keep_publishing(self, stop: threading.Event) -> None:
        """Renew the published state every few seconds until `stop` (a thread of its own):
        a Started event appears, and a drain's expiry moves, without waiting for a change."""
        if self.publish is None:
            return

        def renew() -> None:
            while True:
                self.publish_now()
                if stop.wait(min(5.0, self.ttl / 3)):
                    return

        threading.Thread(target=renew, name="relay-drain-file", daemon=True).start()

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
            self.publish_now()
        event(log, logging.INFO, message, event_id=event_id, draining=len(draining))
