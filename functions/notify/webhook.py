"""Generic webhook: every transition as signed JSON, for whatever the customer runs.

Signed with the relay callback's HMAC scheme (functions.signing.signature) under webhook
header names, so there is one scheme to audit:
  X-Bridge-Timestamp: <unix seconds>
  X-Bridge-Signature: v1=<hex HMAC-SHA256(WEBHOOK_SECRET, TS "\\n" "POST" "\\n" PATH "\\n" BODY)>
PATH is the request target as the receiver sees it (path, plus "?query" if the URL has one).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from functions.model.event import Notification
from functions.notify.delivery import Transport, dumps, post_json
from functions.signing import signature

log = logging.getLogger(__name__)

TIMESTAMP_HEADER = "X-Bridge-Timestamp"
SIGNATURE_HEADER = "X-Bridge-Signature"
DELIVERY_HEADER = "X-Bridge-Delivery"  # the notification's message id: receivers dedupe on it
TRANSITION_HEADER = "X-Bridge-Transition"
USER_AGENT = "scheduled-events-bridge-webhook/1"


def build_body(note: Notification) -> dict[str, Any]:
    return {
        "schema": 1,
        "id": note.message_id(),
        "transition": note.transition.value,
        "occurred_at": note.occurred_at.isoformat(),
        "event": note.event.imds_fields() if note.event else None,
        "scale_sets": list(note.event.scale_sets) if note.event else [],
        "availability_sets": list(note.event.availability_sets) if note.event else [],
        "vm": note.vm,
        "decision": note.decision.model_dump(mode="json") if note.decision else None,
        "detail": note.detail,
        "links": note.links.model_dump(mode="json"),
        "occurrence": note.occurrence,
        "page": getattr(note, "page", None),
    }


def signed_path(url: str) -> str:
    parts = urlsplit(url)
    path = parts.path or "/"
    return f"{path}?{parts.query}" if parts.query else path


def sign(secret: bytes, url: str, body: bytes, now: float | None = None) -> dict[str, str]:
    stamp = int(time.time() if now is None else now)
    return {
        TIMESTAMP_HEADER: str(stamp),
        SIGNATURE_HEADER: signature(secret, stamp, "POST", signed_path(url), body),
    }


def send(
    note: Notification,
    *,
    url: str,
    secret: bytes,
    transport: Transport,
    wall_clock: Callable[[], float] = time.time,
) -> bool:
    body = dumps(build_body(note))

    def headers() -> dict[str, str]:
        # Re-signed on each attempt, so a retry after a long Retry-After is not stale.
        return {
            **sign(secret, url, body, wall_clock()),
            DELIVERY_HEADER: note.message_id(),
            TRANSITION_HEADER: note.transition.value,
            "User-Agent": USER_AGENT,
        }

    post_json(transport, "webhook", url, body, headers=headers)
    log.info("webhook: delivered %s", note.message_id())
    return True
