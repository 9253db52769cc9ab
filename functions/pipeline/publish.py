"""Where announcements go: the `notifications` topic in Azure, callables locally.

Ingest, the approver and the watchdog only know the `Publisher` protocol, so the same code
runs in the function app (Service Bus topic) and in the local host and tests (in-memory
fan-out to registered handlers).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any, Protocol
from uuid import UUID

from functions import telemetry
from functions.model.event import Notification
from functions.servicebus import locked, topic_sender

log = logging.getLogger(__name__)


class Publisher(Protocol):
    def publish(self, notification: Notification) -> None:
        """Deliver one announcement; raise if it could not be handed over."""


def application_properties(
    notification: Notification,
) -> dict[str | bytes, int | float | bytes | bool | str | UUID]:
    """What a topic subscription can filter on without reading the body."""
    decision = notification.decision
    return {
        "transition": notification.transition.value,
        "severity": decision.severity if decision else "warning",
        "page": bool(getattr(notification, "page", False) or (decision and decision.page)),
        "action": decision.action if decision else "",
        "event_type": notification.event.event_type if notification.event else "",
    }


def topic_message(notification: Notification) -> Any:
    """The `azure.servicebus.ServiceBusMessage` the topic gets for one announcement (what
    each subscription's function receives; the local `terminate` subscription too)."""
    from azure.servicebus import ServiceBusMessage

    return ServiceBusMessage(
        notification.to_json(),
        message_id=notification.message_id(),
        content_type="application/json",
        subject=notification.transition.value,
        application_properties=application_properties(notification),
    )


class ServiceBusPublisher:
    """Sends to the topic. MessageId = EventId:transition, so duplicate detection drops a
    republish of the same announcement (after a retry or a crash between send and save)."""

    def __init__(self, sender: Any) -> None:
        # azure.servicebus.ServiceBusSender for the topic, behind a lock (not thread-safe)
        self.sender = locked(sender)

    @classmethod
    def from_settings(cls, settings: Any) -> ServiceBusPublisher:
        return cls(topic_sender(settings, settings.notifications_topic))

    def publish(self, notification: Notification) -> None:
        self.sender.send_messages(topic_message(notification))
        telemetry.transition(notification)  # what the alerts and the workbook read


Handler = Callable[[Notification], None]


class LocalPublisher:
    """In-memory fan-out: every subscriber gets every notification, in publish order.

    Like a topic with one subscription per handler: a handler that raises is retried up to
    `max_delivery_count` times, then the notification is dead-lettered for that handler
    only (`dead_letters`); the others are not held back. Duplicate MessageIds are dropped,
    as Service Bus duplicate detection would.
    """

    def __init__(self, max_delivery_count: int = 3) -> None:
        self.max_delivery_count = max_delivery_count
        self.published: list[Notification] = []
        self.dead_letters: list[tuple[str, Notification, str]] = []
        self._handlers: dict[str, Handler] = {}
        self._seen: set[str] = set()
        self.duplicates: list[str] = []  # MessageIds dropped as duplicates
        self._lock = threading.Lock()

    def subscribe(self, name: str, handler: Handler) -> None:
        self._handlers[name] = handler

    def publish(self, notification: Notification) -> None:
        with self._lock:
            if notification.message_id() in self._seen:
                self.duplicates.append(notification.message_id())
                return
            self._seen.add(notification.message_id())
            self.published.append(notification)
            handlers = list(self._handlers.items())
        for name, handler in handlers:
            self._deliver(name, handler, notification)

    def _deliver(self, name: str, handler: Handler, notification: Notification) -> None:
        error = ""
        for _ in range(self.max_delivery_count):
            try:
                handler(notification)
                return
            except Exception as exc:
                error = f"{type(exc).__name__}: {exc}"
                log.warning(
                    "subscriber %s failed on %s: %s", name, notification.message_id(), error
                )
        with self._lock:
            self.dead_letters.append((name, notification, error))

    def transitions(self, event_id: str | None = None) -> list[str]:
        """Published transitions (optionally of one event), for tests and the demo."""
        return [
            n.transition.value
            for n in self.published
            if event_id is None or (n.event is not None and n.event.event_id == event_id)
        ]
