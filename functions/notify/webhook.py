"""Generic webhook: every transition as a CloudEvents 1.0 event, signed per Standard Webhooks.

Receivers verify with any Standard Webhooks library (https://www.standardwebhooks.com/):
  webhook-id:        the notification's message id (the same on every retry: dedupe on it)
  webhook-timestamp: unix seconds when this attempt was signed
  webhook-signature: v1,<base64 HMAC-SHA256(key, "{id}.{timestamp}.{body}")>
During a rotation (WEBHOOK_SECRET_PREVIOUS set) every message carries two signatures,
space-separated as the spec allows (`v1,<new> v1,<old>`): a receiver verifying with either
secret accepts it, so receivers move to the new secret one by one.
The key is the secret as the spec writes it: `whsec_<base64 of the key bytes>` is decoded;
a secret without that prefix is used as its own UTF-8 bytes (receivers then pass
"whsec_" + base64(secret) to their library). The body is a structured-mode CloudEvent
(`application/cloudevents+json`) whose `data` is the transition.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import logging
import time
from collections.abc import Callable
from typing import Any

from functions.model.event import Notification
from functions.notify import describe
from functions.notify.delivery import PermanentDeliveryError, Transport, dumps, post_json

log = logging.getLogger(__name__)

ID_HEADER = "webhook-id"
TIMESTAMP_HEADER = "webhook-timestamp"
SIGNATURE_HEADER = "webhook-signature"
SECRET_PREFIX = "whsec_"  # noqa: S105 - the spec's prefix, not a secret
CONTENT_TYPE = "application/cloudevents+json"
USER_AGENT = "scheduled-events-bridge-webhook/2"
SOURCE = "/scheduled-events-bridge"
TYPE_PREFIX = "scheduled-events-bridge."  # + the transition, e.g. ...decided


# One secret, or several (WEBHOOK_SECRET, then WEBHOOK_SECRET_PREVIOUS): one signature each.
Secrets = bytes | str | tuple[bytes | str, ...]


class WebhookSecretInvalid(ValueError):
    """WEBHOOK_SECRET starts with whsec_ but is not base64 of 24 to 64 bytes."""


def secret_key(secret: bytes | str) -> bytes:
    """The HMAC key the Standard Webhooks spec derives from a secret."""
    text = secret.decode() if isinstance(secret, bytes) else secret
    text = text.strip()
    if not text.startswith(SECRET_PREFIX):
        return text.encode()
    try:
        key = base64.b64decode(text[len(SECRET_PREFIX) :], validate=True)
    except (binascii.Error, ValueError):
        raise WebhookSecretInvalid("WEBHOOK_SECRET: whsec_ must be followed by base64") from None
    if not 24 <= len(key) <= 64:
        raise WebhookSecretInvalid("WEBHOOK_SECRET: the key must be 24 to 64 bytes")
    return key


def build_data(note: Notification) -> dict[str, Any]:
    """The transition itself: the CloudEvent's `data`."""
    return {
        "schema": 2,
        "transition": note.transition.value,
        "occurred_at": note.occurred_at.isoformat(),
        "event": note.event.imds_fields() if note.event else None,
        "scale_sets": list(note.event.scale_sets) if note.event else [],
        "availability_sets": list(note.event.availability_sets) if note.event else [],
        "resources_not_listed": note.event.unlisted if note.event else 0,
        "vm": note.vm,
        "decision": note.decision.model_dump(mode="json") if note.decision else None,
        "detail": note.detail,
        "waiting": note.waiting,
        "late": note.late,
        "links": note.links.model_dump(mode="json"),
        "occurrence": note.occurrence,
        "page": getattr(note, "page", None),
    }


def build_body(note: Notification) -> dict[str, Any]:
    """A CloudEvents 1.0 event in structured mode."""
    # `data` carries the raw values (JSON-escaped); the subject a receiver may show or log
    # is one printable line.
    subject = describe.plain(note.event.event_id if note.event else (note.vm or "fleet"))
    return {
        "specversion": "1.0",
        "id": note.message_id(),
        "source": SOURCE,
        "type": TYPE_PREFIX + note.transition.value,
        "subject": subject,
        "time": note.occurred_at.isoformat(),
        "datacontenttype": "application/json",
        "data": build_data(note),
    }


def signature(key: bytes, msg_id: str, timestamp: int, body: bytes) -> str:
    signed = f"{msg_id}.{timestamp}.".encode() + body
    return "v1," + base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()


def sign(secret: Secrets, msg_id: str, body: bytes, now: float | None = None) -> dict[str, str]:
    """The three Standard Webhooks headers for one attempt; one signature per secret."""
    stamp = int(time.time() if now is None else now)
    secrets = secret if isinstance(secret, tuple) else (secret,)
    return {
        ID_HEADER: msg_id,
        TIMESTAMP_HEADER: str(stamp),
        SIGNATURE_HEADER: " ".join(signature(secret_key(s), msg_id, stamp, body) for s in secrets),
    }


def send(
    note: Notification,
    *,
    url: str,
    secret: Secrets,
    transport: Transport,
    wall_clock: Callable[[], float] = time.time,
) -> bool:
    body = dumps(build_body(note))
    try:
        for each in secret if isinstance(secret, tuple) else (secret,):
            secret_key(each)  # ChannelSettings keeps the channel off with such a secret
    except WebhookSecretInvalid as exc:
        raise PermanentDeliveryError("webhook", str(exc)) from None

    def headers() -> dict[str, str]:
        # Re-signed on each attempt, so a retry after a long Retry-After is not stale.
        return {
            **sign(secret, note.message_id(), body, wall_clock()),
            "Content-Type": CONTENT_TYPE,
            "User-Agent": USER_AGENT,
        }

    post_json(transport, "webhook", url, body, headers=headers)
    log.info("webhook: delivered %s", note.message_id())
    return True
