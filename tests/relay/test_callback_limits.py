"""The callback server's bounds, over real sockets: a slot cap and a whole-request deadline.

A flood of connections, or senders that trickle bytes, must neither start unbounded threads
on the VM nor keep a signed approval out for longer than the read timeout, and the relay
must keep polling IMDS throughout.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from relay.callback import CallbackApp, CallbackServer
from relay.imds import ImdsClient
from tests.conftest import free_port
from tests.relay.conftest import (
    KEY,
    VM0_ID,
    FixedKeys,
    json_files,
    relay_key,
    sign_headers,
    wait_for,
)

CAP = 2
READ_TIMEOUT = 0.5
PARTIAL_HEADERS = b"POST /v1/start HTTP/1.1\r\nHost: relay\r\n"


@pytest.fixture
def serve(simulator: Any) -> Iterator[Callable[[float], CallbackServer]]:
    simulator.sim.add_vm("vm0")
    started: list[CallbackServer] = []

    def start(read_timeout: float) -> CallbackServer:
        app = CallbackApp(
            FixedKeys(), VM0_ID, "vm0", ImdsClient(simulator.vm_url("vm0"), timeout=1.0)
        )
        server = CallbackServer(
            "127.0.0.1:0", app, poll_interval=0.05, max_concurrent=CAP, read_timeout=read_timeout
        )
        started.append(server.start())
        return server

    try:
        yield start
    finally:
        for server in started:
            server.stop()


@pytest.fixture
def relay(serve: Callable[[float], CallbackServer]) -> CallbackServer:
    return serve(READ_TIMEOUT)


def connect(port: int, first: bytes = PARTIAL_HEADERS) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    if first:
        sock.sendall(first)
    return sock


def read_all(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes (a reset counts as closed)."""
    data = b""
    try:
        while chunk := sock.recv(4096):
            data += chunk
    except ConnectionResetError:
        pass
    return data


def hold_every_slot(server: CallbackServer, port: int) -> list[socket.socket]:
    held = [connect(port) for _ in range(CAP)]
    wait_for(lambda: server.httpd.active == CAP)
    return held


def signed_start(port: int, event_id: str, key: bytes = KEY) -> requests.Response:
    body = json.dumps({"EventIds": [event_id], "Nonce": uuid.uuid4().hex}).encode()
    headers = sign_headers(key, "POST", "/v1/start", body)
    url = f"http://127.0.0.1:{port}/v1/start"
    return requests.post(url, data=body, headers=headers, timeout=5)


def start_until_served(port: int, event_id: str, key: bytes = KEY) -> requests.Response:
    """Retry as the Functions do: a 503 or a dropped connection means try again."""

    def attempt() -> requests.Response | None:
        try:
            response = signed_start(port, event_id, key)
        except requests.ConnectionError:
            return None
        return response if response.status_code != 503 else None

    return wait_for(attempt, timeout=10, interval=0.05)


def test_beyond_the_cap_each_connection_gets_a_503_and_no_thread(serve: Any) -> None:
    relay = serve(30.0)  # the held connections outlast the test; closing them frees the slots
    held = hold_every_slot(relay, relay.port)
    threads = threading.active_count()
    extra = [connect(relay.port, first=b"") for _ in range(20)]
    answers = [read_all(sock) for sock in extra]
    assert threading.active_count() <= threads  # refused in the listening thread
    assert relay.httpd.active == CAP
    assert relay.httpd.refused_busy == 20
    for answer in answers:
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.0 503 "), answer
        assert b"Retry-After: 1" in head
        assert json.loads(body) == {"error": "too many concurrent requests; try again shortly"}
    for sock in extra + held:
        sock.close()
    wait_for(lambda: relay.httpd.active == 0)


def test_a_signed_request_is_served_once_the_slow_senders_time_out(
    simulator: Any, relay: CallbackServer
) -> None:
    sim = simulator.sim
    event_id = sim.add_event(event_type="Freeze", resources=["vm0"], notice=3600)
    held = hold_every_slot(relay, relay.port)
    with contextlib.suppress(requests.ConnectionError):  # refused or dropped while held
        assert signed_start(relay.port, event_id).status_code == 503
    assert sim.approvals == []
    response = start_until_served(relay.port, event_id)  # the held sockets stay open
    assert response.status_code == 200, response.text
    assert [a.event_id for a in sim.approvals] == [event_id]
    for sock in held:
        assert read_all(sock) == b""  # cut off at the deadline, no answer
        sock.close()


def test_a_sender_trickling_bytes_is_cut_off_at_the_read_timeout(relay: CallbackServer) -> None:
    sock = connect(relay.port, first=b"")
    started = time.monotonic()
    closed = False
    try:
        for byte in PARTIAL_HEADERS * 50:  # a byte every 20 ms: each read is quick
            sock.sendall(bytes([byte]))
            time.sleep(0.02)
            sock.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                closed = sock.recv(1) == b""
            sock.setblocking(True)
            if closed:
                break
    except (BrokenPipeError, ConnectionResetError):
        closed = True
    elapsed = time.monotonic() - started
    sock.close()
    assert closed, "the server kept a trickling connection open"
    assert elapsed >= READ_TIMEOUT
    wait_for(lambda: relay.httpd.active == 0)


