"""The load balancer's readiness probe (issue 33): `GET /readyz` on `--ready-listen`.

The process tests run the real pyz (also on Debian's Python 3.9: `make test-py39`) and ask
it with urllib, as a load balancer's prober would: 200 normally, 503 from the moment the
drain hook starts until the undrain hook has run, across a `kill -9` and restart, and with
`--unready-while-started` while an event of this VM is Started.
"""

from __future__ import annotations

import json
import socket
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest
import requests

from relay.callback_http import CallbackServer
from relay.ready import FILE_NAME, PATH, Readiness
from tests.conftest import free_port
from tests.relay.conftest import relay_key, sign_headers, vm_id_of, wait_for
from tests.relay.test_process import FAST


def probe(port: int, method: str = "GET", path: str = "/readyz") -> tuple[int, bytes]:
    """The probe server's answer to this request. Its busy answers, written by the
    listening thread without reading the request while the server's 4 handler threads are
    taken (a canned 503 with Retry-After, or the last readiness answer with Cache-Status),
    are asked again, as a prober's next interval would ask: on a loaded machine the
    handlers of the previous probes can still hold their slots for a moment after their
    answers arrived (a hog run of 93ea20e read the busy 503 where the test asked about
    DELETE). The readiness 503 carries neither header."""

    def answered() -> tuple[int, bytes] | None:
        request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method=method)
        try:
            with urllib.request.urlopen(request, timeout=5) as answer:  # noqa: S310 - loopback
                busy = answer.headers.get("Cache-Status") is not None
                return None if busy else (answer.status, answer.read())
        except urllib.error.HTTPError as exc:
            if exc.headers.get("Retry-After") or exc.headers.get("Cache-Status"):
                return None
            return exc.code, exc.read()

    return wait_for(answered, 30, 0.1)


def ready(port: int) -> dict[str, Any]:
    status, body = probe(port)
    return {"status": status, **json.loads(body)}


# ---------------------------------------------------------------- the state, in process


def test_a_drain_is_503_until_its_undo_and_survives_a_restart(tmp_path: Path) -> None:
    readiness = Readiness(tmp_path)
    assert readiness.health() == (200, {"ready": True})
    readiness.hook_started("drain", "EV-1", None)
    assert readiness.health() == (503, {"ready": False, "reason": "draining", "events": ["EV-1"]})
    again = Readiness(tmp_path)  # a restarted relay
    assert again.health()[0] == 503
    again.hook_finished("drain", "EV-1", None, "succeeded")  # the drain finishing: still out
    again.hook_started("other-undo", "ev-1", "snapshot")  # an undo of something else
    again.hook_finished("other-undo", "ev-1", "snapshot", "succeeded")
    assert again.health()[0] == 503
    again.hook_finished("undrain", "ev-1", "drain", "failed")  # undone, whatever its exit
    assert again.health() == (200, {"ready": True})
    assert Readiness(tmp_path).health() == (200, {"ready": True})


def test_an_unreadable_state_file_drains_nothing_and_says_so(tmp_path: Path, caplog: Any) -> None:
    """Issue 44: the relay never takes serving capacity away on its own; an unreadable
    state file (only the relay writes it, atomically) is its own fault, logged as an error,
    not a reason to take the VM out of rotation (it was 503 until removed)."""
    for content in ("{not json", '{"draining": ["EV-1"]}', '{"draining": {"ev": "x"}}'):
        (tmp_path / FILE_NAME).write_text(content)
        assert Readiness(tmp_path).health()[0] == 200, content
    assert "readiness.json unreadable: no drain" in caplog.text


def test_started_events_count_only_when_asked(tmp_path: Path) -> None:
    started = ("EV-2",)
    assert Readiness(tmp_path, lambda: started).health()[0] == 200
    assert Readiness(tmp_path, lambda: started, while_started=True).health() == (
        503,
        {"ready": False, "reason": "event started", "events": ["EV-2"]},
    )


