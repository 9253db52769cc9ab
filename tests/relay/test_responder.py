"""The relay never takes serving capacity away on its own (issue 44 item 1, issue 46 item 5).

On 2f59d6a the relay served /readyz itself, so a killed, stopped, upgrading or crash-looping
relay closed the probe's port and its load balancer took the VM out of rotation; and the
relay bound its ports itself, so between two of its starts any local user could take them.
Here the real pyz runs as it does on a VM: the readiness responder (`pyz ready`) and the
relay each get their listening socket from a holder playing systemd's socket units
(local.socket_units: the port bound once, passed as sd_listen_fds passes it, kept across
restarts), the relay publishes its drain in a file with an expiry, and a prober asks
/readyz every 50 ms for the whole test, recording every answer and every refusal.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import requests

from local.socket_units import command, hold
from relay.responder import drain_facts
from tests.needs import missing
from tests.relay.conftest import relay_command, relay_env, relay_key, wait_for
from tests.relay.test_process import FAST
from tests.relay.test_ready import signed_hook


def answering(port: int) -> None:
    """The relay serves its callback. On a held socket a connection is accepted by the
    kernel before the relay listens (it waits in the queue), so "not yet" is a timeout
    here, not a refusal."""

    def up() -> bool:
        try:
            return requests.get(f"http://127.0.0.1:{port}/v1/health", timeout=2).status_code > 0
        except requests.RequestException:
            return False

    wait_for(up, 60)


def probe(port: int) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/readyz")
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:  # noqa: S310 - loopback
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


class Prober:
    """Asks /readyz every 50 ms in a thread: every answer's status, or "refused"."""

    def __init__(self, port: int) -> None:
        self.port, self.seen = port, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            try:
                self.seen.append(probe(self.port)[0])
            except OSError:
                self.seen.append("refused")

    def stop(self) -> list[Any]:
        self._stop.set()
        self._thread.join(15)
        return self.seen


class Responder:
    """`pyz ready` on a held socket; `restart()` plays systemd's Restart=always."""

    def __init__(self, pyz: Path, sock: socket.socket, run: Path, *args: str) -> None:
        self.argv, self.fds = command(
            relay_command(
                pyz,
                "ready",
                f"--drain-file={run / 'drain.json'}",
                f"--ready-status={run / 'ready' / 'status.json'}",
                *args,
            ),
            {"ready": sock},
        )
        (run / "ready").mkdir(parents=True, exist_ok=True)
        self.log = run / "ready" / "responder.log"
        self.proc = self._start()

    def _start(self) -> subprocess.Popen:
        with self.log.open("ab") as log:
            return subprocess.Popen(
                self.argv, pass_fds=self.fds, env=relay_env(), stdout=log, stderr=log
            )

    def restart(self) -> None:
        self.proc.kill()
        self.proc.wait(10)
        self.proc = self._start()

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


@pytest.fixture
def held(relay_pyz: Path, tmp_path: Path) -> Iterator[Any]:
    """(start a responder with extra args, the ready port, the run directory)."""
    sock = hold()
    run = tmp_path / "run"
    started: list[Responder] = []

    def start(*args: str) -> Responder:
        started.append(Responder(relay_pyz, sock, run, *args))
        return started[-1]

    try:
        yield start, sock.getsockname()[1], run
    finally:
        for responder in started:
            responder.stop()
        sock.close()


