"""HTTP front of the simulator: IMDS paths per VM, plus the /_sim control API.

Standard library only (http.server), because the relay package is installed on VMs with
nothing but requests and pydantic. HTTP/1.1 keep-alive is on, as on IMDS, so a relay polling
once a second with a requests.Session reuses its connection, and a dropped-connection fault
really does break a live connection.
"""

from __future__ import annotations

import contextlib
import json
import socket
import sys
import threading
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlsplit

from functions.model.envelope import API_VERSIONS
from simulator import control, instance
from simulator.arm import ArmService
from simulator.engine import NotFound, Simulator, SimulatorError

MAX_BODY = 64 * 1024
NEWEST_VERSIONS = list(reversed(API_VERSIONS))[:3]
METADATA_HEADER_ERROR = "Bad request. Required metadata header not specified"


class _HttpServer(ThreadingHTTPServer):
    daemon_threads = True
    sim: Simulator
    owner: SimulatorServer

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that gives up on a slow answer is part of the game, not a server error.
        if isinstance(sys.exc_info()[1], ConnectionError | TimeoutError):
            return
        super().handle_error(request, client_address)


class SimulatorServer:
    """Serve a Simulator over HTTP on a background thread; also a context manager."""

    def __init__(
        self,
        sim: Simulator,
        host: str = "127.0.0.1",
        port: int = 0,
        tick_interval: float = 0.05,
        log_requests: bool = False,
        log: Callable[[str], None] | None = None,
    ) -> None:
        self.sim = sim
        self.host = host
        self.port = port
        self.tick_interval = tick_interval
        self.log_requests = log_requests
        self.log = log or (lambda line: print(line, file=sys.stderr, flush=True))
        self.stopping = threading.Event()
        self._httpd: _HttpServer | None = None
        self._threads: list[threading.Thread] = []
        # Resource Manager's acknowledge API, under {url}/arm (simulator.arm).
        self.arm = ArmService(sim)
        # Every attested-document request answered 200: (vm, nonce), in order (tests).
        self.attested: list[tuple[str, str]] = []

    def start(self) -> SimulatorServer:
        if self._httpd is not None:
            return self
        self.stopping.clear()
        httpd = _HttpServer((self.host, self.port), _Handler)
        httpd.sim = self.sim
        httpd.owner = self
        self._httpd = httpd
        self.port = httpd.server_address[1]
        self.arm.audience = self.arm_url
        self._threads = [
            threading.Thread(
                target=httpd.serve_forever,
                kwargs={"poll_interval": 0.05},
                name="imds-simulator-http",
                daemon=True,
            ),
            threading.Thread(target=self._tick, name="imds-simulator-ticker", daemon=True),
        ]
        for thread in self._threads:
            thread.start()
        return self

    def _tick(self) -> None:
        # Documents change on time even when nobody polls, so the CLI can print them.
        while not self.stopping.wait(self.tick_interval):
            try:
                self.sim.tick()
            except Exception as exc:  # keep ticking; a listener bug must not freeze time
                self.log(f"simulator tick failed: {exc!r}")

    def stop(self) -> None:
        self.stopping.set()  # also ends slow-answer waits in handler threads
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None
        for thread in self._threads:
            thread.join(timeout=5)
        self._threads = []

    def __enter__(self) -> SimulatorServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        host = self.host if ":" not in self.host else f"[{self.host}]"
        return f"http://{host}:{self.port}"

    @property
    def arm_url(self) -> str:
        """The ARM endpoint to configure (ARM_ENDPOINT): acknowledge paths go under it."""
        return f"{self.url}/arm"

    def vm_url(self, name: str) -> str:
        """Base URL of one VM; a relay appends /metadata/scheduledevents to it."""
        return f"{self.url}/vm/{quote(self.sim.vm(name).name)}"

    def vm_urls(self) -> dict[str, str]:
        return {name: self.vm_url(name) for name in self.sim.vm_names}


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Headers and body go out in two writes; with Nagle on, a kept-alive client waits for a
    # delayed ACK (~40 ms) on every request. Off, a poll costs well under a millisecond.
    disable_nagle_algorithm = True
    server_version = "relay-imds-simulator"
    sys_version = ""
    server: _HttpServer

    # ------------------------------------------------------------------ plumbing

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_DELETE(self) -> None:
        self._dispatch("DELETE")

    def do_PUT(self) -> None:
        self._dispatch("PUT")

    def log_message(self, format: str, *args: Any) -> None:
        if self.server.owner.log_requests:
            self.server.owner.log(f"{self.address_string()} {format % args}")

    def _send(
        self,
        status: int,
        body: bytes,
        content_type: str = "application/json; charset=utf-8",
        headers: dict[str, str] | None = None,
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, status: int, data: Any) -> None:
        self._send(status, json.dumps(data, ensure_ascii=False).encode())

    def _error(self, status: int, message: str, **extra: Any) -> None:
        self._json(status, {"error": message, **extra})

    def _body(self) -> bytes | None:
        """The request body, or None (and a 413 sent) if it is too large."""
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        if length < 0:
            self._error(400, "Bad request. Invalid Content-Length")
            self.close_connection = True
            return None
        if length > MAX_BODY:
            self._error(413, f"body larger than {MAX_BODY} bytes")
            self.close_connection = True
            return None
        return self.rfile.read(length) if length > 0 else b""

    def _dispatch(self, method: str) -> None:
        # Read the body first, whatever the answer: an unread body on a kept-alive
        # connection would be taken for the next request.
        body = self._body()
        if body is None:
            return
        self._request_body = body
        url = urlsplit(self.path)
        path = unquote(url.path).rstrip("/") or "/"
        query = {k: v[-1] for k, v in parse_qs(url.query, keep_blank_values=True).items()}
        try:
            if path == "/_sim" or path.startswith("/_sim/"):
                self._control(method, path.removeprefix("/_sim"), query)
                return
            if path.startswith("/arm/"):
                status, answer, headers = self.server.owner.arm.handle(
                    method, path.removeprefix("/arm"), query, self.headers, body
                )
                self._send(status, json.dumps(answer).encode(), headers=headers)
                return
            vm_name: str | None = None
            if path.startswith("/vm/"):
                vm_name, _, rest = path.removeprefix("/vm/").partition("/")
                path = "/" + rest
            self._imds(method, path, query, vm_name)
        except NotFound as exc:
            self._error(404, str(exc))
        except SimulatorError as exc:
            self._error(400, str(exc))
        except (ConnectionError, TimeoutError):
            raise
        except Exception as exc:  # a simulator bug: say so rather than drop the connection
            self.server.owner.log(f"simulator error on {method} {self.path}: {exc!r}")
            self._error(500, f"simulator error: {exc!r}")

    # ------------------------------------------------------------------ IMDS

    def _imds(self, method: str, path: str, query: dict[str, str], vm_name: str | None) -> None:
        sim = self.server.sim
        endpoints = {
            "/metadata/scheduledevents": ("scheduledevents", ("GET", "POST")),
            "/metadata/instance/compute": ("compute", ("GET",)),
            "/metadata/instance": ("instance", ("GET",)),
            "/metadata/identity/oauth2/token": ("token", ("GET",)),
            "/metadata/attested/document": ("attested", ("GET",)),
        }
        vm = sim.vm(vm_name).name if vm_name is not None else sim.root_vm()
        if path not in endpoints:
            self._error(404, f"Not found: {path}")
            return
        endpoint, methods = endpoints[path]
        if self.headers.get("Metadata", "").strip().lower() != "true":
            self._error(400, METADATA_HEADER_ERROR)
            return
        if "X-Forwarded-For" in self.headers:
            self._error(400, "Bad request. X-Forwarded-For header is not allowed")
            return
        if method not in methods:
            self._error(405, f"Method {method} not allowed; use {' or '.join(methods)}")
            return
        versions = {
            "scheduledevents": set(API_VERSIONS),
            "compute": instance.INSTANCE_API_VERSIONS,
            "instance": instance.INSTANCE_API_VERSIONS,
            "token": instance.TOKEN_API_VERSIONS,
            "attested": instance.ATTESTED_API_VERSIONS,
        }[endpoint]
        version = query.get("api-version")
        if not version:
            self._error(
                400,
                "Bad request. api-version was not specified in the request. "
                "For more information refer to aka.ms/azureimds",
                **{"newest-versions": sorted(versions, reverse=True)[:3]},
            )
            return
        if version not in versions:
            self._error(
                400,
                "Bad request. api-version is invalid or was not specified in the request. "
                "For more information refer to aka.ms/azureimds",
                **{"newest-versions": sorted(versions, reverse=True)[:3]},
            )
            return
        if endpoint == "token" and not query.get("resource"):
            self._json(
                400,
                {
                    "error": "invalid_request",
                    "error_description": "Required query variable 'resource' is missing",
                },
            )
            return
        nonce = query.get("nonce", "")
        # Absent: IMDS uses a timestamp; present: 1 to 32 alphanumeric characters.
        if (
            endpoint == "attested"
            and "nonce" in query
            and not (nonce.isascii() and nonce.isalnum() and len(nonce) <= instance.MAX_NONCE_CHARS)
        ):
            self._error(400, "Bad request. nonce must be 1-32 alphanumeric characters")
            return
        body = self._request_body
        if not self._apply_faults(
            vm, "compute" if endpoint == "instance" else endpoint, post=method == "POST"
        ):
            return
        nonce_fault = sim.take_nonce_fault(vm, nonce) if endpoint == "attested" else None
        if nonce_fault == "short-nonce":
            self._error(400, "Bad request. nonce must be a 10-digit string")
            return
        if nonce_fault == "other-nonce":
            nonce = ""  # 200, signing IMDS's own (timestamp) nonce instead of the one asked
        if endpoint == "scheduledevents":
            if method == "GET":
                self._json(200, sim.document(vm, api_version=version))
            else:
                self._start_requests(vm, body)
        elif endpoint == "attested":
            described = sim.describe_vm(vm)
            nonce = nonce or f"{int(sim.clock()):010d}"[-10:]
            self.server.owner.attested.append((vm, nonce))
            self._json(200, instance.attested(described, nonce))
        elif endpoint == "token":
            self._json(
                200,
                instance.token(
                    sim.describe_vm(vm),
                    query["resource"],
                    sim.clock(),
                    query.get("client_id"),
                ),
            )
        else:
            compute = instance.compute(sim.describe_vm(vm), sim.location)
            if endpoint == "compute":
                self._json(200, compute)
            else:
                self._json(200, {"compute": compute, "network": {"interface": []}})

    def _apply_faults(self, vm: str, endpoint: str, post: bool = False) -> bool:
        """Misbehave as injected; False when the request has been dealt with."""
        owner = self.server.owner
        action = self.server.sim.take_faults(vm, endpoint, post)
        if action.delay > 0 and owner.stopping.wait(action.delay):
            self.close_connection = True
            return False
        if action.kind == "drop":
            self.close_connection = True
            with contextlib.suppress(OSError):
                self.connection.shutdown(socket.SHUT_RDWR)
            return False
        if action.kind == "status":
            phrase = _phrase(action.status)
            headers = {"Retry-After": "1"} if action.status in (429, 503) else None
            body = json.dumps({"error": phrase}).encode()
            self._send(action.status, body, headers=headers)
            return False
        if action.kind == "malformed":
            document = self.server.sim.document(vm) if endpoint == "scheduledevents" else {}
            text = json.dumps(document)
            self._send(200, text[: max(1, len(text) // 2)].encode() + b'{"Events": [,')
            return False
        return True

    def _start_requests(self, vm: str, body: bytes) -> None:
        try:
            data = json.loads(body)
        except (UnicodeDecodeError, json.JSONDecodeError):
            self._error(400, "Bad request. The request body is not valid JSON")
            return
        requests = data.get("StartRequests") if isinstance(data, dict) else None
        if not isinstance(requests, list) or not requests:
            self._error(400, 'Bad request. Expected {"StartRequests": [{"EventId": "..."}, ...]}')
            return
        ids = []
        for item in requests:
            event_id = item.get("EventId") if isinstance(item, dict) else None
            if not isinstance(event_id, str) or not event_id.strip():
                self._error(400, "Bad request. Every StartRequest needs an EventId string")
                return
            ids.append(event_id.strip())
        try:
            self.server.sim.approve(vm, ids)
        except NotFound as exc:
            self._error(400, f"Bad request. {exc}")
            return
        self._send(200, b"")

    # ------------------------------------------------------------------ control API

    def _control(self, method: str, path: str, query: dict[str, str]) -> None:
        owner = self.server.owner
        urls = control.Urls(url=owner.url, vm_url=owner.vm_url)
        try:
            status, data = control.handle(
                self.server.sim, urls, method, path, query, self._request_body, owner.arm
            )
        except control.MethodNotAllowed as exc:
            self._error(405, str(exc))
            return
        except control.UnknownPath as exc:
            self._error(404, str(exc))
            return
        self._json(status, data)


def _phrase(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return f"HTTP {status}"