# ---------------------------------------------------------------- the relay process


def hook_scripts() -> tuple[Path, Path]:
    """A drain that takes a moment (so the probe is seen 503 while it runs), an undrain."""
    scripts = Path(tempfile.mkdtemp(prefix="relay-ready-"))
    scripts.chmod(0o755)
    drain, undrain = scripts / "drain.sh", scripts / "undrain.sh"
    drain.write_text("#!/bin/sh\nsleep 1\necho drained\n")
    undrain.write_text("#!/bin/sh\necho undrained\n")
    for script in (drain, undrain):
        script.chmod(0o755)
    return drain, undrain


def signed_hook(port: int, key: bytes, payload: dict[str, Any]) -> dict[str, Any]:
    body = json.dumps({**payload, "Nonce": uuid.uuid4().hex}).encode()  # no replay
    headers = sign_headers(key, "POST", "/v1/hook", body, target=vm_id_of("vm0"))
    answer = requests.post(
        f"http://127.0.0.1:{port}/v1/hook", data=body, headers=headers, timeout=30
    )
    assert answer.status_code in (200, 202), answer.text
    return answer.json()


def test_the_relay_process_answers_the_probe_through_a_drain_and_a_restart(
    simulator: Any, relay_process: Any, hook_unit: Any, tmp_path: Path
) -> None:
    sim = simulator.sim
    sim.add_vm("vm0")
    callback, ready_port = free_port(), free_port()
    state = tmp_path / "state"
    drain, undrain = hook_scripts()
    args = [
        f"--imds-url={simulator.vm_url('vm0')}",
        f"--state-dir={state}",
        f"--forward=file:{tmp_path / 'forward'}",
        f"--callback-listen=127.0.0.1:{callback}",
        f"--ready-listen=127.0.0.1:{ready_port}",
        f"--hook=drain={drain}",
        f"--hook=undrain={undrain}",
        f"--hook-socket={hook_unit({'drain': drain, 'undrain': undrain})}",
        "--hook-wait=0",
        *FAST,
    ]
    relay = relay_process(*args)
    listening(relay)
    assert ready(ready_port) == {"status": 200, "ready": True}
    status, body = probe(ready_port, "HEAD")
    assert (status, body) == (200, b"")
    assert probe(ready_port, path="/healthz")[0] == 404
    assert probe(ready_port, path="/v1/health")[0] == 404  # the callback's, not here
    assert probe(ready_port, "POST")[0] == 405
    assert probe(ready_port, "DELETE")[0] == 405

    event_id = sim.add_event(event_type="Reboot", resources=["vm0"], notice=3600)
    key = relay_key(state)
    first = signed_hook(callback, key, {"Hook": "drain", "EventId": event_id})
    assert first["status"] == "running"  # --hook-wait=0: answered at once
    assert ready(ready_port) == {  # 503 while the drain script still runs
        "status": 503,
        "ready": False,
        "reason": "draining",
        "events": [event_id],
    }
    drained = {"Hook": "drain", "EventId": event_id}
    wait_for(lambda: signed_hook(callback, key, drained)["status"] == "succeeded", 30)
    relay.kill()  # kill -9, then a fresh relay on the same state directory
    assert probe_refused(ready_port)
    relay = relay_process(*args)
    listening(relay)
    assert ready(ready_port)["status"] == 503

    sim.remove_event(event_id)  # the reboot is over; the app undrains
    undo = {
        "Hook": "undrain",
        "EventId": event_id,
        "Undoes": "drain",
        "EventType": "Reboot",
        "EventStatus": "Completed",
    }
    wait_for(lambda: signed_hook(callback, key, undo)["status"] == "succeeded", 30)
    assert ready(ready_port) == {"status": 200, "ready": True}
    assert json.loads((state / FILE_NAME).read_text()) == {"draining": {}}, [
        (x.get("msg"), x.get("event_id"), x.get("error"), x.get("hook")) for x in relay.logs()
    ]
    messages = [x.get("msg") for x in relay.logs()]
    assert "readiness: undrained (undrain succeeded)" in messages


