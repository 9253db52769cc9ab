"""Webhook bodies and signatures, checked with the recipe the README gives receivers."""

from __future__ import annotations

import time

import pytest
import requests

from functions import signing
from functions.model.event import Transition
from functions.notify import webhook
from functions.notify.delivery import Transport
from tests.notify.factory import decision, event, note
from tests.notify.receiver import running
from tests.notify.webhook_recipe import readme_verify

SECRET = b"webhook-secret-0123456789"


def test_body_carries_transition_event_decision_and_links() -> None:
    body = webhook.build_body(note(Transition.DECIDED, event(), decision()))
    assert body["transition"] == "decided"
    assert body["id"] == "EV-1:decided"
    assert body["occurred_at"] == "2026-11-21T10:00:00+00:00"
    assert body["event"]["EventId"] == "EV-1"
    assert body["event"]["EventType"] == "Reboot"
    assert body["event"]["NotBefore"] == "Sat, 21 Nov 2026 10:12:00 GMT"
    assert body["decision"]["action"] == "hold"
    assert body["links"]["status_url"] == "https://bridge.example/api/status"


def test_a_delivered_webhook_verifies_with_the_readme_recipe() -> None:
    with running() as receiver:
        url = f"{receiver.url}/hooks/bridge?tenant=a"
        webhook.send(
            note(Transition.APPROVED, event()),
            url=url,
            secret=SECRET,
            transport=Transport(session=requests.Session()),
        )
        (request,) = receiver.requests
    assert request.path == "/hooks/bridge?tenant=a"
    assert readme_verify(SECRET, request.headers, request.path, request.body)
    assert request.headers["X-Bridge-Delivery"] == "EV-1:approved"
    assert request.headers["X-Bridge-Transition"] == "approved"
    assert request.json()["transition"] == "approved"
    # The same scheme as relay callbacks: functions.signing verifies it under the webhook names.
    renamed = {
        signing.TIMESTAMP_HEADER: request.headers["X-Bridge-Timestamp"],
        signing.SIGNATURE_HEADER: request.headers["X-Bridge-Signature"],
    }
    signing.verify(SECRET, renamed, "POST", request.path, request.body)
    assert not readme_verify(b"another-secret-0000000", request.headers, request.path, request.body)
    assert not readme_verify(SECRET, request.headers, request.path, request.body + b" ")
    assert not readme_verify(SECRET, request.headers, "/other", request.body)


def test_a_stale_signature_fails_the_recipe() -> None:
    body = b"{}"
    headers = webhook.sign(SECRET, "https://x.example/h", body, now=time.time() - 600)
    assert not readme_verify(SECRET, headers, "/h", body)
    fresh = webhook.sign(SECRET, "https://x.example/h", body)
    assert readme_verify(SECRET, fresh, "/h", body)


@pytest.mark.parametrize(
    ("url", "path"),
    [("https://x.example", "/"), ("https://x.example/a/b", "/a/b"), ("http://h/p?q=1", "/p?q=1")],
)
def test_signed_path_is_what_the_receiver_sees(url: str, path: str) -> None:
    assert webhook.signed_path(url) == path
