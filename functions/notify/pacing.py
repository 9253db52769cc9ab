"""One post at a time per webhook, at most about one a second (Slack's incoming webhooks).

Slack's rate limits allow an incoming webhook "1 per second" with short bursts, answer 429
with `Retry-After` past that, and warn that a webhook that keeps getting 429s may be
disabled (docs/conformance.md, issue 38). The notify trigger runs up to
`maxConcurrentCalls` (16) messages at once on an instance, so a maintenance that announces
many events at once posted them all in the same instant. `WebhookPacer` spaces the posts
to each webhook by `interval` seconds, in the order they asked, and a 429's `Retry-After`
holds every post to that webhook in this process, not only the retry of the one that got
it. Pacing is per process (per Functions instance): instances do not share it, and a 429
from Slack still slows each of them down.

Webhooks are told apart by a hash of their URL: the URL itself is the secret.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import requests

from functions.notify.delivery import Poster, retry_after_seconds

SLACK_INTERVAL_SECONDS = 1.0
EPSILON = 0.001  # waits shorter than a millisecond are clock noise, not a turn to wait for


class WebhookPacer:
    """Hands out send times per webhook: `interval` apart, never before a `Retry-After`."""

    def __init__(
        self, interval: float = SLACK_INTERVAL_SECONDS, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.interval, self.clock = interval, clock
        self._lock = threading.Lock()
        self._next: dict[str, float] = {}  # webhook key -> earliest time of its next post
        self._held: dict[str, float] = {}  # webhook key -> end of its last Retry-After

    @staticmethod
    def key(url: str) -> str:
        return hashlib.sha256(url.encode()).hexdigest()[:16]

    def reserve(self, url: str) -> float:
        """Take the webhook's next free slot; the seconds to wait for it."""
        key = self.key(url)
        with self._lock:
            now = self.clock()
            at = max(now, self._next.get(key, now), self._held.get(key, now))
            self._next[key] = at + self.interval
            return at - now

    def hold(self, url: str, seconds: float) -> None:
        """A 429 said `Retry-After: seconds`: no post to this webhook before then."""
        key = self.key(url)
        with self._lock:
            until = self.clock() + max(seconds, 0.0)
            self._held[key] = max(self._held.get(key, until), until)

    def held_for(self, url: str) -> float:
        """Seconds left of the webhook's last Retry-After (0 if none)."""
        with self._lock:
            return max(self._held.get(self.key(url), 0.0) - self.clock(), 0.0)


class PacedSession:
    """The `session` of a delivery.Transport whose posts go through a `WebhookPacer`: each
    post waits its webhook's turn (with the transport's `sleep`), and a 429 holds the
    webhook for its Retry-After. The post that got the 429 is not held twice: post_json
    already waits that Retry-After before its next attempt."""

    def __init__(
        self, session: Poster, pacer: WebhookPacer, sleep: Callable[[float], None]
    ) -> None:
        self.session, self.pacer, self.sleep = session, pacer, sleep
        self._retry_at: float | None = None  # when this post's own Retry-After ends

    def post(self, url: str, **kwargs: Any) -> requests.Response:
        wait = self.pacer.reserve(url)
        if self._retry_at is not None:
            # post_json has slept this Retry-After already (on the pacer's clock, the part
            # not yet passed is what a recorded, instant sleep skipped): not twice.
            wait -= max(self._retry_at - self.pacer.clock(), 0.0)
            self._retry_at = None
            if wait > EPSILON:
                self.sleep(wait)
        else:
            if wait > EPSILON:
                self.sleep(wait)
            # Another post got a 429 while this one waited for its slot: a new slot after it.
            while (left := self.pacer.held_for(url)) > EPSILON:
                self.sleep(left)
                if (wait := self.pacer.reserve(url)) > EPSILON:
                    self.sleep(wait)
        response = self.session.post(url, **kwargs)
        if response.status_code == 429:
            headers: Mapping[str, str] = response.headers
            held = retry_after_seconds(headers.get("Retry-After"))
            held = SLACK_INTERVAL_SECONDS if held is None else held
            self.pacer.hold(url, held)
            self._retry_at = self.pacer.clock() + held
        return response


# One pacer for the process: every Slack post of this Functions instance shares it.
SLACK_PACER = WebhookPacer()
