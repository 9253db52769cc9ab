"""A small IMDS client: Scheduled Events (read and approve) and compute metadata.

Every failure becomes one `ImdsError` with a short `kind` (timeout, connection, http-503,
malformed, ...) so the watcher can log each kind once per streak and back off.

Plain `http.client` on one kept-alive connection: IMDS is a link-local HTTP endpoint that
must never be reached through a proxy, and a poll a second on a reused connection costs
far less CPU than building a request stack each time.
"""

from __future__ import annotations

import http.client
import json
import select
import socket
import threading
from typing import Any
from urllib.parse import urlencode, urlsplit

from relay.logs import clip
from relay.models import (
    SCHEDULED_EVENTS_API_VERSION,
    DocumentError,
    ScheduledEventsDocument,
    parse_document,
)

COMPUTE_API_VERSION = "2021-02-01"
MAX_ANSWER = 4 * 1024 * 1024  # a Scheduled Events document is a few KiB; never read more


class ImdsError(Exception):
    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class HttpAnswer:
    __slots__ = ("body", "headers", "status")

    def __init__(self, status: int, body: bytes, headers: dict[str, str]) -> None:
        self.status = status
        self.body = body
        self.headers = headers

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", "replace")


class HttpConnection:
    """One kept-alive HTTP connection to one origin; thread-safe (used under a lock).

    A connection the server closed while it sat idle is noticed before it is reused (it
    turns readable), so an idle close never shows up as an error, while a server that
    drops a request still does.
    """

    def __init__(self, base_url: str) -> None:
        parts = urlsplit(base_url)
        self.scheme = parts.scheme
        self.host = parts.hostname or ""
        self.port = parts.port
        self.prefix = parts.path.rstrip("/")
        self._conn: http.client.HTTPConnection | None = None
        self._lock = threading.Lock()

    def _connection(self, timeout: float) -> http.client.HTTPConnection:
        if self._conn is None:
            if self.scheme == "https":
                self._conn = http.client.HTTPSConnection(self.host, self.port, timeout=timeout)
            else:
                self._conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
        self._conn.timeout = timeout
        if self._conn.sock is not None:
            self._conn.sock.settimeout(timeout)
        return self._conn

    def close(self) -> None:
        with self._lock:
            self._drop()

    def _drop(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def request(
        self,
        method: str,
        path: str,
        timeout: float,
        params: dict[str, str] | None = None,
        headers: dict[str, str] | None = None,
        body: bytes | None = None,
    ) -> HttpAnswer:
        target = self.prefix + path + ("?" + urlencode(params) if params else "")
        with self._lock:
            if self._conn is not None and _closed_by_peer(self._conn.sock):
                self._drop()  # the server closed it while idle: not an error, reconnect
            conn = self._connection(timeout)
            try:
                conn.request(method, target, body=body, headers=headers or {})
                response = conn.getresponse()
                data = response.read(MAX_ANSWER + 1)
            except BaseException:
                self._drop()
                raise
            answer = HttpAnswer(
                response.status, data, {k.lower(): v for k, v in response.getheaders()}
            )
            if response.will_close or len(data) > MAX_ANSWER:
                self._drop()
            return answer


def _closed_by_peer(sock: socket.socket | None) -> bool:
    """An idle kept-alive socket is readable only if the peer closed it (or misbehaved)."""
    if sock is None:
        return False
    try:
        readable, _, _ = select.select([sock], [], [], 0)
    except (OSError, ValueError):
        return True
    return bool(readable)


def _failure(exc: BaseException, timeout: float, what: str = "") -> ImdsError:
    if isinstance(exc, (socket.timeout, TimeoutError)):
        return ImdsError("timeout", f"{what}no answer within {timeout}s")
    if isinstance(exc, (OSError, http.client.HTTPException)):
        return ImdsError("connection", f"{what}cannot connect: {clip(exc, 160)}")
    return ImdsError("request", f"{what}request failed: {clip(exc, 160)}")


class ImdsClient:
    """Thread-safe: one kept-alive connection, used under a lock (IMDS calls are short)."""

    def __init__(self, base_url: str, timeout: float = 5.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.events_url = f"{self.base_url}/metadata/scheduledevents"
        self._http = HttpConnection(self.base_url)

    def _request(
        self,
        method: str,
        path: str,
        timeout: float | None,
        params: dict[str, str],
        body: bytes | None = None,
    ) -> HttpAnswer:
        timeout = timeout or self.timeout
        headers = {"Metadata": "true"}
        if body is not None:
            headers["Content-Type"] = "application/json"
        try:
            return self._http.request(method, path, timeout, params, headers, body)
        except (OSError, http.client.HTTPException, ValueError) as exc:
            what = "StartRequests: " if method == "POST" else ""
            raise _failure(exc, timeout, what) from None

    def _get_ok(self, path: str, timeout: float | None, params: dict[str, str]) -> bytes:
        answer = self._request("GET", path, timeout, params)
        if answer.status != 200:
            raise ImdsError(
                f"http-{answer.status}",
                f"IMDS answered {answer.status}: {answer.body[:120]!r}",
            )
        return answer.body

    def get_events_raw(self, timeout: float | None = None) -> bytes:
        """The Scheduled Events answer as bytes, to compare cheaply with the previous one."""
        return self._get_ok(
            "/metadata/scheduledevents", timeout, {"api-version": SCHEDULED_EVENTS_API_VERSION}
        )

    def get_events(
        self, timeout: float | None = None
    ) -> tuple[dict[str, Any], ScheduledEventsDocument]:
        """A fresh, validated document: (raw dict as IMDS wrote it, parsed model)."""
        return parse_events(self.get_events_raw(timeout))

    def start_events(self, event_ids: list[str], timeout: float | None = None) -> tuple[int, str]:
        """POST StartRequests; return IMDS's status and body (200 is the only success)."""
        body = {"StartRequests": [{"EventId": event_id} for event_id in event_ids]}
        answer = self._request(
            "POST",
            "/metadata/scheduledevents",
            timeout,
            {"api-version": SCHEDULED_EVENTS_API_VERSION},
            json.dumps(body).encode(),
        )
        return answer.status, answer.text[:500]

    def get_compute(self, timeout: float | None = None) -> dict[str, Any]:
        raw = self._get_ok(
            "/metadata/instance/compute",
            timeout,
            {"api-version": COMPUTE_API_VERSION, "format": "json"},
        )
        try:
            data = json.loads(raw)
        except (ValueError, RecursionError):
            raise ImdsError("malformed", "compute metadata is not JSON") from None
        if not isinstance(data, dict) or not data.get("name"):
            raise ImdsError("malformed", "compute metadata has no VM name")
        return data

    def get_token(self, resource: str, client_id: str | None, timeout: float) -> HttpAnswer:
        """A managed identity token answer (status and body, for the caller to judge)."""
        params = {"api-version": "2018-02-01", "resource": resource}
        if client_id:
            params["client_id"] = client_id
        return self._request("GET", "/metadata/identity/oauth2/token", timeout, params)


def parse_events(raw: bytes) -> tuple[dict[str, Any], ScheduledEventsDocument]:
    try:
        data = json.loads(raw)
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise ImdsError("malformed", "the answer is not JSON") from None
    try:
        return data, parse_document(data)
    except DocumentError as exc:
        raise ImdsError("malformed", str(exc)) from None
