"""A Service Bus topic as the channels see it (Service Bus itself has no local emulator).

Models exactly what the channel functions rely on, and checks what Azure checks (through
local/bus.py, the stand-in the local host's work queue uses too): duplicate detection on
MessageId (≤128 characters) within the window, the size limits, one copy per
subscription, peek-lock delivery where a handler exception abandons the message and
increments DeliveryCount, and the move to the subscription's dead-letter queue with reason
MaxDeliveryCountExceeded once DeliveryCount reaches maxDeliveryCount.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

MAX_MESSAGE_ID = 128


@dataclass
class Message:
    message_id: str
    body: bytes
    delivery_count: int = 0
    dead_letter_reason: str | None = None
    dead_letter_description: str | None = None


@dataclass
class Subscription:
    name: str
    max_delivery_count: int
    active: list[Message] = field(default_factory=list)
    dead_letters: list[Message] = field(default_factory=list)
    completed: list[Message] = field(default_factory=list)

    def pump(self, handler: Callable[[Message], None]) -> None:
        """Deliver until the subscription is empty, as the Functions host would."""
        while self.active:
            message = self.active.pop(0)
            message.delivery_count += 1
            try:
                handler(message)
            except Exception as exc:
                if message.delivery_count >= self.max_delivery_count:
                    message.dead_letter_reason = "MaxDeliveryCountExceeded"
                    message.dead_letter_description = str(exc)[:4096]
                    self.dead_letters.append(message)
                else:
                    self.active.insert(0, message)  # abandoned: redelivered at once
            else:
                self.completed.append(message)


class Topic:
    """The topic: what is sent becomes a real `ServiceBusMessage` (the SDK refuses a
    MessageId over 128 characters) and goes through local/bus.py's stand-in of the entity
    (the size limits, duplicate detection within the hour's window); each accepted one is
    copied to every subscription. `send_messages` lets the app's ServiceBusPublisher use it
    as its sender."""

    def __init__(self, subscriptions: dict[str, int]) -> None:
        from local.bus import LocalQueue

        self.subscriptions = {
            name: Subscription(name, count) for name, count in subscriptions.items()
        }
        self.entity = LocalQueue("notifications")
        self.entity.on_message(self._fan_out)

    @property
    def seen(self) -> dict[str, float]:
        """MessageIds within the duplicate-detection window (clear() forgets them)."""
        return self.entity._seen

    @property
    def dropped(self) -> list[str]:
        return self.entity.dropped

    def send(self, message_id: str, body: bytes) -> None:
        from azure.servicebus import ServiceBusMessage

        if not message_id:
            raise ValueError(f"MessageId must be 1..{MAX_MESSAGE_ID} characters")
        self.entity.send_messages(ServiceBusMessage(body, message_id=message_id))

    def send_messages(self, messages: object, **kwargs: object) -> None:
        self.entity.send_messages(messages, **kwargs)

    def _fan_out(self, message: object) -> None:
        from local.bus import body_of

        for subscription in self.subscriptions.values():
            subscription.active.append(Message(message.message_id, body_of(message)))  # type: ignore[attr-defined]
