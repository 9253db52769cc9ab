"""POST a JSON body with bounded in-invocation retries, then hand the rest to Service Bus.

Service Bus redelivers an abandoned message at once (the Functions host has no retry
policy for Service Bus triggers), so the backoff that protects a throttled receiver has to
happen here: a few short waits honouring `Retry-After`, then `RetryableDeliveryError` so the
message is redelivered, and after the subscription's maxDeliveryCount it lands in the
dead-letter queue. A rejection that a retry cannot fix (400 and most 4xx) raises
`PermanentDeliveryError` at once, without retrying, carrying the receiver's own error text.
"""

from __future__ import annotations

import json
import logging
import random
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any, Protocol

import requests
from pydantic import BaseModel, ConfigDict

from functions.notify import reasons

log = logging.getLogger(__name__)

RETRYABLE_STATUS = frozenset({408, 425, 429, 500, 502, 503, 504})
ERROR_TEXT_LIMIT = 500


class DeliveryError(Exception):
    """A channel could not deliver a notification. `channel` names which one."""

    def __init__(
        self, channel: str, message: str, status: int | None = None, *, logged: bool = False
    ) -> None:
        super().__init__(f"{channel}: {message}")
        self.channel = channel
        self.status = status
        self.reason = message
        # True when `post_json` logged each attempt's failure already: not logged again.
        self.logged = logged


class RetryableDeliveryError(DeliveryError):
    """Throttled, a server error or no connection: let Service Bus redeliver."""


class PermanentDeliveryError(DeliveryError):
    """The receiver rejected the request itself; resending the same body cannot help."""


class RetryPolicy(BaseModel):
    """How long one invocation keeps trying before handing the message back to Service Bus."""

    model_config = ConfigDict(frozen=True)

    # About 30 s per invocation (waits of ~2, 4, 8, 16 s); with maxDeliveryCount 10 on the
    # channel subscriptions a receiver gets roughly five minutes to come back.
    attempts: int = 5
    backoff_seconds: float = 2.0  # first wait; doubles each time, with jitter (50-100 %)
    max_wait_seconds: float = 30.0  # cap for one wait, including a Retry-After
    connect_timeout: float = 5.0
    read_timeout: float = 15.0

    def longest_seconds(self) -> float:
        """The longest one `post_json` call can take: every attempt timing out and every
        wait at its cap. A delivery claim older than this has lost its poster."""
        requests_time = self.attempts * (self.connect_timeout + self.read_timeout)
        return requests_time + (self.attempts - 1) * self.max_wait_seconds

    def wait(self, attempt: int, retry_after: float | None) -> float:
        if retry_after is not None:
            return min(max(retry_after, 0.0), self.max_wait_seconds)
        base = self.backoff_seconds * (2 ** (attempt - 1))
        return min(base * (0.5 + random.random() / 2), self.max_wait_seconds)  # noqa: S311


def retry_after_seconds(value: str | None, now: datetime | None = None) -> float | None:
    """`Retry-After` is either delay-seconds or an HTTP-date (RFC 9110 §10.2.3)."""
    if not value:
        return None
    text = value.strip()
    if text.isdigit():
        return float(text)
    try:
        moment = parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return max((moment - (now or datetime.now(UTC))).total_seconds(), 0.0)


def error_text(response: requests.Response) -> str:
    """The receiver's own explanation, short and on one line, for the log and the DLQ."""
    try:
        data = response.json()
    except ValueError:
        text = response.text
    else:
        text = (
            json.dumps(data, separators=(",", ":")) if isinstance(data, dict | list) else str(data)
        )
    return " ".join(text.split())[:ERROR_TEXT_LIMIT] or f"HTTP {response.status_code}"


class Marks(Protocol):
    """Keys a channel marks to remember what it sent (PagerDuty: the keys it paged, so it
    resolves only those). The deliveries table keeps them fleet-wide
    (functions.store.deliveries.DeliveryLedger); `MemoryMarks`, one process's."""

    def mark(self, key: str) -> None: ...
    def marked(self, key: str) -> bool: ...


