"""Webhook bodies (CloudEvents 1.0) and signatures (Standard Webhooks), checked with the
README's recipe and with the standardwebhooks library a receiver would use."""

from __future__ import annotations

import base64
import time

import pytest
import requests
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from functions.model.event import Transition
from functions.notify import webhook
from functions.notify.delivery import PermanentDeliveryError, Transport
from functions.notify.settings import ChannelSettings
from tests.notify.factory import decision, event, note
from tests.notify.receiver import running
from tests.notify.webhook_recipe import readme_verify

KEY = b"0123456789abcdef0123456789abcdef"
SECRET = "whsec_" + base64.b64encode(KEY).decode()


def test_body_is_a_cloudevent_carrying_the_transition() -> None:
    body = webhook.build_body(note(Transition.DECIDED, event(), decision()))
    assert body["specversion"] == "1.0"
    assert body["id"] == "event:EV-1:decided"
    assert body["source"] == "/scheduled-events-bridge"
    assert body["type"] == "scheduled-events-bridge.decided"
    assert body["subject"] == "EV-1"
    assert body["time"] == "2026-11-21T10:00:00+00:00"
    assert body["datacontenttype"] == "application/json"
    data = body["data"]
    assert data["transition"] == "decided"
    assert data["event"]["EventId"] == "EV-1"
    assert data["event"]["EventType"] == "Reboot"
    assert data["event"]["NotBefore"] == "Sat, 21 Nov 2026 10:12:00 GMT"
    assert data["decision"]["action"] == "hold"
    assert data["links"]["status_url"] == "https://bridge.example/api/status"


def _deliver(secret: bytes | str, path: str = "/hooks/bridge?tenant=a"):
    with running() as receiver:
        webhook.send(
            note(Transition.APPROVED, event()),
            url=f"{receiver.url}{path}",
            secret=secret if isinstance(secret, bytes) else secret.encode(),
            transport=Transport(session=requests.Session()),
        )
        (request,) = receiver.requests
    return request


def test_a_delivered_webhook_verifies_with_the_library_and_the_readme_recipe() -> None:
    request = _deliver(SECRET)
    assert request.headers["Content-Type"] == "application/cloudevents+json"
    assert request.headers["webhook-id"] == "event:EV-1:approved"
    # What a receiver does with the Standard Webhooks library: it raises unless genuine.
    payload = Webhook(SECRET).verify(request.body, dict(request.headers))
    assert payload["type"] == "scheduled-events-bridge.approved"
    assert payload["data"]["transition"] == "approved"
    assert readme_verify(SECRET, request.headers, request.body)
    other = "whsec_" + base64.b64encode(b"another-key-0123456789abcdef").decode()
    with pytest.raises(WebhookVerificationError):
        Webhook(other).verify(request.body, dict(request.headers))
    with pytest.raises(WebhookVerificationError):
        Webhook(SECRET).verify(request.body + b" ", dict(request.headers))
    assert not readme_verify(other, request.headers, request.body)
    assert not readme_verify(SECRET, request.headers, request.body + b" ")
    tampered = {**request.headers, "webhook-id": "event:EV-1:decided"}
    assert not readme_verify(SECRET, tampered, request.body)


def test_a_secret_without_the_prefix_is_its_own_bytes() -> None:
    raw = b"plain-secret-from-before-0123"
    request = _deliver(raw)
    as_spec = "whsec_" + base64.b64encode(raw).decode()
    assert (
        Webhook(as_spec).verify(request.body, dict(request.headers))["id"] == "event:EV-1:approved"
    )
    assert readme_verify(as_spec, request.headers, request.body)


def test_a_stale_signature_fails() -> None:
    body = b"{}"
    stale = webhook.sign(SECRET, "m1", body, now=time.time() - 600)
    assert not readme_verify(SECRET, stale, body)
    with pytest.raises(WebhookVerificationError):
        Webhook(SECRET).verify(body, stale)
    fresh = webhook.sign(SECRET, "m1", body)
    assert readme_verify(SECRET, fresh, body)
    Webhook(SECRET).verify(body, fresh)


@pytest.mark.parametrize(
    "bad", ["whsec_not base64!", "whsec_" + base64.b64encode(b"short").decode()]
)
def test_a_malformed_spec_secret_keeps_the_channel_off_and_sends_nothing(bad: str) -> None:
    settings = ChannelSettings(webhook_url="https://x.example/h", webhook_secret=bad)
    assert "refusing to send unsigned" in (settings.off_reason("webhook") or "")
    with running() as receiver:
        with pytest.raises(PermanentDeliveryError, match="WEBHOOK_SECRET"):
            webhook.send(
                note(Transition.APPROVED, event()),
                url=receiver.url,
                secret=bad.encode(),
                transport=Transport(session=requests.Session()),
            )
        assert receiver.requests == []


def test_the_readme_recipe_is_the_tested_one() -> None:
    import inspect
    from pathlib import Path

    from tests.notify import webhook_recipe

    root = Path(__file__).resolve().parents[2]
    source = inspect.getsource(webhook_recipe.readme_verify)
    body = [line.strip() for line in source.splitlines()[2:] if line.strip()]
    for readme in (root / "docs" / "settings.md", root / "functions" / "README.md"):
        text = readme.read_text()
        for line in body:
            assert line in text, f"{readme.name}: {line}"