def test_a_body_that_stalls_gets_408_and_approves_nothing(
    simulator: Any, relay: CallbackServer
) -> None:
    sim = simulator.sim
    event_id = sim.add_event(event_type="Freeze", resources=["vm0"], notice=3600)
    body = json.dumps({"EventIds": [event_id]}).encode()
    signed = sign_headers(KEY, "POST", "/v1/start", body)
    head = (
        "POST /v1/start HTTP/1.1\r\nHost: relay\r\n"
        + "".join(f"{k}: {v}\r\n" for k, v in signed.items())
        + f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    sock = connect(relay.port, first=head + body[:10])  # the rest never comes
    answer = read_all(sock)
    sock.close()
    status, _, rest = answer.partition(b"\r\n")
    assert status.startswith(b"HTTP/1.0 408 "), answer
    assert json.loads(rest.partition(b"\r\n\r\n")[2]) == {"error": "request not received in time"}
    assert sim.approvals == []


def test_the_relay_keeps_polling_while_its_callback_is_flooded(
    simulator: Any, relay_process: Any, tmp_path: Path
) -> None:
    sim = simulator.sim
    sim.add_vm("vm0")
    port, forward = free_port(), tmp_path / "forward"
    relay = relay_process(
        f"--imds-url={simulator.vm_url('vm0')}",
        f"--state-dir={tmp_path / 'state'}",
        f"--forward=file:{forward}",
        f"--callback-listen=127.0.0.1:{port}",
        "--callback-max-concurrent=2",
        "--callback-read-timeout=2",
        "--poll-interval=0.05",
    )
    wait_for(lambda: json_files(forward))
    wait_for(lambda: any(x.get("msg") == "callback listening" for x in relay.logs()))
    held = [connect(port) for _ in range(2)]  # take both slots and send no more
    flood = [connect(port, first=b"") for _ in range(10)]  # accepted after them: refused
    answers = [read_all(sock) for sock in flood]
    assert all(a.startswith(b"HTTP/1.0 503 ") for a in answers), answers
    event_id = sim.add_event(event_type="Freeze", resources=["vm0"], notice=3600)
    forwarded = wait_for(lambda: [p for p in json_files(forward) if event_id in p.read_text()])
    assert forwarded  # polled and forwarded while the callback was saturated
    response = start_until_served(port, event_id, relay_key(tmp_path / "state"))
    assert response.status_code == 200, response.text
    assert [a.event_id for a in sim.approvals] == [event_id]
    for sock in held + flood:
        sock.close()
    busy = [x for x in relay.logs() if x.get("kind") == "busy"]
    assert len(busy) == 1 and busy[0]["max_concurrent"] == 2  # once per streak, not per hit
    assert relay.stop() == 0


def answer_to(port: int, request: bytes) -> tuple[int, dict[str, Any]]:
    sock = connect(port, first=b"")
    with contextlib.suppress(OSError):  # the server may answer before it has read it all
        sock.sendall(request)
    data = read_all(sock)
    sock.close()
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.0 "), data[:200]
    return int(head.split()[1]), json.loads(body)


@pytest.mark.parametrize(
    ("request_bytes", "status", "reason"),
    [
        (
            b"POST /v1/start HTTP/1.1\r\nHost: relay\r\nX-Relay-Target: a\r\n b\r\n\r\n",
            400,
            "folded",
        ),
        (b"POST /v1/start HTTP/1.1\r\nHost: relay\r\n\tfolded\r\n\r\n", 400, "folded"),
        (b"POST /v1/start HTTP/1.1\r\nX-Big: " + b"a" * 70_000 + b"\r\n\r\n", 431, "too long"),
        (
            b"POST /v1/start HTTP/1.1\r\n"
            + b"".join(b"X-H%d: v\r\n" % i for i in range(200))
            + b"\r\n",
            431,
            "header lines",
        ),
        (b"GET /" + b"a" * 70_000 + b" HTTP/1.1\r\n\r\n", 414, "request line too long"),
        (b"NONSENSE\r\n\r\n", 400, "bad request line"),
        (b"POST /v1/start HTTP/1.1\r\nno colon here\r\n\r\n", 400, "malformed header"),
    ],
    ids=[
        "obs-fold-space",
        "obs-fold-tab",
        "70k-header",
        "200-headers",
        "long-line",
        "junk",
        "colon",
    ],
)
def test_malformed_http_gets_an_answer_not_a_silent_close(
    relay: CallbackServer, request_bytes: bytes, status: int, reason: str
) -> None:
    code, body = answer_to(relay.port, request_bytes)
    assert code == status and reason in body["error"], (code, body)