def test_a_drain_outlives_a_relay_restart_and_ends_by_itself_when_the_relay_is_gone(
    simulator: Any, relay_process: Any, held: Any, tmp_path: Path
) -> None:
    """Killed (-9) and started again mid-drain, the relay keeps the VM drained; killed for
    good, its drain ends within its expiry (fail open) and the drain-signal file goes.
    The probe's port never refuses a connection, whatever the relay does."""
    start, port, run = held
    signal_file = run / "ready" / "draining"
    start(f"--ready-signal-file={signal_file}")
    prober = Prober(port)
    simulator.sim.add_vm("vm0")
    callback, state = hold(), tmp_path / "state"
    args = [
        f"--imds-url={simulator.vm_url('vm0')}",
        f"--state-dir={state}",
        f"--forward=file:{tmp_path / 'forward'}",
        f"--callback-listen=0.0.0.0:{callback.getsockname()[1]}",
        f"--drain-file={run / 'drain.json'}",
        "--drain-ttl=10",  # a restart fits in it (60 s on a VM), a test need not wait 60 s
        *FAST,
    ]
    relay = relay_process(*args, sockets={"callback": callback})
    answering(callback.getsockname()[1])
    wait_for(lambda: probe(port)[0] == 200, 10)
    event_id = simulator.sim.add_event(event_type="Reboot", resources=["vm0"], notice=3600)
    key = relay_key(state)
    drained = signed_hook(
        callback.getsockname()[1], key, {"Hook": "readyz:drain", "EventId": event_id}
    )
    assert drained["status"] == "succeeded"
    assert probe(port) == (503, {"ready": False, "reason": "draining", "events": [event_id]})
    wait_for(signal_file.exists, 5)

    relay.kill()  # a crash or an OOM kill; systemd starts it again
    killed = time.time()
    relay = relay_process(*args, sockets={"callback": callback})
    answering(callback.getsockname()[1])
    # The new relay renews the drain (the prober shows it never lapsed in between).
    wait_for(lambda: json.loads((run / "drain.json").read_text())["at"] > killed, 30)
    assert probe(port)[0] == 503 and signal_file.exists()

    relay.kill()  # and this time it stays dead
    wait_for(lambda: probe(port)[0] == 200, 30)
    wait_for(lambda: not signal_file.exists(), 5)
    wait_for(lambda: prober.seen[-1] == 200, 10)
    seen = prober.stop()
    changes = [s for i, s in enumerate(seen) if i == 0 or seen[i - 1] != s]
    assert changes == [200, 503, 200], changes  # no refusal, no flap while restarting
    callback.close()


def test_a_relay_that_cannot_start_or_is_stopped_changes_nothing(
    relay_process: Any, held: Any, tmp_path: Path
) -> None:
    """A relay exiting at once (a bad setting, an unusable state directory) or stopped:
    /readyz stays 200, and its port stays open."""
    start, port, run = held
    start()
    prober = Prober(port)
    wait_for(lambda: probe(port)[0] == 200, 10)
    blocked = tmp_path / "not-a-directory"
    blocked.write_text("")
    for _ in range(3):  # a crash loop
        failing = relay_process(
            f"--state-dir={blocked / 'state'}",
            "--forward=file:/nonexistent",
            f"--drain-file={run / 'drain.json'}",
        )
        assert failing.proc.wait(30) != 0
    count = len(prober.seen)
    wait_for(lambda: len(prober.seen) > count + 5, 10)
    seen = prober.stop()
    assert seen and set(seen) == {200}
    assert not (run / "drain.json").exists()


def test_a_responder_killed_comes_back_on_the_same_socket_and_no_probe_is_refused(
    held: Any,
) -> None:
    start, port, _run = held
    responder = start()
    prober = Prober(port)
    wait_for(lambda: len(prober.seen) > 5, 10)
    for _ in range(3):
        responder.restart()  # systemd's Restart=always; the socket unit keeps the port
        count = len(prober.seen)
        wait_for(lambda count=count: len(prober.seen) > count + 5, 20)
    seen = prober.stop()
    assert "refused" not in seen and set(seen) == {200}


