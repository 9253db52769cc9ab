"""Attack and oddity cases, against the real relay process (the pyz) over real sockets.

What a stock IMDS or a hostile neighbour on the VNet can send must never stop the relay,
turn into a 500, or keep a signed approval from another caller waiting.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import free_port
from tests.relay.conftest import (
    KEY,
    VM0_ID,
    json_files,
    relay_key,
    sign_headers,
    wait_for,
)

FAST = ["--poll-interval=0.05", "--imds-max-backoff=0.2", "--imds-timeout=2"]
# Times Python cannot hold once moved to UTC: past year 9999, before year 1.
FAR_FUTURE = "Fri, 31 Dec 9999 23:59:59 -0100"
FAR_PAST = "0001-01-01T00:00:00+01:00"  # ISO 8601, as Microsoft's mock writes times


class FixedImds:
    """A loopback IMDS serving whatever document the test sets (and recording approvals)."""

    def __init__(self) -> None:
        self.document: dict[str, Any] = {"DocumentIncarnation": 1, "Events": []}
        self.approvals: list[Any] = []
        imds = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _send(self, status: int, body: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:
                if self.headers.get("Metadata") != "true":
                    self._send(400, b"{}")
                elif self.path.startswith("/metadata/instance/compute"):
                    self._send(200, json.dumps({"name": "vm0", "vmId": VM0_ID}).encode())
                elif self.path.startswith("/metadata/attested/document"):
                    self._send(200, b'{"encoding": "pkcs7", "signature": "bm90LWNoZWNrZWQ="}')
                else:
                    self._send(200, json.dumps(imds.document).encode())

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                imds.approvals.append(json.loads(self.rfile.read(length)))
                self._send(200, b"")

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def imds() -> Iterator[FixedImds]:
    server = FixedImds()
    yield server
    server.stop()


def event(event_id: str, not_before: str, resources: tuple[str, ...] = ("vm0",)) -> dict:
    return {
        "EventId": event_id,
        "EventStatus": "Scheduled",
        "EventType": "Reboot",
        "ResourceType": "VirtualMachine",
        "Resources": list(resources),
        "NotBefore": not_before,
        "EventSource": "Platform",
        "DurationInSeconds": -1,
    }


def start_relay(relay_process: Any, imds: FixedImds, tmp_path: Path, *extra: str) -> Any:
    forward = tmp_path / "forward"
    port = free_port()
    relay = relay_process(
        f"--imds-url={imds.url}",
        f"--state-dir={tmp_path / 'state'}",
        f"--forward=file:{forward}",
        f"--callback-listen=127.0.0.1:{port}",
        *FAST,
        *extra,
    )
    relay.port = port
    relay.forward = forward
    wait_for(lambda: any(x.get("msg") == "callback listening" for x in relay.logs()))
    return relay


@pytest.fixture
def key(tmp_path: Path) -> Path:
    path = tmp_path / "callback.key"
    path.write_bytes(KEY)
    return path


def documents(forward: Path) -> list[dict[str, Any]]:
    return [json.loads(p.read_text())["document"] for p in json_files(forward)]


def test_times_python_cannot_hold_are_forwarded_and_polling_goes_on(
    imds: FixedImds, relay_process: Any, tmp_path: Path, key: Path
) -> None:
    relay = start_relay(relay_process, imds, tmp_path)
    wait_for(lambda: len(documents(relay.forward)) == 1)
    odd = {
        "DocumentIncarnation": 2,
        "Events": [event("FUTURE-1", FAR_FUTURE), event("PAST-1", FAR_PAST)],
    }
    imds.document = odd
    wait_for(lambda: len(documents(relay.forward)) == 2)
    assert documents(relay.forward)[1] == odd  # as IMDS wrote it
    imds.document = {"DocumentIncarnation": 3, "Events": []}
    wait_for(lambda: len(documents(relay.forward)) == 3)  # still polling
    assert relay.proc.poll() is None
    warned = [x for x in relay.logs() if "NotBefore" in x.get("msg", "")]
    assert sorted(x["event_id"] for x in warned) == ["FUTURE-1", "PAST-1"]  # once each

    imds.document = odd  # and such an event can still be approved
    body = json.dumps({"EventIds": ["FUTURE-1"], "Nonce": uuid.uuid4().hex}).encode()
    answer = post(
        relay.port,
        "/v1/start",
        body,
        sign_headers(relay_key(tmp_path / "state"), "POST", "/v1/start", body),
    )
    assert answer[0] == 200, answer
    assert imds.approvals == [{"StartRequests": [{"EventId": "FUTURE-1"}]}]
    assert relay.stop() == 0


def post(port: int, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, dict]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("POST", path, body=body, headers=headers)
        response = conn.getresponse()
        return response.status, json.loads(response.read() or b"{}")
    finally:
        conn.close()


def raw_request(port: int, head: bytes, body: bytes = b"") -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(head + body)
        data = b""
        while chunk := sock.recv(4096):
            data += chunk
    return data


@pytest.mark.parametrize(
    ("header", "value"),
    [
        ("Content-Length", "\u00b2"),  # superscript two: isdigit(), but int() refuses it
        ("Content-Length", "\u0661\u0662"),  # Arabic-Indic digits
        ("X-Relay-Timestamp", "\u00b9\u00b2\u00b3"),
        ("X-Relay-Timestamp", "\u0661\u0667\u0660\u0660\u0660\u0660\u0660\u0660\u0660\u0660"),
    ],
)
def test_non_ascii_digits_are_a_400_not_a_500(
    imds: FixedImds, relay_process: Any, tmp_path: Path, key: Path, header: str, value: str
) -> None:
    relay = start_relay(relay_process, imds, tmp_path)
    body = json.dumps({"EventIds": ["X"]}).encode()
    headers = {
        **sign_headers(relay_key(tmp_path / "state"), "POST", "/v1/start", body),
        "Content-Length": str(len(body)),
    }
    headers[header] = value
    head = "POST /v1/start HTTP/1.1\r\nHost: relay\r\n" + "".join(
        f"{k}: {v}\r\n" for k, v in headers.items()
    )
    answer = raw_request(relay.port, head.encode("utf-8") + b"\r\n", body)
    assert answer.startswith(b"HTTP/1.0 400 "), answer[:200]
    assert imds.approvals == []
    assert not [x for x in relay.logs() if x.get("level") == "error"]


def test_a_signed_body_nested_thousands_deep_is_a_400(
    imds: FixedImds, relay_process: Any, tmp_path: Path, key: Path
) -> None:
    relay = start_relay(relay_process, imds, tmp_path)
    for body in (b"[" * 8000 + b"]" * 8000, b'{"a":' * 2500 + b"1" + b"}" * 2500):
        status, answer = post(
            relay.port,
            "/v1/start",
            body,
            sign_headers(relay_key(tmp_path / "state"), "POST", "/v1/start", body),
        )
        assert status == 400, answer
        assert "nests too deeply" in answer["error"]
    assert relay.proc.poll() is None


def test_trickling_connections_from_one_address_cannot_hold_off_another_address(
    imds: FixedImds, relay_process: Any, tmp_path: Path, key: Path
) -> None:
    read_timeout = 4.0
    relay = start_relay(relay_process, imds, tmp_path, f"--callback-read-timeout={read_timeout}")
    # The listener can be up before the first poll: change the document only after it.
    wait_for(lambda: len(documents(relay.forward)) == 1)
    imds.document = {"DocumentIncarnation": 2, "Events": [event("E-1", "")]}
    wait_for(lambda: len(documents(relay.forward)) == 2)
    stop = threading.Event()
    tricklers = [
        socket.create_connection(("127.0.0.1", relay.port), source_address=("127.0.0.1", 0))
        for _ in range(16)
    ]

    def trickle() -> None:
        line = b"POST /v1/start HTTP/1.1\r\nHost: relay\r\nX-Padding: " + b"a" * 200
        for index in range(len(line)):
            if stop.wait(0.1):
                return
            for sock in tricklers:
                with contextlib.suppress(OSError):
                    sock.sendall(line[index : index + 1])

    thread = threading.Thread(target=trickle, daemon=True)
    thread.start()
    try:
        # All 16 slots held by 127.0.0.1 (each sending a byte at a time): the relay has
        # accepted every one of them once its listening socket's accept queue is empty.
        wait_for(lambda: not_yet_accepted(relay.port) == 0)
        body = json.dumps({"EventIds": ["E-1"], "Nonce": uuid.uuid4().hex}).encode()
        headers = sign_headers(relay_key(tmp_path / "state"), "POST", "/v1/start", body)
        started = time.monotonic()
        conn = http.client.HTTPConnection(
            "127.0.0.1", relay.port, timeout=10, source_address=("127.0.0.2", 0)
        )
        conn.request("POST", "/v1/start", body=body, headers=headers)
        response = conn.getresponse()
        elapsed = time.monotonic() - started
        assert response.status == 200, response.read()
        conn.close()
    finally:
        stop.set()
        thread.join(5)
        for sock in tricklers:
            sock.close()
    assert elapsed < read_timeout / 2, elapsed  # served at once, not after the tricklers
    assert imds.approvals == [{"StartRequests": [{"EventId": "E-1"}]}]
    fair = [x for x in relay.logs() if "share slots fairly" in x.get("msg", "")]
    assert fair and fair[0]["address"] == "127.0.0.1"


def test_a_wildcard_listen_address_needs_no_callback_url() -> None:
    """The app calls the address Azure knows for the VM (contract §3), never a URL a relay
    advertises: listening on every address is fine, and nothing is advertised."""
    from relay.settings import load_settings

    settings = load_settings(["--forward=file:/x", "--callback-listen=0.0.0.0:8492"])
    assert settings.advertised_callback_url is None


def not_yet_accepted(port: int) -> int:
    """Connections the kernel completed on 127.0.0.1:`port` that the process has not
    accept()ed yet: the LISTEN socket's rx_queue in /proc/net/tcp (Linux)."""
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local, state, queues = fields[1], fields[3], fields[4]
        if state == "0A" and int(local.split(":")[1], 16) == port:
            return int(queues.split(":")[1], 16)
    raise AssertionError(f"nothing listens on port {port}")