class MemoryMarks:
    """Marks in memory: for a sender without the deliveries table (the demo, tests)."""

    def __init__(self) -> None:
        self._keys: set[str] = set()
        self._lock = threading.Lock()

    def mark(self, key: str) -> None:
        with self._lock:
            self._keys.add(key)

    def marked(self, key: str) -> bool:
        with self._lock:
            return key in self._keys


class Poster(Protocol):
    """The part of requests.Session a sender uses (a paced session offers the same)."""

    def post(self, *args: Any, **kwargs: Any) -> requests.Response: ...


@dataclass
class Transport:
    """What a sender needs from the outside world; tests pass short waits and a fixed clock."""

    session: Poster
    policy: RetryPolicy = field(default_factory=RetryPolicy)
    sleep: Callable[[float], None] = time.sleep
    clock: Callable[[], datetime] = lambda: datetime.now(UTC)
    # Where senders mark what they sent when no deliveries table is given (dispatch passes it).
    marks: Marks = field(default_factory=MemoryMarks)
    # Slack's pacing (functions.notify.pacing.WebhookPacer); None: the process's own, one
    # post a second per webhook. The local demo paces its local receiver at its time scale.
    pacer: Any = None
    # A delivery claim's lease (functions.notify.dispatch), times this. The local demo plays
    # at its time scale (1/60 at 60x), as it holds a delivery through an outage: a claim
    # left by a delivery that lost its answer to an outage is then taken over when the
    # outage ends, as in Azure, not an hour of the demo's time later.
    lease_scale: float = 1.0


def post_json(
    transport: Transport,
    channel: str,
    url: str,
    body: bytes,
    *,
    headers: Mapping[str, str] | Callable[[], Mapping[str, str]] | None = None,
    success: Callable[[int], bool] = lambda status: 200 <= status < 300,
) -> requests.Response:
    """POST `body` until a success status, a permanent rejection, or the attempts run out.

    `headers` may be a callable so a signature is recomputed per attempt (a fresh timestamp).
    Each failed attempt is logged once, with its reason in words (functions.notify.reasons:
    the scheme, name resolution, a refused connection, TLS, a timeout, the HTTP status),
    and the error raised says it was (`logged`), so no caller logs it again. The URL is
    never logged, only its scheme, host and port: for Teams, Slack and webhooks its path
    is itself the secret, and any answer that echoes it is redacted.
    """
    policy, session = transport.policy, transport.session
    timeouts = (policy.connect_timeout, policy.read_timeout)
    last = "no attempt"
    for attempt in range(1, policy.attempts + 1):
        sent = dict(headers() if callable(headers) else (headers or {}))
        sent.setdefault("Content-Type", "application/json")
        retry_after: float | None = None
        try:
            response = session.post(url, data=body, headers=sent, timeout=timeouts)
        except (requests.ConnectionError, requests.Timeout) as exc:
            last = reasons.failure(exc, url, timeouts)
        except requests.RequestException as exc:  # a malformed URL: no retry can fix it
            why = reasons.failure(exc, url, timeouts)
            _log_attempt(channel, attempt, policy.attempts, why, "not retried: no retry can fix it")
            raise PermanentDeliveryError(channel, f"cannot send: {why}", logged=True) from None
        else:
            status = response.status_code
            if success(status):
                return response
            last = reasons.http_status(status, error_text(response), url)
            if status not in RETRYABLE_STATUS and not 500 <= status < 600:
                _log_attempt(channel, attempt, policy.attempts, last, "refused: not retried")
                raise PermanentDeliveryError(channel, last, status, logged=True)
            retry_after = retry_after_seconds(response.headers.get("Retry-After"))
        if attempt < policy.attempts:
            wait = policy.wait(attempt, retry_after)
            _log_attempt(channel, attempt, policy.attempts, last, f"retrying in {wait:.1f}s")
            transport.sleep(wait)
        else:
            _log_attempt(channel, attempt, policy.attempts, last, "no attempt left")
    raise RetryableDeliveryError(
        channel, f"gave up after {policy.attempts} attempts: {last}", logged=True
    )


def _log_attempt(channel: str, attempt: int, attempts: int, why: str, then: str) -> None:
    log.warning("%s: attempt %d/%d failed (%s); %s", channel, attempt, attempts, why, then)


def dumps(payload: Any) -> bytes:
    """Compact, stable JSON: what is signed is exactly what is sent."""
    return json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode()
