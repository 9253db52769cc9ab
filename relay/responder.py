"""The readiness responder: `python3 scheduled-events-relay.pyz ready` (issue 44).

Why a process of its own: a load balancer takes a VM out of rotation when its probe fails,
and a probe served by the relay failed whenever the relay did not run (a crash, a restart,
an upgrade, an uninstall, an OOM kill). This responder is small and does one thing, on a
port systemd holds (scheduled-events-relay-ready.socket: root binds it at boot, no local
user can take it, and probes made while the responder restarts wait in the socket's queue).
It answers `GET /readyz` from what the relay published (relay.ready, `--drain-file`):

- 503 while the relay's drain file says so and has not expired (`until`: the relay renews
  it every few seconds, so the drain of a relay that died or hangs ends by itself within
  relay.ready.DRAIN_TTL), and with `--app-health URL` (mode "compose") whatever the
  application's own health check says otherwise: one probe serves both;
- 200 in every other case: no relay, a stopped relay (its runtime directory, with the file,
  goes with it), a relay that cannot start, an unreadable or expired file. It fails open.

With `--signal-file PATH` (mode "file") it also keeps PATH present exactly while the drain
holds, for an application or proxy that reads it (nginx `if (-f ...)`, docs/readiness.md):
absent file = serving, so an absent relay or responder is serving too.

Probe knowledge (relay contract 2): a probe from Azure's source, 168.63.129.16 (Learn,
load-balancer-custom-probe-overview), is written to `--status` (`probe_at`, with the drain
means offered), which the relay reads for its heartbeats (relay.drainfacts). Every answer
is one line of `timeline.jsonl` beside it (time, status, who asked, why), the probe's
history as the VM saw it, kept to about 256 KiB (one older file).

Heartbeat facts (relay contract 2, `drain_facts` below, read by the relay, not the
responder): What a heartbeat says about draining (relay contract 2, issue 44): `probe_at`, `drain`.

The app's readiness drain works only where a load balancer really probes the VM: without
one, a 503 on /readyz takes nothing out of rotation and the drain is a wait. So the relay
reports, signed in its liveness row (relay.liveness), when Azure's probe last reached the
readiness endpoint (`probe_at`, unix seconds, 0 = never since the endpoint started) and
which drain means it offers (`drain`: "hook" for the operator's hook scripts, "readiness"
for a /readyz it can turn 503, "file" for the drain-signal file the application or its
proxy reads), and the app decides from that which drain to count on.

Azure's probes come from 168.63.129.16 (Learn, load-balancer-custom-probe-overview: "The
load balancer health probe originates from the IP address 168.63.129.16"), so only a probe
from that address counts. The readiness responder (relay.responder, a process of its own
that outlives the relay) records its probes in its status file, which is read here at each
heartbeat; a relay serving /readyz itself (--ready-listen) records them in relay.ready.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

from relay import __version__, logs
from relay.callback_http import CallbackServer, inherited
from relay.logs import event
from relay.outbox import atomic_write

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

log = logging.getLogger("relay.responder")

PATH = "/readyz"
AZURE_PROBE_SOURCE = "168.63.129.16"
DEFAULT_STATUS = Path("/run/scheduled-events-relay-ready/status.json")

DEFAULT_DRAIN_FILE = Path("/run/scheduled-events-relay/drain.json")
TIMELINE_BYTES = 256 * 1024
APP_TIMEOUT = 2.0  # seconds the application's health check may take (probes time out too)
MAX_AHEAD = 3600  # a drain file valid further ahead than this is not the relay's: ignored


class Responder:
    """What the probe hears. `health(peer)` is the server's GET handler."""

    def __init__(
        self,
        drain_file: Path = DEFAULT_DRAIN_FILE,
        status: Path = DEFAULT_STATUS,
        app_health: str | None = None,
        signal_file: Path | None = None,
        probe_source: str = AZURE_PROBE_SOURCE,
    ) -> None:
        if app_health and not app_health.startswith(("http://", "https://")):
            raise ValueError(f"--ready-app-health must be an http(s) URL, not {app_health!r}")
        self.drain_file, self.status, self.app_health = drain_file, status, app_health
        self.signal_file, self.probe_source = signal_file, probe_source
        self.timeline = status.with_name("timeline.jsonl")
        self.probe_at = 0
        self._lock = threading.Lock()
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        self.means = ["readiness", "file"] if signal_file else ["readiness"]
        self.write_status()

    def drained(self, now: float) -> dict[str, Any] | None:
        """The relay's published drain while it holds, else None (fail open)."""
        try:
            data = json.loads(self.drain_file.read_bytes()[:65536])
            until, events = data["until"], data["events"]
            if not (isinstance(until, (int, float)) and now < until <= now + MAX_AHEAD):
                return None
            if not isinstance(events, list) or not events:
                return None
            return {"reason": str(data.get("reason") or "draining"), "events": events}
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def health(self, peer: str = "") -> tuple[int, dict[str, Any]]:
        now = time.time()
        if peer.rpartition(":")[2] == self.probe_source:  # ::ffff:168.63.129.16 too
            self.probe_at = int(now)
            self.write_status()
        drain = self.drained(now)
        if drain is not None:
            status, body = 503, {"ready": False, **drain}
        elif self.app_health:
            code = self._app_status()
            ok = 200 <= code < 300
            status, body = (200 if ok else 503), {"ready": ok, "app": code}
            if not ok:
                body["reason"] = "application unhealthy"
        else:
            status, body = 200, {"ready": True}
        self._record(now, peer, status, body.get("reason"))
        self.sync_signal(drain)
        return status, body

    def _app_status(self) -> int:
        """The application's own health check's HTTP status (0: no answer in time)."""
        request = urllib.request.Request(str(self.app_health))  # noqa: S310 - an http(s) URL
        try:
            with self._opener.open(request, timeout=APP_TIMEOUT) as answer:
                return int(answer.status)
        except urllib.error.HTTPError as exc:
            return int(exc.code)
        except (OSError, ValueError):
            return 0

    def sync_signal(self, drain: dict[str, Any] | None) -> None:
        """The drain-signal file present exactly while the drain holds (mode "file")."""
        if self.signal_file is None:
            return
        try:
            if drain is None:
                self.signal_file.unlink(missing_ok=True)
            elif not self.signal_file.exists():
                atomic_write(self.signal_file, json.dumps(drain).encode() + b"\n", 0o644)
        except OSError as exc:
            event(log, logging.ERROR, "drain-signal file", error=str(exc))

    def write_status(self) -> None:
        body = {"probe_at": self.probe_at, "means": self.means}
        try:
            atomic_write(self.status, json.dumps(body).encode(), 0o644)
        except OSError as exc:
            event(log, logging.ERROR, "status file", error=str(exc))

    def _record(self, now: float, peer: str, status: int, reason: str | None) -> None:
        line = {"at": round(now, 3), "status": status, "peer": peer}
        if reason:
            line["reason"] = reason
        with self._lock:
            try:
                if self.timeline.exists() and self.timeline.stat().st_size > TIMELINE_BYTES:
                    self.timeline.replace(self.timeline.with_name("timeline.jsonl.1"))
                with self.timeline.open("a") as out:
                    out.write(json.dumps(line) + "\n")
            except OSError:
                pass  # the timeline is for reading; the answer matters more

    def watch(self, stop: threading.Event) -> None:
        """Keep the signal file true between probes too (a drain starts or expires)."""
        while not stop.wait(1.0):
            self.sync_signal(self.drained(time.time()))


