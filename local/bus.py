"""A Service Bus queue as Azure runs it, for the local host and the tests (Service Bus has
no local emulator the stack uses).

The function app's own code builds the messages (real `azure.servicebus.ServiceBusMessage`s,
which refuse a MessageId or SessionId over 128 characters), and this queue checks the rest
of what Service Bus checks on a send (Learn, "Service Bus quotas"; "Duplicate detection";
"Message sessions"):
- the size: at most 256 KiB per message (Standard tier, headers included), and a list sent
  at once is one batch of at most that;
- duplicate detection (`requiresDuplicateDetection`): a MessageId seen within the window
  (infra/modules/servicebus.bicep: one hour) is accepted and dropped, silently;
- sessions (`requiresSession`): a message without a SessionId is refused, and one
  session's messages are handed over one at a time, in order;
- senders: the SDK's are not thread-safe (azure-servicebus README, "Thread safety"), so a
  second call while one is in progress raises here, as the app must never do it
  (functions.servicebus.LockedSender);
- scheduled messages (`schedule_messages`): invisible until their time.
Accepted messages go to the trigger (`on_message`), as the Functions host hands them over,
each under peek-lock: the receiver completes it (`settled`) or gives it back (`abandon`,
what the Functions host does when the function raises), and Service Bus delivers it again
at once with its DeliveryCount one higher (`delivery_count`), then moves it to the
dead-letter queue (MaxDeliveryCountExceeded) after maxDeliveryCount deliveries.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict, deque
from collections.abc import Callable, Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

from azure.servicebus import ServiceBusMessage
from azure.servicebus.exceptions import MessageSizeExceededError, ServiceBusError

MAX_MESSAGE_BYTES = 256 * 1024  # Standard tier: a message, or a batch sent at once
MAX_HEADER_BYTES = 64 * 1024
DUPLICATE_WINDOW = timedelta(hours=1)  # servicebus.bicep's duplicateDetectionWindow
MAX_DELIVERY_COUNT = 10  # servicebus.bicep's maxDeliveryCount (every queue and subscription)


def body_of(message: ServiceBusMessage) -> bytes:
    """The message's body, as the receiver gets it."""
    body = message.body
    if isinstance(body, bytes | bytearray):
        return bytes(body)
    if isinstance(body, str):
        return body.encode()
    return b"".join(bytes(part) for part in body)


def size_of(message: ServiceBusMessage) -> tuple[int, int]:
    """(body bytes, header bytes) as far as the app sets them."""
    header = len(message.message_id or "") + len(message.session_id or "")
    header += len(message.content_type or "") + len(message.subject or "")
    for key, value in (message.application_properties or {}).items():
        header += len(str(key)) + len(str(value))
    return len(body_of(message)), header


