"""A local stand-in for the Service Bus REST "Send Message" endpoint, checking what Azure checks.

There is no Service Bus emulator without Docker, so this real HTTP server on 127.0.0.1
plays the queue: it verifies the Authorization header (a SAS token's signature, expiry,
key name and scope; or a Bearer token's audience and expiry), the BrokerProperties JSON
(MessageId, SessionId, TimeToLive) and the path, answers 201/400/401/404 like Azure, can be
told to fail (503, 429, ...) or to hang, and drops resends with a MessageId it already has,
like duplicate detection. Every answer carries Azure's `Date`, on the stand-in's `clock`.

It serves two queues, as main.bicep deploys them: `documents` requires sessions (every
message must carry a SessionId) and `heartbeats` has none (contract C1: a heartbeat must
not carry a SessionId; the stand-in refuses one so a relay that still sets it is caught).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

SERVICEBUS_AUDIENCE = "https://servicebus.azure.net"


@dataclass
class Received:
    body: bytes
    properties: dict[str, Any]
    content_type: str
    queue: str = "documents"

    @property
    def message_id(self) -> str:
        return self.properties["MessageId"]

    @property
    def envelope(self) -> dict[str, Any]:
        return json.loads(self.body)


@dataclass
class _Script:
    status: int
    remaining: int | None  # None: until healed
    retry_after: str | None = None


@dataclass
class ServiceBusStandIn:
    namespace: str = "relay-test.servicebus.windows.net"
    queue: str = "documents"
    heartbeat_queue: str = "heartbeats"
    key_name: str = "relay-send"
    key: str = "c2VjcmV0LWtleS1mb3ItdGVzdHMtb25seS0wMDAwMDA="
    clock: Any = time.time
    messages: list[Received] = field(default_factory=list)  # the documents queue
    heartbeats: list[Received] = field(default_factory=list)  # the heartbeats queue
    statuses: list[int] = field(default_factory=list)
    duplicates: int = 0
    rejections: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._seen: set[tuple[str, str]] = set()
        self._script: list[_Script] = []
        self._hold = threading.Event()
        self._hold.set()
        self.held = threading.Event()  # set while a stored message's 201 is being held back
        self._hold_after_store = False
        self._httpd: ThreadingHTTPServer | None = None

    # ---------------------------------------------------------------- control

    @property
    def endpoint(self) -> str:
        assert self._httpd is not None
        return f"http://127.0.0.1:{self._httpd.server_address[1]}"

    @property
    def forward(self) -> str:
        return f"servicebus://{self.namespace}/{self.queue}"

    @property
    def connection_string(self) -> str:
        """A namespace-level rule: its tokens may be scoped to either queue."""
        return (
            f"Endpoint=sb://{self.namespace}/;SharedAccessKeyName={self.key_name};"
            f"SharedAccessKey={self.key}"
        )

    @property
    def queue_connection_string(self) -> str:
        """A rule of the documents queue only (EntityPath)."""
        return f"{self.connection_string};EntityPath={self.queue}"

    def fail(self, status: int, count: int | None = 1, retry_after: str | None = None) -> None:
        """Answer the next `count` sends (None: all until heal()) with `status`, storing nothing."""
        with self._lock:
            self._script.append(_Script(status, count, retry_after))

    def heal(self) -> None:
        with self._lock:
            self._script.clear()

    def hold_after_store(self) -> None:
        """Store the next message, then hang before answering (a crash window for the relay)."""
        self._hold.clear()
        self._hold_after_store = True

    def release(self) -> None:
        self._hold_after_store = False
        self._hold.set()

    def envelopes(self) -> list[dict[str, Any]]:
        with self._lock:
            return [m.envelope for m in self.messages]

    def heartbeat_envelopes(self) -> list[dict[str, Any]]:
        with self._lock:
            return [m.envelope for m in self.heartbeats]

    def start(self) -> ServiceBusStandIn:
        standin = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length)
                status, text, headers = standin._handle(self.path, dict(self.headers), body)
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(text)))
                self.end_headers()
                self.wfile.write(text)

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def date_time_string(self, timestamp: float | None = None) -> str:
                # Every answer's `Date` is Azure's clock: the stand-in's own (`clock`).
                return super().date_time_string(standin.clock() if timestamp is None else timestamp)

        class Server(ThreadingHTTPServer):
            daemon_threads = True

            def handle_error(self, request: Any, client_address: Any) -> None:
                pass  # a relay killed mid-request is part of the tests

        self._httpd = Server(("127.0.0.1", 0), Handler)
        threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        ).start()
        return self

    def stop(self) -> None:
        self.release()
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()

    # ---------------------------------------------------------------- checks

    def _handle(
        self, path: str, headers: dict[str, str], body: bytes
    ) -> tuple[int, bytes, dict[str, str]]:
        status, text, extra = self._check(path, headers, body)
        with self._lock:
            self.statuses.append(status)
            if status >= 400:
                self.rejections.append(text)
        if status == 201 and self._hold_after_store:
            self.held.set()
            self._hold.wait(30)
            self.held.clear()
        return status, text.encode(), extra

    def _check(
        self, path: str, headers: dict[str, str], body: bytes
    ) -> tuple[int, str, dict[str, str]]:
        lowered = {k.lower(): v for k, v in headers.items()}
        with self._lock:
            if self._script:
                step = self._script[0]
                if step.remaining is not None:
                    step.remaining -= 1
                    if step.remaining <= 0:
                        self._script.pop(0)
                extra = {"Retry-After": step.retry_after} if step.retry_after else {}
                return step.status, "scripted failure", extra
        queue = urllib.parse.urlsplit(path).path.removesuffix("/messages").strip("/")
        if queue not in (self.queue, self.heartbeat_queue) or not path.startswith(f"/{queue}/"):
            return 404, f"no entity at {path}", {}
        problem = self._check_authorization(lowered.get("authorization", ""), queue)
        if problem:
            return 401, problem, {}
        if not lowered.get("content-type"):
            return 400, "Content-Type missing", {}
        try:
            props = json.loads(lowered.get("brokerproperties", ""))
        except ValueError:
            return 400, "BrokerProperties is not JSON", {}
        if not isinstance(props, dict):
            return 400, "BrokerProperties must be a JSON object", {}
        message_id = props.get("MessageId")
        if not isinstance(message_id, str) or not 0 < len(message_id) <= 128:
            return 400, "MessageId must be a string of 1..128 characters", {}
        session = props.get("SessionId")
        if queue == self.queue:
            if not isinstance(session, str) or not 0 < len(session) <= 128:
                return 400, "the queue requires sessions: SessionId must be set", {}
        elif "SessionId" in props:
            return 400, "the heartbeats queue has no sessions: SessionId must not be set", {}
        ttl = props.get("TimeToLive")
        if not isinstance(ttl, int | float) or isinstance(ttl, bool) or ttl <= 0:
            return 400, "TimeToLive must be a positive number of seconds", {}
        with self._lock:
            if (queue, message_id) in self._seen:
                self.duplicates += 1
                return 201, "", {}
            self._seen.add((queue, message_id))
            received = Received(body, props, lowered["content-type"], queue)
            (self.messages if queue == self.queue else self.heartbeats).append(received)
        return 201, "", {}

    def _check_authorization(self, value: str, queue: str) -> str | None:
        if value.startswith("SharedAccessSignature "):
            return self._check_sas(value[len("SharedAccessSignature ") :], queue)
        if value.startswith("Bearer "):
            return self._check_bearer(value[len("Bearer ") :])
        return "Authorization header missing or of an unknown scheme"

    def _check_sas(self, token: str, queue: str) -> str | None:
        fields = dict(part.split("=", 1) for part in token.split("&") if "=" in part)
        if not {"sr", "sig", "se", "skn"} <= fields.keys():
            return "SAS token must have sr, sig, se and skn"
        if fields["skn"] != self.key_name:
            return f"unknown key name {fields['skn']}"
        if not fields["se"].isdigit() or int(fields["se"]) < self.clock():
            return "SAS token expired"
        scope = urllib.parse.unquote_plus(fields["sr"]).lower().rstrip("/")
        target = f"https://{self.namespace}/{queue}".lower()
        for scheme in ("sb://", "http://"):
            if scope.startswith(scheme):
                scope = "https://" + scope[len(scheme) :]
        if not (target == scope or target.startswith(scope + "/")):
            return f"SAS token is for {scope}, not {target}"
        to_sign = f"{fields['sr']}\n{fields['se']}".encode()
        expected = base64.b64encode(hmac.new(self.key.encode(), to_sign, hashlib.sha256).digest())
        given = urllib.parse.unquote(fields["sig"]).encode()
        if not hmac.compare_digest(expected, given):
            return "SAS signature does not match"
        return None

    def _check_bearer(self, token: str) -> str | None:
        try:
            payload = token.split(".")[1]
            claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
        except (IndexError, ValueError):
            return "Bearer token is not a JWT"
        if str(claims.get("aud", "")).rstrip("/") != SERVICEBUS_AUDIENCE:
            return f"token audience {claims.get('aud')!r} is not {SERVICEBUS_AUDIENCE}"
        if not isinstance(claims.get("exp"), int) or claims["exp"] < self.clock():
            return "token expired"
        return None
