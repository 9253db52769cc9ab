"""Slack posts paced per webhook (issue 38): Slack allows an incoming webhook about one
message a second, answers 429 with Retry-After past that, and may disable a webhook that
keeps getting 429s. Checked against a real local receiver that enforces that rate the way
hooks.slack.com does (local.slack_receiver, `enforce_rate`), with concurrent posts as the
notify trigger makes them (maxConcurrentCalls per instance)."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import requests

from functions.model.event import Transition
from functions.notify import slack
from functions.notify.delivery import RetryPolicy, Transport
from functions.notify.pacing import WebhookPacer
from local.slack_receiver import SlackReceiver
from tests.notify.factory import event, note

INTERVAL = 0.8  # the test's "one a second", a little shorter
# The receiver refuses posts closer than half of it: arrival times jitter around the
# pacer's slots (by over 0.1 s on a busy CI machine), and Slack too allows short bursts.
ENFORCED = INTERVAL / 2


@pytest.fixture
def receiver() -> Iterator[SlackReceiver]:
    with SlackReceiver() as running:
        running.enforce_rate(ENFORCED, retry_after=1)
        yield running  # type: ignore[misc]


class _SlotsTaken(WebhookPacer):
    """The pacer as shipped, noting each slot it hands out exactly: the time its clock
    read inside `reserve`, plus the wait it returned."""

    def __init__(self, interval: float) -> None:
        super().__init__(interval, clock=self._read)
        self.slots: list[float] = []
        self._taking = threading.Lock()
        self._read_at = 0.0

    def _read(self) -> float:
        self._read_at = time.monotonic()
        return self._read_at

    def reserve(self, url: str) -> float:
        with self._taking:
            wait = super().reserve(url)
            self.slots.append(self._read_at + wait)
        return wait


class _SentAt(requests.Session):
    """A session noting when each post leaves, on the pacer's clock (time.monotonic)."""

    def __init__(self, sent: list[float]) -> None:
        super().__init__()
        self.sent = sent

    def post(self, *args: Any, **kwargs: Any) -> requests.Response:  # type: ignore[override]
        self.sent.append(time.monotonic())
        return super().post(*args, **kwargs)


def _post_at_once(
    receiver: SlackReceiver, pacer: WebhookPacer, count: int, sent: list[float] | None = None
) -> None:
    """`count` notifications posted from as many threads at the same instant."""
    start, errors = threading.Barrier(count), []
    sent = [] if sent is None else sent

    def post(i: int) -> None:
        transport = Transport(_SentAt(sent), RetryPolicy(attempts=5, backoff_seconds=0.05))
        start.wait()
        try:
            slack.send(
                note(Transition.APPROVED, event(f"EV-{i}")),
                url=receiver.url,
                transport=transport,
                pacer=pacer,
            )
        except Exception as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=post, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert not errors, errors


def test_the_receiver_refuses_posts_faster_than_its_rate(receiver: SlackReceiver) -> None:
    """The stand-in enforces what it says (so the next test can fail): two posts at once
    without pacing, the second is 429 rate_limited with Retry-After. A minute apart, so
    that a busy machine cannot space two sequential posts beyond it (it did: 0.2 s)."""
    receiver.enforce_rate(60.0, retry_after=1)
    for i in range(2):
        requests.post(receiver.url, json={"text": f"hello {i}"}, timeout=5)
    assert [r.status for r in receiver.received] == [200, 429]


def test_concurrent_posts_to_one_webhook_go_out_one_at_a_time(receiver: SlackReceiver) -> None:
    """Four notifications at once: every post is accepted the first time (no 429 at all,
    from a receiver that refuses two closer than half the interval), the pacer hands out
    slots the interval apart, and no post leaves before its slot. Judged on the pacer's
    slots and the posts' departures, not on arrival gaps: on a busy machine a post can
    arrive late and the next on time (a CI run measured a 0.27 s gap between slots 0.4 s
    apart)."""
    pacer, sent = _SlotsTaken(INTERVAL), []
    _post_at_once(receiver, pacer, 4, sent)
    assert [r.status for r in receiver.received] == [200] * 4
    slots = sorted(pacer.slots)
    assert len(slots) == 4 and len(sent) == 4
    assert all(b - a >= INTERVAL - 1e-6 for a, b in itertools.pairwise(slots)), slots
    # The i-th post to leave left no earlier than the i-th slot (each waits for its own).
    assert all(left >= slot - 0.002 for left, slot in zip(sorted(sent), slots, strict=True))


def test_a_retry_after_holds_every_post_to_that_webhook(receiver: SlackReceiver) -> None:
    """Slack rate-limits the first post (429, Retry-After 1): no other post reaches the
    webhook before that second is over, not only the retry of the one that got it."""
    receiver.rate_limit_next(1, retry_after=1)
    _post_at_once(receiver, WebhookPacer(INTERVAL), 3)
    received = receiver.received
    limited = [r for r in received if r.status == 429]
    assert len(limited) == 1, [r.status for r in received]
    after = [r.at - limited[0].at for r in received if r.at > limited[0].at]
    assert len(after) == 3 and min(after) >= 1.0 - 0.05, after
    assert [r.status for r in received if r.at > limited[0].at] == [200, 200, 200]


def test_a_transports_pacer_is_the_one_its_posts_wait_for(receiver: SlackReceiver) -> None:
    """The local demo paces its local receiver at its time scale (local.channels.
    slack_pacer): posts sent through a transport with a pacer of its own keep that pace,
    not the process's one a second."""
    pacer = WebhookPacer(INTERVAL)
    transport = Transport(requests.Session(), RetryPolicy(backoff_seconds=0.05), pacer=pacer)
    for i in range(3):
        slack.send(
            note(Transition.APPROVED, event(f"EV-{i}")), url=receiver.url, transport=transport
        )
    received = receiver.received
    assert [r.status for r in received] == [200] * 3
    gaps = [b.at - a.at for a, b in itertools.pairwise(received)]
    assert min(gaps) >= INTERVAL - 0.1 and max(gaps) < 0.9, gaps


def test_webhooks_are_paced_apart_and_a_hold_moves_the_next_slot() -> None:
    now = [100.0]
    pacer = WebhookPacer(1.0, clock=lambda: now[0])
    assert [pacer.reserve("https://hooks/a") for _ in range(3)] == [0.0, 1.0, 2.0]
    assert pacer.reserve("https://hooks/b") == 0.0  # another webhook: its own pace
    pacer.hold("https://hooks/b", 5.0)
    assert pacer.reserve("https://hooks/b") == 5.0
    now[0] += 10
    assert pacer.reserve("https://hooks/a") == 0.0  # idle long enough: no wait


def test_the_process_pacer_keys_webhooks_by_hash_not_by_url() -> None:
    """The URL is the webhook's secret: the pacer keeps only a hash of it."""
    pacer = WebhookPacer()
    secret = "https://hooks.slack.com/services/T0/B0/very-secret-token"
    pacer.reserve(secret)
    assert all("secret" not in key for key in pacer._next)
