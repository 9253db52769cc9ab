"""A small IMDS client: Scheduled Events (read and approve) and compute metadata.

Every failure becomes one `ImdsError` with a short `kind` (timeout, connection, http-503,
malformed, ...) so the watcher can log each kind once per streak and back off.

One kept-alive connection (relay.httpwire): IMDS is a link-local HTTP endpoint that must
never be reached through a proxy, and a poll a second on a reused connection costs far
less CPU and memory than a general-purpose HTTP stack.
"""

from __future__ import annotations

import json
import socket

from relay.httpwire import AnswerTooLarge, HttpAnswer, HttpConnection
from relay.logs import clip
from relay.models import (
    SCHEDULED_EVENTS_API_VERSION,
    DocumentError,
    ScheduledEventsDocument,
    parse_document,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

COMPUTE_API_VERSION = "2021-02-01"
ATTESTED_API_VERSION = "2020-09-01"


class ImdsError(Exception):
    def __init__(self, kind: str, message: str, size: int | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.size = size  # kind "too-large": the answer's announced size in bytes


def _failure(exc: BaseException, timeout: float, what: str = "") -> ImdsError:
    if isinstance(exc, AnswerTooLarge):
        return ImdsError("too-large", f"{what}{exc}", size=exc.size)
    if isinstance(exc, (socket.timeout, TimeoutError)):
        return ImdsError("timeout", f"{what}no answer within {timeout}s")
    if isinstance(exc, OSError):
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
        except (OSError, ValueError) as exc:
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

    def get_attested(self, nonce: str, timeout: float | None = None) -> HttpAnswer:
        """The attested document for `nonce` (status and body, for the caller to judge)."""
        params = {"api-version": ATTESTED_API_VERSION, "nonce": nonce}
        return self._request("GET", "/metadata/attested/document", timeout, params)

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