def listening(relay: Any, callback: bool = True) -> None:
    """Started: a loaded machine (CI, two cores) may take a while to start a relay. The
    callback listens a moment after the probe: a test that calls it waits for both."""
    wanted = {"readiness probe listening", *(["callback listening"] if callback else [])}
    wait_for(lambda: wanted <= {x.get("msg") for x in relay.logs()}, 30)


def probe_refused(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    except OSError:
        return True
    return False


def test_unready_while_an_event_of_this_vm_is_started(
    simulator: Any, relay_process: Any, tmp_path: Path
) -> None:
    sim = simulator.sim
    sim.add_vm("vm0", availability_set="as1")
    sim.add_vm("vm1", availability_set="as1")
    ready_port = free_port()
    relay = relay_process(
        f"--imds-url={simulator.vm_url('vm0')}",
        f"--state-dir={tmp_path / 'state'}",
        f"--forward=file:{tmp_path / 'forward'}",
        f"--ready-listen=127.0.0.1:{ready_port}",
        "--unready-while-started",
        *FAST,
    )
    listening(relay, callback=False)
    other = sim.add_event(event_type="Reboot", resources=["vm1"], notice=3600)
    sim.start_event(other)  # a set-mate's event: not this VM's
    own = sim.add_event(event_type="Freeze", resources=["vm0"], notice=3600)
    time.sleep(0.5)  # several polls
    assert ready(ready_port)["status"] == 200  # Scheduled is not Started
    sim.start_event(own)
    assert wait_for(lambda: ready(ready_port)["status"] == 503)
    assert ready(ready_port)["events"] == [own]
    sim.remove_event(own)
    wait_for(lambda: ready(ready_port)["status"] == 200)


def test_slow_senders_neither_block_the_probe_nor_the_poll_loop(
    simulator: Any, relay_process: Any, tmp_path: Path
) -> None:
    """Four connections trickling from one address hold every slot; a probe from another
    address (the load balancer's, 168.63.129.16 on Azure) still gets its answer, and IMDS
    is still polled meanwhile."""
    sim = simulator.sim
    sim.add_vm("vm0")
    ready_port = free_port()
    relay = relay_process(
        f"--imds-url={simulator.vm_url('vm0')}",
        f"--state-dir={tmp_path / 'state'}",
        f"--forward=file:{tmp_path / 'forward'}",
        f"--ready-listen=127.0.0.1:{ready_port}",
        *FAST,
    )
    listening(relay, callback=False)
    slow = []
    for _ in range(4):
        sock = socket.create_connection(
            ("127.0.0.1", ready_port), timeout=5, source_address=("127.0.0.2", 0)
        )
        sock.sendall(b"GET /readyz HTTP/1.1\r\n")  # and nothing more
        slow.append(sock)
    try:
        polled = sim.request_count("vm0")
        started = time.monotonic()
        assert ready(ready_port) == {"status": 200, "ready": True}
        assert time.monotonic() - started < 2
        wait_for(lambda: sim.request_count("vm0") >= polled + 5)
    finally:
        for sock in slow:
            sock.close()


def answering(port: int) -> None:
    """The callback listens (a loaded machine may take a while to start a relay)."""

    def up() -> bool:
        try:
            return requests.get(f"http://127.0.0.1:{port}/v1/health", timeout=2).status_code > 0
        except requests.ConnectionError:
            return False

    wait_for(up, 30)


def post_hook(port: int, key: bytes, payload: dict[str, Any]) -> requests.Response:
    body = json.dumps({**payload, "Nonce": uuid.uuid4().hex}).encode()
    headers = sign_headers(key, "POST", "/v1/hook", body, target=vm_id_of("vm0"))
    return requests.post(f"http://127.0.0.1:{port}/v1/hook", data=body, headers=headers, timeout=30)


def test_the_app_drains_through_the_probe_with_no_hook_configured(
    simulator: Any, relay_process: Any, tmp_path: Path
) -> None:
    """Issue 38: a relay with the probe on and no hook script of the operator's. The app's
    default drain asks for the built-in `readyz:drain` (503 from then, no script run) and
    undoes it with `readyz:undrain`; an undo of a drain that never ran here is the relay's
    404 "unknown EventId" (nothing to undo). Without the probe the built-ins are unknown."""
    sim = simulator.sim
    sim.add_vm("vm0")
    callback, ready_port = free_port(), free_port()
    state = tmp_path / "state"
    common = [
        f"--imds-url={simulator.vm_url('vm0')}",
        f"--state-dir={state}",
        f"--forward=file:{tmp_path / 'forward'}",
        f"--callback-listen=127.0.0.1:{callback}",
        *FAST,
    ]
    relay = relay_process(*common, f"--ready-listen=127.0.0.1:{ready_port}")
    listening(relay)
    answering(callback)
    key = relay_key(state)
    event_id = sim.add_event(event_type="Terminate", resources=["vm0"], notice=600)
    never = sim.add_event(event_type="Reboot", resources=["vm0"], notice=600)
    out = signed_hook(callback, key, {"Hook": "readyz:drain", "EventId": event_id})
    assert out == {
        "Hook": "readyz:drain",
        "EventId": event_id,
        "status": "succeeded",
        "exit_code": 0,
        "output_tail": "",
    }
    assert ready(ready_port) == {
        "status": 503,
        "ready": False,
        "reason": "draining",
        "events": [event_id],
    }
    sim.cancel_event(event_id)
    sim.cancel_event(never)
    undo = {"Hook": "readyz:undrain", "Undoes": "readyz:drain", "EventType": "Reboot"}
    nothing = post_hook(callback, key, {**undo, "EventId": never})
    assert (nothing.status_code, nothing.json()) == (404, {"error": "unknown EventId"})
    back = signed_hook(callback, key, {**undo, "EventId": event_id})
    assert back["status"] == "succeeded"
    assert ready(ready_port) == {"status": 200, "ready": True}
    relay.kill()

    relay_process(*common)  # the probe off: no built-in drain to ask for
    answering(callback)
    other = sim.add_event(event_type="Terminate", resources=["vm0"], notice=600)
    refused = post_hook(callback, key, {"Hook": "readyz:drain", "EventId": other})
    assert (refused.status_code, refused.json()) == (404, {"error": "unknown hook"})


def test_a_relay_killed_in_its_drain_script_reports_how_the_script_ended(
    simulator: Any, relay_process: Any, hook_unit: Any, tmp_path: Path
) -> None:
    """Issue 40 (the chaos suite's run): the relay is killed while its drain script runs;
    the script, in the hook unit, goes on to its end; the relay started again finds the
    run's lock still held, waits, and reports it succeeded (it said "failed: the relay
    restarted" on 2cd3d60, and the app held the event and paged drain_failed), and the VM
    stays out of rotation."""
    sim = simulator.sim
    sim.add_vm("vm0")
    callback, ready_port = free_port(), free_port()
    state = tmp_path / "state"
    slow = tmp_path / "drain.sh"
    slow.write_text('#!/bin/sh\nsleep 2\necho "drained $SCHEDULED_EVENT_ID"\n')
    slow.chmod(0o755)
    args = [
        f"--imds-url={simulator.vm_url('vm0')}",
        f"--state-dir={state}",
        f"--forward=file:{tmp_path / 'forward'}",
        f"--callback-listen=127.0.0.1:{callback}",
        f"--ready-listen=127.0.0.1:{ready_port}",
        f"--hook=drain={slow}",
        f"--hook-socket={hook_unit({'drain': slow})}",
        "--hook-wait=0",
        *FAST,
    ]
    relay = relay_process(*args)
    listening(relay)
    event_id = sim.add_event(event_type="Reboot", resources=["vm0"], notice=3600)
    key = relay_key(state)
    drained = {"Hook": "drain", "EventId": event_id}
    assert signed_hook(callback, key, drained)["status"] == "running"
    time.sleep(0.5)
    relay.kill()  # kill -9 in the middle of the script
    relay = relay_process(*args)
    listening(relay)

    def ended() -> Any:
        # The restarted relay may still be binding its callback under a loaded machine:
        # a refused connection is "not yet", not the answer.
        try:
            answer = signed_hook(callback, key, drained)
        except requests.ConnectionError:
            return None
        return answer if answer["status"] != "running" else None

    final = wait_for(ended, 30)
    assert (final["status"], final["exit_code"]) == ("succeeded", 0), final
    assert final["output_tail"] == f"drained {event_id}\n"
    assert ready(ready_port)["status"] == 503  # drained: out of rotation until the undrain


def test_a_built_in_hook_needs_no_hook_unit(simulator: Any, tmp_path: Path) -> None:
    """Where the hook unit is missing (not installed, its socket stopped), the operator's
    scripts fail saying why, but the built-in drain runs no script, so the app can still
    take the VM out."""
    from relay.callback import CallbackApp
    from relay.hooks import HookRunner
    from relay.imds import ImdsClient
    from relay.keystore import KeyStore

    sim = simulator.sim
    sim.add_vm("vm0")
    event_id = sim.add_event(event_type="Terminate", resources=["vm0"], notice=600)
    drain, _ = hook_scripts()
    readiness = Readiness(tmp_path / "state")
    runner = HookRunner(
        {"drain": drain, **Readiness.hooks},
        tmp_path / "state",
        timeout=5,
        vm_name="vm0",
        socket=str(tmp_path / "no-hook-unit.sock"),
        observer=readiness,
    )
    app = CallbackApp(
        KeyStore(tmp_path / "keys"),
        vm_id_of("vm0"),
        "vm0",
        ImdsClient(simulator.vm_url("vm0")),
        runner,
    )
    status, answer = app.hook({"Hook": "drain", "EventId": event_id})
    assert (status, answer["status"]) == (200, "failed")
    assert answer["output_tail"].startswith("cannot run the hook through")
    other = sim.add_event(event_type="Terminate", resources=["vm0"], notice=600)
    status, answer = app.hook({"Hook": "readyz:drain", "EventId": other})
    assert (status, answer["status"], answer["exit_code"]) == (200, "succeeded", 0)
    assert readiness.health()[0] == 503


def test_only_azures_probe_source_is_recorded_as_a_probe(tmp_path: Path) -> None:
    """Contract 2 (issue 44): `probe_at` says a load balancer probes the VM; Learn
    (load-balancer-custom-probe-overview): probes originate from 168.63.129.16."""
    readiness = Readiness(tmp_path)
    assert readiness.probe_source == "168.63.129.16"
    for peer in ("10.0.0.5", "127.0.0.1", "168.63.129.160", "::1"):
        assert readiness.health(peer)[0] == 200
    assert readiness.probe_at == 0
    readiness.health("::ffff:168.63.129.16")  # an IPv4 probe on a dual-stack socket
    assert readiness.probe_at > 0
    readiness.probe_at = 0
    readiness.health("168.63.129.16")
    assert readiness.probe_at > 0


def test_the_probe_helper_asks_again_only_while_the_server_is_busy(tmp_path: Path) -> None:
    """`probe` above: the server's busy 503 (its 4 slots held, here by 4 connections that
    send nothing) is asked again until a slot is free; the readiness 503 is an answer."""
    readiness = Readiness(tmp_path)
    # The probe's server as Readiness.serve makes it, but for a read timeout of a minute
    # (not 5 s), so the held connections keep their slots however slow the machine is.
    server = CallbackServer(f"127.0.0.1:{free_port()}", readiness, 0.5, 4, 60.0, PATH, True)
    server.start()
    held = [socket.create_connection(("127.0.0.1", server.port), timeout=5) for _ in range(4)]
    try:
        wait_for(lambda: server.httpd.active == 4, 30)
        request = urllib.request.Request(f"http://127.0.0.1:{server.port}/readyz")
        with pytest.raises(urllib.error.HTTPError) as busy:
            urllib.request.urlopen(request, timeout=5)  # noqa: S310 - loopback
        assert busy.value.code == 503 and busy.value.headers.get("Retry-After") == "1"
        answers: list[tuple[int, bytes]] = []
        asking = threading.Thread(target=lambda: answers.append(probe(server.port)))
        asking.start()  # busy: it asks again...
        wait_for(lambda: server.httpd.refused_busy >= 2, 30)
        held.pop().close()  # ...until a slot comes free
        asking.join(60)
        assert [status for status, _ in answers] == [200]
        readiness.hook_started("drain", "EV-1", None)
        status, body = probe(server.port)
        assert status == 503 and json.loads(body)["reason"] == "draining"
    finally:
        for sock in held:
            sock.close()
        server.stop()


def busy_answer(port: int) -> tuple[int, dict[str, str], bytes]:
    """One request, answered whatever it is: status, headers, body."""
    request = urllib.request.Request(f"http://127.0.0.1:{port}/readyz")
    try:
        with urllib.request.urlopen(request, timeout=5) as answer:  # noqa: S310 - loopback
            return answer.status, dict(answer.headers), answer.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


def test_a_busy_probe_server_repeats_its_last_answer_instead_of_a_503(tmp_path: Path) -> None:
    """A load balancer reads any 503 as "out of rotation": on a starved VM whose 4 probe
    slots are taken, a canned busy 503 would take the VM out by itself. The busy answer is
    the last readiness answer, if given within REMEMBERED seconds, marked Cache-Status; a
    drain in progress stays 503, and an old or no answer is the busy 503.
    Fails on c465741 (a busy 503 where the VM was ready)."""
    from relay import callback_http

    readiness = Readiness(tmp_path)
    server = CallbackServer(f"127.0.0.1:{free_port()}", readiness, 0.5, 4, 60.0, PATH, True)
    server.start()
    held: list[socket.socket] = []

    def hold_every_slot() -> None:
        # The last probe's handler can hold its slot a moment after its answer arrived
        # (a hog run of 40a7908 saw a fifth connection refused): wait for it to let go.
        wait_for(lambda: server.httpd.active == 0, 30)
        held.extend(socket.create_connection(("127.0.0.1", server.port), 5) for _ in range(4))
        wait_for(lambda: server.httpd.active == 4, 30)

    def free_every_slot() -> None:
        while held:
            held.pop().close()
        wait_for(lambda: server.httpd.active == 0, 30)

    try:
        assert probe(server.port)[0] == 200
        hold_every_slot()
        status, headers, body = busy_answer(server.port)
        assert (status, json.loads(body)) == (200, {"ready": True})
        assert headers["Cache-Status"] == "scheduled-events-relay; hit"
        free_every_slot()
        readiness.hook_started("drain", "EV-1", None)
        assert probe(server.port)[0] == 503  # the drain's answer, given by a handler
        hold_every_slot()
        status, headers, body = busy_answer(server.port)
        assert status == 503 and json.loads(body)["events"] == ["EV-1"]
        assert "Retry-After" not in headers and "Cache-Status" in headers
        # An answer older than REMEMBERED is not repeated: the canned busy 503.
        last = server.httpd.last_answer
        assert last is not None
        server.httpd.last_answer = (last[0] - callback_http.REMEMBERED, *last[1:])
        status, headers, body = busy_answer(server.port)
        assert status == 503 and headers["Retry-After"] == "1"
        assert json.loads(body) == {"error": "too many concurrent requests; try again shortly"}
    finally:
        free_every_slot()
        server.stop()
