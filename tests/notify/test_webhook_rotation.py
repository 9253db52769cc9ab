"""WEBHOOK_SECRET rotation: with WEBHOOK_SECRET_PREVIOUS set, every webhook and every HTTP
drain request carries one signature per secret (`v1,<new> v1,<old>`, as Standard Webhooks
allows), so receivers verifying with either secret pass (checked with the standardwebhooks
library, which no one here wrote, and with the README's recipe); a third secret fails."""

from __future__ import annotations

import base64

import pytest
import requests
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from functions.model.event import Transition
from functions.notify import dispatch
from functions.notify.delivery import Transport
from functions.notify.settings import ChannelSettings
from functions.terminate.workflow import run_drain
from tests.notify.factory import event, note
from tests.notify.receiver import Answer, running
from tests.notify.webhook_recipe import readme_verify
from tests.terminate.conftest import (  # noqa: F401 - the drain store fixtures
    Harness,
    drains,
    harness,
    settings,
    terminate_note,
)

OLD = "whsec_" + base64.b64encode(b"o" * 32).decode()
NEW = "whsec_" + base64.b64encode(b"n" * 32).decode()
OTHER = "whsec_" + base64.b64encode(b"x" * 32).decode()


def deliver(channel: ChannelSettings, url: str) -> None:
    dispatch.deliver(
        "webhook",
        note(Transition.APPROVED, event()).to_json(),
        settings=channel,
        transport=Transport(session=requests.Session()),
    )


def test_a_webhook_during_a_rotation_verifies_with_either_secret() -> None:
    with running() as receiver:
        deliver(
            ChannelSettings(
                webhook_url=f"{receiver.url}/hook",
                webhook_secret=NEW,
                webhook_secret_previous=OLD,
            ),
            receiver.url,
        )
        (request,) = receiver.requests
    headers = dict(request.headers)
    assert len(headers["webhook-signature"].split(" ")) == 2
    for secret in (NEW, OLD):
        assert Webhook(secret).verify(request.body, headers)["id"] == "event:EV-1:approved"
        assert readme_verify(secret, headers, request.body)
    with pytest.raises(WebhookVerificationError):
        Webhook(OTHER).verify(request.body, headers)


def test_without_a_previous_secret_one_signature_and_the_old_secret_fails() -> None:
    with running() as receiver:
        deliver(ChannelSettings(webhook_url=f"{receiver.url}/h", webhook_secret=NEW), receiver.url)
        (request,) = receiver.requests
    headers = dict(request.headers)
    assert len(headers["webhook-signature"].split(" ")) == 1
    Webhook(NEW).verify(request.body, headers)
    with pytest.raises(WebhookVerificationError):
        Webhook(OLD).verify(request.body, headers)


@pytest.mark.parametrize(
    ("previous", "problem"),
    [
        ("whsec_not*base64", "WEBHOOK_SECRET_PREVIOUS: whsec_ must be followed by base64"),
        ("@Microsoft.KeyVault(SecretUri=https://kv.vault.azure.net/secrets/x)", "unresolved"),
        (NEW, None),  # the same secret twice: one signature, nothing to report
    ],
)
def test_an_unusable_previous_secret_signs_once_and_is_reported(previous, problem) -> None:
    channel = ChannelSettings(
        webhook_url="https://example.org/h", webhook_secret=NEW, webhook_secret_previous=previous
    )
    assert channel.webhook_secrets() == (NEW.encode(),)
    assert channel.off_reason("webhook") is None  # the channel stays on
    if problem is None:
        assert channel.previous_problem() is None and not channel.misconfigured("webhook")
    else:
        assert problem in channel.previous_problem() and channel.misconfigured("webhook")


def test_the_drain_hook_during_a_rotation_verifies_with_either_secret(harness: Harness) -> None:  # noqa: F811
    secrets = ChannelSettings(webhook_secret=NEW, webhook_secret_previous=OLD).webhook_secrets()
    drained = terminate_note()
    with running(Answer(204)) as hook:
        run_drain(
            drained, settings(http_url=f"{hook.url}/drain"), harness.context(webhook_secret=secrets)
        )
        (request,) = hook.requests
    headers = dict(request.headers)
    for secret in (NEW, OLD):
        Webhook(secret).verify(request.body, headers)
    with pytest.raises(WebhookVerificationError):
        Webhook(OTHER).verify(request.body, headers)
