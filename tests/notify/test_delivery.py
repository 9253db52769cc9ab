"""Retries against a real local receiver: throttling, server errors, rejections, no server."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
import requests

from functions.notify.delivery import (
    PermanentDeliveryError,
    RetryableDeliveryError,
    RetryPolicy,
    Transport,
    post_json,
    retry_after_seconds,
)
from tests.conftest import free_port
from tests.notify.receiver import Answer, running


def transport(waits: list[float], attempts: int = 4) -> Transport:
    return Transport(
        session=requests.Session(),
        policy=RetryPolicy(attempts=attempts, backoff_seconds=0.5, max_wait_seconds=7),
        sleep=waits.append,
    )


def test_throttled_then_accepted_is_delivered_once_honouring_retry_after() -> None:
    waits: list[float] = []
    with running(Answer(202, {"status": "success"})) as receiver:
        receiver.script = [
            Answer(429, {"message": "slow down"}, {"Retry-After": "3"}),
            Answer(500, {"message": "oops"}),
        ]
        response = post_json(transport(waits), "pagerduty", receiver.url, b"{}")
        assert response.status_code == 202
        assert len(receiver.requests) == 3
    assert waits[0] == 3.0
    assert 0.25 <= waits[1] <= 1.0  # backoff with jitter, no Retry-After


def test_retry_after_is_capped() -> None:
    waits: list[float] = []
    with running(Answer(200)) as receiver:
        receiver.script = [Answer(503, None, {"Retry-After": "3600"})]
        post_json(transport(waits), "teams", receiver.url, b"{}")
    assert waits == [7]


def test_persistent_server_errors_hand_back_to_service_bus() -> None:
    waits: list[float] = []
    with running(Answer(502, {"error": "bad gateway"})) as receiver:
        with pytest.raises(RetryableDeliveryError, match="gave up after 3 attempts: HTTP 502"):
            post_json(transport(waits, attempts=3), "webhook", receiver.url, b"{}")
        assert len(receiver.requests) == 3
    assert len(waits) == 2


def test_a_rejection_is_permanent_at_once_with_the_receivers_message() -> None:
    waits: list[float] = []
    rejection = {"status": "invalid event", "message": "Event object is invalid",
                 "errors": ["'payload.severity' is invalid"]}  # fmt: skip
    with running(Answer(400, rejection)) as receiver:
        with pytest.raises(PermanentDeliveryError) as caught:
            post_json(transport(waits), "pagerduty", receiver.url, b"{}")
        assert len(receiver.requests) == 1
    assert caught.value.status == 400
    assert "payload.severity" in caught.value.reason
    assert waits == []


def test_no_server_is_retryable() -> None:
    url = f"http://127.0.0.1:{free_port()}/"
    with pytest.raises(RetryableDeliveryError, match="refused the connection"):
        post_json(transport([], attempts=2), "teams", url, b"{}")


def test_retry_after_forms() -> None:
    now = datetime(2026, 11, 21, 10, 0, tzinfo=UTC)
    later = (now + timedelta(seconds=90)).strftime("%a, %d %b %Y %H:%M:%S GMT")
    assert retry_after_seconds("120") == 120
    assert retry_after_seconds(later, now) == 90
    assert retry_after_seconds("soon") is None
    assert retry_after_seconds(None) is None


def test_a_malformed_url_is_permanent() -> None:
    with pytest.raises(PermanentDeliveryError, match="the URL has no scheme"):
        post_json(transport([]), "pagerduty", "events.example/v2/enqueue", b"{}")