class LocalQueue:
    """One queue entity. `on_message(handler)`: the trigger that receives accepted ones."""

    def __init__(
        self,
        name: str,
        *,
        requires_session: bool = False,
        duplicate_detection: bool = True,
        duplicate_window: timedelta = DUPLICATE_WINDOW,
        max_message_bytes: int = MAX_MESSAGE_BYTES,
        max_delivery_count: int = MAX_DELIVERY_COUNT,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name = name
        self.requires_session = requires_session
        self.duplicate_detection = duplicate_detection
        self.window = duplicate_window.total_seconds()
        self.max_bytes = max_message_bytes
        self.max_delivery_count = max_delivery_count
        self.clock = clock
        self.accepted: list[ServiceBusMessage] = []
        self.dropped: list[str] = []  # MessageIds duplicate detection dropped
        self._seen: dict[str, float] = {}
        self._lock = threading.Lock()
        self._in_send = False
        self._handler: Callable[[ServiceBusMessage], None] | None = None
        self._sessions: dict[str, deque[ServiceBusMessage]] = defaultdict(deque)
        self._busy_sessions: set[str] = set()
        # (message, its description) moved to the dead-letter queue
        self.dead_letters: list[tuple[ServiceBusMessage, str]] = []
        self._deliveries: dict[ServiceBusMessage, int] = {}  # in flight: its DeliveryCount

    def on_message(self, handler: Callable[[ServiceBusMessage], None]) -> None:
        self._handler = handler

    # ------------------------------------------------------------- the sender's side

    def send_messages(self, messages: Any, **_: Any) -> None:
        """ServiceBusSender.send_messages: one message, or a list sent as one batch."""
        batch = [messages] if isinstance(messages, ServiceBusMessage) else list(messages)
        with self._lock:
            if self._in_send:
                raise RuntimeError(f"{self.name}: a sender used by two threads at once")
            self._in_send = True
        try:
            self._check(batch)
            for message in batch:
                self._accept(message)
        finally:
            with self._lock:
                self._in_send = False

    def schedule_messages(self, messages: Any, schedule_time_utc: datetime, **_: Any) -> list[int]:
        """ServiceBusSender.schedule_messages: each becomes visible at its time."""
        if schedule_time_utc.tzinfo is None:
            raise ValueError("ScheduledEnqueueTimeUtc must be timezone-aware")
        batch = [messages] if isinstance(messages, ServiceBusMessage) else list(messages)
        self._check(batch)
        wait = max(0.0, (schedule_time_utc - datetime.now(UTC)).total_seconds())
        for message in batch:
            timer = threading.Timer(wait, self._accept, args=(message,))
            timer.daemon = True
            timer.start()
        return list(range(len(batch)))

    def _check(self, batch: Iterable[ServiceBusMessage]) -> None:
        total = 0
        for message in batch:
            if not isinstance(message, ServiceBusMessage):
                raise TypeError(f"{self.name}: not a ServiceBusMessage: {type(message)!r}")
            body, header = size_of(message)
            if header > MAX_HEADER_BYTES:
                raise MessageSizeExceededError(message=f"{self.name}: header over 64 KiB")
            total += body + header
            if self.requires_session and not message.session_id:
                raise ServiceBusError(
                    f"{self.name}: the SessionId was not set on a message, and it cannot be "
                    "sent to an entity with sessions enabled"
                )
        if total > self.max_bytes:
            raise MessageSizeExceededError(
                message=f"{self.name}: {total} bytes is over the {self.max_bytes}-byte limit"
            )

    def _accept(self, message: ServiceBusMessage) -> None:
        now = self.clock()
        with self._lock:
            if self.duplicate_detection and message.message_id:
                seen = self._seen.get(message.message_id)
                if seen is not None and now - seen < self.window:
                    self.dropped.append(message.message_id)
                    return
                self._seen[message.message_id] = now
                if len(self._seen) > 100_000:  # forget what left the window
                    self._seen = {k: t for k, t in self._seen.items() if now - t < self.window}
            self.accepted.append(message)
            handler = self._handler
            if self.requires_session:
                session = str(message.session_id)
                self._sessions[session].append(message)
                if session in self._busy_sessions:
                    return  # handed over when the one in progress is settled
                self._busy_sessions.add(session)
                message = self._sessions[session].popleft()
        self._hand_over(message, handler)

    # ------------------------------------------------------------- the receiver's side

    def _hand_over(
        self, message: ServiceBusMessage, handler: Callable[[ServiceBusMessage], None] | None
    ) -> None:
        if handler is None:
            return
        with self._lock:
            self._deliveries[message] = self._deliveries.get(message, 0) + 1
        handler(message)

    def delivery_count(self, message: ServiceBusMessage) -> int:
        """Service Bus's DeliveryCount of a message handed over and not settled yet: 1 on
        its first delivery."""
        with self._lock:
            return self._deliveries.get(message, 0)

    def settled(self, message: ServiceBusMessage) -> None:
        """The receiver completed the message (or it was dead-lettered): a session's next
        one is handed over."""
        with self._lock:
            self._deliveries.pop(message, None)
        if not self.requires_session:
            return
        session = str(message.session_id)
        with self._lock:
            queue = self._sessions.get(session)
            if not queue:
                self._busy_sessions.discard(session)
                return
            following = queue.popleft()
            handler = self._handler
        self._hand_over(following, handler)

    def abandon(self, message: ServiceBusMessage, error: str = "") -> bool:
        """The receiver gave the message back: the Functions host does when the function
        raises (autoCompleteMessages). Service Bus delivers it again at once (an abandon
        has no backoff; the lock duration only delays a message whose receiver died
        without settling it), or, delivered maxDeliveryCount times, dead-letters it with
        `error` as its description. Returns True when it was dead-lettered."""
        with self._lock:
            count = self._deliveries.get(message, 0)
            dead = count >= self.max_delivery_count
            if dead:
                self.dead_letters.append((message, error[:4096]))
            handler = self._handler
        if dead:
            self.settled(message)
        else:
            self._hand_over(message, handler)
        return dead
