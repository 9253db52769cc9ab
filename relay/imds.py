"""A small IMDS client: Scheduled Events (read and approve) and compute metadata.

Every failure becomes one `ImdsError` with a short `kind` (timeout, connection, http-503,
malformed, ...) so the watcher can log each kind once per streak and back off.
"""

from __future__ import annotations

import json
import threading
from typing import Any

import requests

from relay.logs import clip
from relay.models import (
    SCHEDULED_EVENTS_API_VERSION,
    DocumentError,
    ScheduledEventsDocument,
    parse_document,
)

COMPUTE_API_VERSION = "2021-02-01"


class ImdsError(Exception):
    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class ImdsClient:
    """Thread-safe: one session, used under a lock (IMDS calls are short and rare)."""

    def __init__(self, base_url: str, timeout: float = 5.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.events_url = f"{self.base_url}/metadata/scheduledevents"
        self._session = requests.Session()
        self._session.trust_env = False  # IMDS must never be reached through a proxy
        self._session.headers["Metadata"] = "true"
        self._lock = threading.Lock()

    @property
    def session(self) -> requests.Session:
        return self._session

    def _request(self, method: str, url: str, timeout: float | None, **kwargs: Any) -> bytes:
        try:
            with self._lock:
                response = self._session.request(
                    method, url, timeout=timeout or self.timeout, **kwargs
                )
                content = response.content
        except requests.Timeout:
            raise ImdsError("timeout", f"no answer within {timeout or self.timeout}s") from None
        except requests.ConnectionError as exc:
            raise ImdsError("connection", f"cannot connect: {clip(exc, 160)}") from None
        except requests.RequestException as exc:
            raise ImdsError("request", f"request failed: {clip(exc, 160)}") from None
        if response.status_code != 200:
            raise ImdsError(
                f"http-{response.status_code}",
                f"IMDS answered {response.status_code}: {content[:120]!r}",
            )
        return content

    def get_events_raw(self, timeout: float | None = None) -> bytes:
        """The Scheduled Events answer as bytes, to compare cheaply with the previous one."""
        return self._request(
            "GET", self.events_url, timeout, params={"api-version": SCHEDULED_EVENTS_API_VERSION}
        )

    def get_events(
        self, timeout: float | None = None
    ) -> tuple[dict[str, Any], ScheduledEventsDocument]:
        """A fresh, validated document: (raw dict as IMDS wrote it, parsed model)."""
        raw = self.get_events_raw(timeout)
        return parse_events(raw)

    def start_events(self, event_ids: list[str], timeout: float | None = None) -> tuple[int, str]:
        """POST StartRequests; return IMDS's status and body (200 is the only success)."""
        body = {"StartRequests": [{"EventId": event_id} for event_id in event_ids]}
        try:
            with self._lock:
                response = self._session.post(
                    self.events_url,
                    params={"api-version": SCHEDULED_EVENTS_API_VERSION},
                    json=body,
                    timeout=timeout or self.timeout,
                )
        except requests.Timeout:
            raise ImdsError("timeout", "StartRequests: no answer from IMDS") from None
        except requests.RequestException as exc:
            raise ImdsError("connection", f"StartRequests: {clip(exc, 160)}") from None
        return response.status_code, response.text[:500]

    def get_compute(self, timeout: float | None = None) -> dict[str, Any]:
        raw = self._request(
            "GET",
            f"{self.base_url}/metadata/instance/compute",
            timeout,
            params={"api-version": COMPUTE_API_VERSION, "format": "json"},
        )
        try:
            data = json.loads(raw)
        except ValueError:
            raise ImdsError("malformed", "compute metadata is not JSON") from None
        if not isinstance(data, dict) or not data.get("name"):
            raise ImdsError("malformed", "compute metadata has no VM name")
        return data


def parse_events(raw: bytes) -> tuple[dict[str, Any], ScheduledEventsDocument]:
    try:
        data = json.loads(raw)
    except (UnicodeDecodeError, ValueError):
        raise ImdsError("malformed", "the answer is not JSON") from None
    try:
        return data, parse_document(data)
    except DocumentError as exc:
        raise ImdsError("malformed", str(exc)) from None