class _App(BaseHTTPRequestHandler):
    status = 200

    def do_GET(self) -> None:
        self.send_response(type(self).status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


def test_compose_mode_answers_for_the_application_and_the_drain(held: Any) -> None:
    """Mode "compose": the load balancer's one probe asks /readyz, which is the
    application's own health check unless the relay drains; without the relay (the file
    gone or expired), the application alone decides."""
    start, port, run = held
    app = type("App", (_App,), {})
    server = ThreadingHTTPServer(("127.0.0.1", 0), app)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        start(f"--ready-app-health=http://127.0.0.1:{server.server_address[1]}/healthz")
        wait_for(lambda: probe(port)[0] == 200, 10)
        assert probe(port) == (200, {"ready": True, "app": 200})
        app.status = 500
        assert probe(port) == (503, {"ready": False, "app": 500, "reason": "application unhealthy"})
        app.status = 200
        drain = {"ready": False, "reason": "draining", "events": ["E1"], "until": time.time() + 2}
        (run / "drain.json").write_text(json.dumps(drain))
        assert probe(port) == (503, {"ready": False, "reason": "draining", "events": ["E1"]})
        wait_for(lambda: probe(port)[0] == 200, 10)  # expired: the relay is gone
        server.shutdown()
        server.server_close()
        status, body = probe(port)  # the application does not answer: unhealthy
        assert (status, body["app"]) == (503, 0)
    finally:
        server.server_close()


def test_only_the_probe_source_is_recorded_and_the_heartbeat_reports_it(held: Any) -> None:
    """Contract 2: `probe_at` is when Azure's probe, from 168.63.129.16 (Learn,
    load-balancer-custom-probe-overview), last reached the responder. Probes from
    elsewhere are answered and not counted. The relay reads the responder's status at each
    heartbeat (relay.responder)."""
    start, port, run = held
    status = run / "ready" / "status.json"
    azure_only = start()
    wait_for(lambda: probe(port)[0] == 200, 10)
    probe(port)
    assert json.loads(status.read_text())["probe_at"] == 0
    facts = drain_facts(False, None, True, status)
    assert facts() == (0, "readiness")
    azure_only.stop()
    start("--probe-source=127.0.0.1", f"--ready-signal-file={run / 'ready' / 'draining'}")
    before = int(time.time())
    wait_for(lambda: probe(port)[0] == 200 and json.loads(status.read_text())["probe_at"], 10)
    probe_at, means = facts()
    assert probe_at >= before and means == "readiness,file"
    assert drain_facts(True, None, False, status)() == (0, "hook")  # no drain file: not ours
    timeline = [
        json.loads(line) for line in (run / "ready" / "timeline.jsonl").read_text().splitlines()
    ]
    assert {"at", "status", "peer"} <= set(timeline[-1]) and timeline[-1]["status"] == 200


def test_a_local_user_cannot_take_the_relays_ports(
    simulator: Any, relay_process: Any, tmp_path: Path
) -> None:
    """Issue 46: the callback and probe ports were unprivileged and bound by the relay
    itself, so a local user could take them while the relay restarted. Held by a socket
    unit (root, from boot), the relay serves on the socket it is passed, and while it is
    down no other user can bind the port, on any address, whatever socket options."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        missing("needs root and setpriv (a squatter of another user)")
    callback = hold()
    port = callback.getsockname()[1]
    relay = relay_process(
        f"--state-dir={tmp_path / 'state'}",
        f"--forward=file:{tmp_path / 'forward'}",
        f"--callback-listen=0.0.0.0:{port}",
        f"--imds-url={simulator.vm_url('myVM')}",
        sockets={"callback": callback},
    )
    answering(port)  # served through the passed socket: the relay did not bind it
    relay.stop()
    squat = (
        "import socket,sys\n"
        "taken=[]\n"
        "for family,host in ((socket.AF_INET,'0.0.0.0'),(socket.AF_INET,'127.0.0.1'),"
        "(socket.AF_INET6,'::'),(socket.AF_INET6,'::1')):\n"
        " s=socket.socket(family)\n"
        " s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\n"
        " s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEPORT,1)\n"
        " try:\n"
        "  s.bind((host,int(sys.argv[1])));s.listen();taken.append(host)\n"
        " except OSError:pass\n"
        "print(','.join(taken))\n"
    )
    out = subprocess.run(
        [
            "setpriv",
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            sys.executable,
            "-I",
            "-c",
            squat,
            str(port),
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    )
    assert out.stdout.strip() == "", f"a local user bound {out.stdout.strip()}:{port}"
    callback.close()
