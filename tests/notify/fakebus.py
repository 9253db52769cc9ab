"""A Service Bus topic as the channels see it (Service Bus itself has no local emulator).

Models exactly what the channel functions rely on, and checks what Azure checks:
duplicate detection on MessageId (≤128 characters) within the window, one copy per
subscription, peek-lock delivery where a handler exception abandons the message and
increments DeliveryCount, and the move to the subscription's dead-letter queue with
reason MaxDeliveryCountExceeded once DeliveryCount reaches maxDeliveryCount.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

MAX_MESSAGE_ID = 128
MAX_BODY = 256 * 1024  # Standard tier


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
    def __init__(self, subscriptions: dict[str, int]) -> None:
        self.seen: set[str] = set()
        self.dropped: list[str] = []
        self.subscriptions = {
            name: Subscription(name, count) for name, count in subscriptions.items()
        }

    def send(self, message_id: str, body: bytes) -> None:
        if not message_id or len(message_id) > MAX_MESSAGE_ID:
            raise ValueError(f"MessageId must be 1..{MAX_MESSAGE_ID} characters")
        if len(body) > MAX_BODY:
            raise ValueError("message too large for the Standard tier")
        if message_id in self.seen:  # requiresDuplicateDetection
            self.dropped.append(message_id)
            return
        self.seen.add(message_id)
        for subscription in self.subscriptions.values():
            subscription.active.append(Message(message_id, body))
