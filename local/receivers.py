"""Local HTTP receivers standing in for Teams, PagerDuty, a customer webhook and a drain hook.

The demo and the end-to-end tests need somewhere real to send notifications: an actual
HTTP server on 127.0.0.1, answering the way the real service does, so the channel code runs
unchanged and a user can swap in the real URL by setting one variable. Each receiver also
checks what the real service would reject (Teams' message envelope, PagerDuty's Events v2
rules) and answers 400 the same way, so a malformed payload fails the demo instead of
passing silently.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

log = logging.getLogger(__name__)

ADAPTIVE_CARD = "application/vnd.microsoft.card.adaptive"
TEAMS_MAX_CARD_VERSION = (1, 5)
PAGERDUTY_ACTIONS = ("trigger", "acknowledge", "resolve")
PAGERDUTY_SEVERITIES = ("critical", "error", "warning", "info")
PAGERDUTY_SUMMARY_MAX = 1024
PAGERDUTY_DEDUP_MAX = 255


@dataclass(frozen=True)
class Received:
    """One request as it arrived, with what we answered and why."""

    channel: str
    method: str
    path: str
    headers: dict[str, str]
    raw: bytes
    body: Any  # the parsed JSON, or None if it was not JSON
    at: float  # time.time() when it arrived
    status: int
    problems: tuple[str, ...] = ()

    @property
    def accepted(self) -> bool:
        return 200 <= self.status < 300


@dataclass
class _Fault:
    remaining: int
    status: int
    headers: dict[str, str] = field(default_factory=dict)


class Receiver:
    """A threaded HTTP server on loopback that records every request.

    `on_receive` is called (from the server's thread) for each request, which is how the
    demo's timeline learns "who was told" the moment it happens.
    """

    channel = "http"
    success_status = 200

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        on_receive: Callable[[Received], None] | None = None,
    ) -> None:
        self._host, self._port = host, port
        self.on_receive = on_receive
        self._records: list[Received] = []
        self._lock = threading.Condition()
        self._faults: list[_Fault] = []
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ life cycle
    def start(self) -> Receiver:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # headers and body are two writes: no delayed-ACK wait

            def do_POST(self) -> None:
                receiver._handle(self)

            def do_PUT(self) -> None:
                receiver._handle(self)

            def do_GET(self) -> None:
                receiver._reply(self, 200, {"channel": receiver.channel, "ok": True})

            def log_message(self, format: str, *args: Any) -> None:
                pass  # the timeline says what arrived; access logs would drown it

        self._server = ThreadingHTTPServer((self._host, self._port), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.1},
            name=f"receiver-{self.channel}",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> Receiver:
        return self.start() if self._server is None else self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def base_url(self) -> str:
        if self._server is None:
            raise RuntimeError(f"the {self.channel} receiver is not running")
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    @property
    def url(self) -> str:
        """The URL to configure as this channel's endpoint."""
        return f"{self.base_url}{self.path}"

    path = "/"

    # ------------------------------------------------------------------ recording
    @property
    def received(self) -> list[Received]:
        with self._lock:
            return list(self._records)

    def accepted(self) -> list[Received]:
        return [r for r in self.received if r.accepted]

    def clear(self) -> None:
        with self._lock:
            self._records.clear()

    def wait_for(
        self, predicate: Callable[[list[Received]], bool], timeout: float
    ) -> list[Received]:
        """Block until predicate(accepted requests) holds; return them, or raise TimeoutError."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while True:
                accepted = [r for r in self._records if r.accepted]
                if predicate(accepted):
                    return accepted
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(
                        f"{self.channel}: condition not met after {timeout}s "
                        f"({len(accepted)} accepted, {len(self._records)} received)"
                    )
                self._lock.wait(min(left, 0.2))

    def fail_next(
        self, count: int, status: int = 500, headers: dict[str, str] | None = None
    ) -> None:
        """Answer the next `count` requests with `status` (e.g. 429 with Retry-After)."""
        with self._lock:
            self._faults.append(_Fault(count, status, dict(headers or {})))

    def clear_faults(self) -> None:
        """Answer normally again (the end of an outage fail_next began)."""
        with self._lock:
            self._faults.clear()

    # ------------------------------------------------------------------ behaviour
    def check(self, path: str, headers: dict[str, str], body: Any, raw: bytes) -> list[str]:
        """What the real service would reject about this request; [] if nothing."""
        return [] if isinstance(body, dict | list) else ["the body is not JSON"]

    def answer(self, body: Any) -> Any:
        return {"ok": True}

    def rejection(self, problems: list[str]) -> Any:
        return {"error": "; ".join(problems)}

    def fault_reply(self, fault: _Fault) -> Any:
        """The body of an injected failure (a service answering 429 says so its own way)."""
        return {"error": "injected"}

    def status_for(self, problems: list[str]) -> int:
        """The status of a refused request: 400 unless the service says otherwise."""
        return 400

    def _handle(self, handler: BaseHTTPRequestHandler) -> None:
        length = int(handler.headers.get("Content-Length") or 0)
        raw = handler.rfile.read(length) if length else b""
        try:
            body: Any = json.loads(raw) if raw else None
        except (UnicodeDecodeError, json.JSONDecodeError):
            body = None
        headers = {k: v for k, v in handler.headers.items()}
        path = handler.path
        fault = self._take_fault()
        if fault is not None:
            status, reply, extra, problems = (
                fault.status,
                self.fault_reply(fault),
                fault.headers,
                [],
            )
        else:
            problems = self.check(path, headers, body, raw)
            extra = {}
            if problems:
                status, reply = self.status_for(problems), self.rejection(problems)
            else:
                status, reply = self.success_status, self.answer(body)
        record = Received(
            channel=self.channel,
            method=handler.command,
            path=path,
            headers=headers,
            raw=raw,
            body=body,
            at=time.time(),
            status=status,
            problems=tuple(problems),
        )
        with self._lock:
            self._records.append(record)
            self._lock.notify_all()
        self._reply(handler, status, reply, extra)
        if self.on_receive is not None:
            try:
                self.on_receive(record)
            except Exception:  # a printer bug must not break the server, nor go unseen
                log.exception("%s receiver: on_receive failed", self.channel)

    def _take_fault(self) -> _Fault | None:
        with self._lock:
            while self._faults and self._faults[0].remaining <= 0:
                self._faults.pop(0)
            if not self._faults:
                return None
            self._faults[0].remaining -= 1
            return self._faults[0]

    @staticmethod
    def _reply(
        handler: BaseHTTPRequestHandler,
        status: int,
        body: Any,
        headers: dict[str, str] | None = None,
    ) -> None:
        text = isinstance(body, str)  # a service answering plain text (Slack's "ok")
        data = b"" if body is None else (body.encode() if text else json.dumps(body).encode())
        handler.send_response(status)
        if data:
            handler.send_header("Content-Type", "text/plain" if text else "application/json")
        for name, value in (headers or {}).items():
            handler.send_header(name, value)
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)


class TeamsReceiver(Receiver):
    """A Teams Workflows webhook ("When a Teams webhook request is received").

    It answers 202 with no body, as the Workflows trigger does, and refuses what Teams
    would not render: anything but a `message` with one Adaptive Card of version ≤ 1.5.
    """

    channel = "teams"
    success_status = 202
    path = "/workflows/teams"

    def check(self, path: str, headers: dict[str, str], body: Any, raw: bytes) -> list[str]:
        if not isinstance(body, dict):
            return ["the body is not a JSON object"]
        problems = []
        if body.get("type") != "message":
            problems.append('"type" must be "message"')
        attachments = body.get("attachments")
        if not isinstance(attachments, list) or not attachments:
            return [*problems, '"attachments" must be a non-empty list']
        for index, attachment in enumerate(attachments):
            where = f"attachments[{index}]"
            if not isinstance(attachment, dict):
                problems.append(f"{where} is not an object")
                continue
            if attachment.get("contentType") != ADAPTIVE_CARD:
                problems.append(f"{where}.contentType must be {ADAPTIVE_CARD}")
            if "contentUrl" not in attachment or attachment["contentUrl"] is not None:
                problems.append(f"{where}.contentUrl must be null")
            problems.extend(check_adaptive_card(attachment.get("content"), f"{where}.content"))
        return problems

    def answer(self, body: Any) -> Any:
        return None

    @staticmethod
    def card_text(record: Received) -> str:
        """All the text of a posted card, joined, as Teams shows it (its Markdown escapes
        and link-breaking zero-width spaces undone: functions.notify.teams.inert), for
        timelines and assertions."""
        texts: list[str] = []
        try:
            for attachment in record.body["attachments"]:
                _collect_text(attachment["content"], texts)
        except (KeyError, TypeError):
            pass
        return " | ".join(shown(text) for text in texts)


def check_adaptive_card(card: Any, where: str = "card") -> list[str]:
    """The structural rules Teams enforces before rendering an Adaptive Card."""
    if not isinstance(card, dict):
        return [f"{where} must be an Adaptive Card object"]
    problems = []
    if card.get("type") != "AdaptiveCard":
        problems.append(f'{where}.type must be "AdaptiveCard"')
    version = card.get("version")
    try:
        major, minor = (int(part) for part in str(version).split(".")[:2])
        if (major, minor) > TEAMS_MAX_CARD_VERSION:
            problems.append(f"{where}.version {version} is newer than Teams renders (1.5)")
    except ValueError:
        problems.append(f'{where}.version must look like "1.5", got {version!r}')
    body = card.get("body")
    if body is not None and not isinstance(body, list):
        problems.append(f"{where}.body must be a list")
    for index, element in enumerate(body or []):
        if not isinstance(element, dict) or not isinstance(element.get("type"), str):
            problems.append(f"{where}.body[{index}] needs a string type")
    actions = card.get("actions")
    if actions is not None and not isinstance(actions, list):
        problems.append(f"{where}.actions must be a list")
    return problems


_ESCAPED = re.compile(r"\\(.)")


def shown(text: str) -> str:
    """Card text as Teams renders it: a backslash escape shows the character, a zero-width
    space shows nothing."""
    return _ESCAPED.sub(r"\1", text).replace("\u200b", "")


def _collect_text(node: Any, out: list[str]) -> None:
    if isinstance(node, dict):
        for key in ("text", "title", "value"):
            if isinstance(node.get(key), str) and node.get(key):
                out.append(node[key])
        for value in node.values():
            if isinstance(value, dict | list):
                _collect_text(value, out)
    elif isinstance(node, list):
        for item in node:
            _collect_text(item, out)


class PagerDutyReceiver(Receiver):
    """PagerDuty's Events API v2 enqueue endpoint: 202 on success, 400 with its error shape.

    The rules checked are PagerDuty's documented ones: a 32-character routing key, the
    three actions, a dedup_key for acknowledge/resolve (≤ 255), and for a trigger a
    payload with summary (≤ 1024), source and a severity from the enum.
    """

    channel = "pagerduty"
    success_status = 202
    path = "/v2/enqueue"

    def check(self, path: str, headers: dict[str, str], body: Any, raw: bytes) -> list[str]:
        if not path.startswith(self.path):
            return [f"unknown path {path}"]
        if not isinstance(body, dict):
            return ["Event object format is unrecognized"]
        problems = []
        key = body.get("routing_key")
        if not isinstance(key, str) or len(key) != 32:
            problems.append("'routing_key' must be a 32 character string")
        action = body.get("event_action")
        if action not in PAGERDUTY_ACTIONS:
            problems.append("'event_action' must be one of trigger, acknowledge, resolve")
        dedup = body.get("dedup_key")
        if dedup is not None and (not isinstance(dedup, str) or len(dedup) > PAGERDUTY_DEDUP_MAX):
            problems.append("'dedup_key' must be a string of at most 255 characters")
        if action in ("acknowledge", "resolve") and not dedup:
            problems.append(f"'dedup_key' is required for {action}")
        if action == "trigger":
            problems.extend(_check_pagerduty_payload(body.get("payload")))
        for name in ("links", "images"):
            if name in body and not isinstance(body[name], list):
                problems.append(f"'{name}' must be a list")
        return problems

    def answer(self, body: Any) -> Any:
        dedup = body.get("dedup_key") or f"generated-{time.time_ns()}"
        return {"status": "success", "message": "Event processed", "dedup_key": dedup}

    def rejection(self, problems: list[str]) -> Any:
        return {"status": "invalid event", "message": "Event object is invalid", "errors": problems}


def _check_pagerduty_payload(payload: Any) -> list[str]:
    if not isinstance(payload, dict):
        return ["'payload' is required for trigger"]
    problems = []
    summary = payload.get("summary")
    if not isinstance(summary, str) or not summary:
        problems.append("'payload.summary' is missing")
    elif len(summary) > PAGERDUTY_SUMMARY_MAX:
        problems.append("'payload.summary' is longer than 1024 characters")
    if not isinstance(payload.get("source"), str) or not payload.get("source"):
        problems.append("'payload.source' is missing")
    if payload.get("severity") not in PAGERDUTY_SEVERITIES:
        problems.append("'payload.severity' must be one of critical, error, warning, info")
    timestamp = payload.get("timestamp")
    if timestamp is not None:
        try:
            datetime.fromisoformat(str(timestamp).replace("Z", "+00:00"))
        except ValueError:
            problems.append("'payload.timestamp' must be an ISO 8601 date-time")
    if "custom_details" in payload and not isinstance(payload["custom_details"], dict):
        problems.append("'payload.custom_details' must be an object")
    return problems


class WebhookReceiver(Receiver):
    """A customer's webhook endpoint. `verify(headers, raw)` returns a problem, or None."""

    channel = "webhook"
    path = "/hooks/scheduled-events"

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        on_receive: Callable[[Received], None] | None = None,
        verify: Callable[[dict[str, str], bytes], str | None] | None = None,
    ) -> None:
        super().__init__(host, port, on_receive)
        self.verify = verify

    def check(self, path: str, headers: dict[str, str], body: Any, raw: bytes) -> list[str]:
        problems = super().check(path, headers, body, raw)
        if self.verify is not None and not problems:
            problem = self.verify(headers, raw)
            if problem:
                problems.append(f"signature: {problem}")
        return problems


class DrainHookReceiver(Receiver):
    """A customer service's HTTP drain hook: it is told a VM is going (or, with
    `"action": "undrain"`, back), answers 200.

    `delay` makes it slow (a drain that takes time, or one that hangs past the step's limit).
    """

    channel = "drain"
    path = "/drain"

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        on_receive: Callable[[Received], None] | None = None,
        delay: float = 0.0,
    ) -> None:
        super().__init__(host, port, on_receive)
        self.delay = delay

    def answer(self, body: Any) -> Any:
        if self.delay:
            time.sleep(self.delay)
        if isinstance(body, dict) and body.get("action") == "undrain":
            return {"undrained": True}
        return {"drained": True}
