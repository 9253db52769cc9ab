"""The plain function each channel's Service Bus handler calls: parse, route, send.

Failures are sorted into what Service Bus should do with the message:
- returns normally: delivered, or nothing to send (the message is completed);
- RetryableDeliveryError: redeliver (after this invocation's own short retries);
- PermanentDeliveryError / InvalidNotification: the body can never succeed. A function
  bound to azure.functions.ServiceBusMessage cannot settle (dead-letter) its message, and
  the preview SDK-type binding that could is not worth a beta dependency, so it is raised
  as well, without any retry; each redelivery fails the same way at once (the channel's
  rejection is remembered per worker so the receiver is not asked again) and after
  maxDeliveryCount Service Bus moves it to the subscription's dead-letter queue. The
  reason is logged each time.
"""

from __future__ import annotations

import logging
from collections import OrderedDict

from pydantic import ValidationError

from functions.model.event import Notification
from functions.notify import pagerduty, teams, webhook
from functions.notify.delivery import DeliveryError, PermanentDeliveryError, Transport
from functions.notify.settings import ChannelSettings

log = logging.getLogger(__name__)

CHANNELS = ("teams", "pagerduty", "webhook")
_REJECTED_LIMIT = 1000


class InvalidNotification(PermanentDeliveryError):
    """The message on the topic is not a Notification: no channel can ever send it."""


class Rejections:
    """Message ids a channel rejected permanently, so redeliveries fail fast (bounded)."""

    def __init__(self, limit: int = _REJECTED_LIMIT) -> None:
        self._seen: OrderedDict[str, PermanentDeliveryError] = OrderedDict()
        self._limit = limit

    def get(self, key: str) -> PermanentDeliveryError | None:
        return self._seen.get(key)

    def add(self, key: str, error: PermanentDeliveryError) -> None:
        self._seen[key] = error
        while len(self._seen) > self._limit:
            self._seen.popitem(last=False)


_off_logged: set[str] = set()


def parse(channel: str, body: bytes | str) -> Notification:
    try:
        return Notification.from_json(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first.get("loc", ())) or "body"
        raise InvalidNotification(
            channel, f"not a notification ({exc.error_count()} errors; {where}: {first['msg']})"
        ) from None


def deliver(
    channel: str,
    body: bytes | str,
    *,
    settings: ChannelSettings,
    transport: Transport,
    rejections: Rejections | None = None,
) -> bool:
    """Send one topic message on one channel. True when something was posted."""
    off = settings.off_reason(channel)
    if off is not None:
        if channel not in _off_logged:
            _off_logged.add(channel)
            log.info("%s: channel off (%s)", channel, off)
        return False
    note = parse(channel, body)
    if note.decision is not None and channel not in note.decision.channels:
        log.info(
            "%s: %s not routed here by rule %s", channel, note.message_id(), note.decision.rule
        )
        return False
    key = f"{channel}:{note.message_id()}"
    if rejections is not None and (earlier := rejections.get(key)) is not None:
        log.error("%s: %s was rejected before (%s); failing fast", channel, key, earlier.reason)
        raise earlier
    try:
        return _send(channel, note, settings, transport)
    except PermanentDeliveryError as exc:
        log.error(
            "%s: %s rejected permanently, bound for the dead-letter queue: %s",
            channel,
            note.message_id(),
            exc.reason,
        )
        if rejections is not None:
            rejections.add(key, exc)
        raise
    except DeliveryError as exc:
        log.warning("%s: %s not delivered yet: %s", channel, note.message_id(), exc.reason)
        raise


def _send(
    channel: str, note: Notification, settings: ChannelSettings, transport: Transport
) -> bool:
    if channel == "teams":
        assert settings.teams_webhook_url is not None
        return teams.send(
            note, url=settings.teams_webhook_url.get_secret_value(), transport=transport
        )
    if channel == "pagerduty":
        assert settings.pagerduty_routing_key is not None
        return pagerduty.send(
            note,
            routing_key=settings.pagerduty_routing_key.get_secret_value(),
            url=settings.pagerduty_events_url,
            transport=transport,
        )
    assert settings.webhook_url is not None and settings.webhook_secret is not None
    return webhook.send(
        note,
        url=settings.webhook_url.get_secret_value(),
        secret=settings.webhook_secret.get_secret_value().encode(),
        transport=transport,
    )