def main(argv: list[str]) -> int:
    """`ready [--listen=HOST:PORT] [--drain-file=F] [--ready-status=F]
    [--ready-app-health=URL] [--ready-signal-file=F] [--probe-source=IP]`, each but --listen
    also RELAY_<NAME> (the relay's env files). Listens on the socket systemd passes
    (FileDescriptorName=ready), else on --listen."""
    names = ("drain_file", "ready_status", "ready_app_health", "ready_signal_file", "probe_source")
    options = {name: os.environ.get(f"RELAY_{name.upper()}", "") for name in names}
    options["listen"] = ""
    for arg in argv:
        flag, sep, value = arg.partition("=")
        name = flag[2:].replace("-", "_")
        if not flag.startswith("--") or name not in options or not sep:
            print(f"relay ready: unknown argument {arg!r} (--NAME=VALUE)", file=sys.stderr)
            return 2
        options[name] = value
    logs.configure(os.environ.get("RELAY_LOG_FORMAT") or "json")
    try:
        responder = Responder(
            Path(options["drain_file"] or DEFAULT_DRAIN_FILE),
            Path(options["ready_status"] or DEFAULT_STATUS),
            options["ready_app_health"] or None,
            Path(options["ready_signal_file"]) if options["ready_signal_file"] else None,
            options["probe_source"] or AZURE_PROBE_SOURCE,
        )
        sock = inherited("ready")
        if sock is None and not options["listen"]:
            raise ValueError("no socket from systemd (FileDescriptorName=ready) and no --listen")
        listen = options["listen"] or "0.0.0.0:0"
        server = CallbackServer(listen, responder, 0.5, 8, 5.0, PATH, read_only=True, sock=sock)
    except (ValueError, OSError) as exc:
        print(f"relay ready: {exc}", file=sys.stderr)
        return 2
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    server.start()
    event(log, logging.INFO, "readiness responder up", version=__version__, means=responder.means)
    responder.watch(stop)
    server.stop()
    return 0


def read_status(path: Path | None) -> dict[str, Any]:
    """The responder's status ({"probe_at": int, "means": [...]}), {} when there is none
    (no responder, or it stopped: its runtime directory goes with it) or it is unreadable."""
    if path is None:
        return {}
    try:
        data = json.loads(path.read_bytes()[:4096])
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def drain_facts(
    hooks: bool, serving: Any, publishing: bool, status: Path | None
) -> Callable[[], tuple[int, str]]:
    """(probe_at, drain) at each heartbeat. `serving`: relay.ready.Readiness when the relay
    serves /readyz itself, else None; `publishing`: the relay publishes its drain state for
    the responder (--drain-file), so the responder's means are this relay's too."""

    def facts() -> tuple[int, str]:
        found = read_status(status) if publishing else {}
        offered = found.get("means")
        offered = offered if isinstance(offered, list) else []
        probe_at = found.get("probe_at")
        if type(probe_at) is not int or probe_at < 0:  # not a bool, not a float
            probe_at = 0
        if serving is not None:
            probe_at = max(probe_at, serving.probe_at)
        means = ["hook"] if hooks else []
        if serving is not None or "readiness" in offered:
            means.append("readiness")
        if "file" in offered:
            means.append("file")
        return probe_at, ",".join(means)

    return facts
