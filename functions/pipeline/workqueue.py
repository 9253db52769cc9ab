"""The work queue: a due event is a key, each key its own unit of work.

As in a Kubernetes controller, the sweep only finds what is due (functions.pipeline.
watchdog) and hands over keys; workers reconcile each one (functions.pipeline.reconcile.
reconcile_key) with their own deadline, concurrently, so one slow relay, one event that
names a thousand VMs or one NotBefore a week out costs only its own event's work item.

- In Azure: the `reconcile` Service Bus queue (infra/modules/servicebus.bicep, duplicate
  detection on), read by the `reconcile` function (functions/triggers/core.py) with the
  host's `maxConcurrentCalls`. A redelivered item carries the same MessageId, which names
  its claims' holder, so it takes over the claims its dead host left at once.
- Locally: the local host's workers read the same messages from a stand-in of the queue
  that checks what Service Bus checks (local/bus.py, local/host.py).
- A pipeline without a queue (the single-threaded tests): reconciled in turn, at once
  (functions.pipeline.reconcile.enqueue).

The MessageId (`item_id`) is what duplicate detection compares, for an hour
(`duplicateDetectionWindow`), so it says which reason to reconcile the item is:
- found by the sweep: the key and the minute of the sweep, so two sweeps (a slow one and
  the next tick) within a minute queue it once;
- anything else (a waiter woken because a slot was given back, a new observation): the key
  and the moment it became due, to the microsecond, so it is never taken for the sweep's
  item of the same minute (that dropped a wake-up for up to 60 s: issue 46).
The key is a hash (with a readable start), so every EventId the envelope accepts (up to
128 characters) makes a MessageId within Service Bus's 128 characters (an EventId of 115 or
more made `ServiceBusMessage` raise, and that stopped the sweep: issue 46).
"""

from __future__ import annotations

import hashlib
import logging
from datetime import UTC, datetime
from typing import Any

from functions.servicebus import locked, queue_sender
from functions.store.keys import row_key
from functions.triggers.later import is_outage

log = logging.getLogger(__name__)

BATCH = 100  # keys per Service Bus send (a batch stays far below the 256 KiB message limit)
MAX_MESSAGE_ID = 128  # Service Bus's limit (and the SDK's: ServiceBusMessage raises past it)
READABLE = 40  # characters of the key kept readable at the start of a MessageId
MAX_KEY_CHARS = 1024  # a key longer than any EventId is refused, not sent


def item_id(event_id: str, now: datetime, *, sweep: bool = True) -> str:
    """The work item's MessageId: the key (its start and a hash of all of it), then the
    minute of the sweep that found it due, or (`sweep=False`) the moment it became due.
    At most 40 + 1 + 24 + 1 + 22 = 88 characters, whatever the EventId."""
    key = row_key(event_id)
    digest = hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()[:24]
    at = now.astimezone(UTC)
    when = f"{at:%Y%m%dT%H%M}" if sweep else f"{at:%Y%m%dT%H%M%S.%f}"
    readable = "".join(c for c in key[:READABLE] if c.isascii() and c.isprintable())
    return f"{readable}~{digest}@{when}"


class ServiceBusWorkQueue:
    """Keys to the `reconcile` queue, in batches. One key that cannot be sent is logged
    and counted (`refused`), never stops the others."""

    def __init__(self, sender: Any) -> None:
        # azure.servicebus.ServiceBusSender for the queue, behind a lock (not thread-safe)
        self.sender = locked(sender)
        self.refused = 0  # keys never handed over (logged): the sweep finds them again

    @classmethod
    def from_settings(cls, settings: Any) -> ServiceBusWorkQueue:
        return cls(queue_sender(settings, settings.reconcile_queue))

    def enqueue(self, keys: list[str], now: datetime, *, sweep: bool = False) -> int:
        """Hand `keys` over; returns how many were. `sweep`: found by the sweep (its items
        of a minute are one; see `item_id`)."""
        from azure.servicebus import ServiceBusMessage

        messages = []
        for key in keys:
            try:
                if len(key) > MAX_KEY_CHARS:
                    raise ValueError(f"a key of {len(key)} characters is no EventId")
                messages.append(ServiceBusMessage(key, message_id=item_id(key, now, sweep=sweep)))
            except Exception as exc:
                self._refuse(key, exc)
        handed = 0
        for start in range(0, len(messages), BATCH):
            chunk = messages[start : start + BATCH]
            try:
                self.sender.send_messages(chunk)
                handed += len(chunk)
                continue
            except Exception as exc:
                if is_outage(exc):  # the namespace is down: the next sweep finds them all
                    log.warning("work queue: %d keys not handed over: %s", len(chunk), exc)
                    self.refused += len(chunk)
                    continue
            for message in chunk:  # one of them is refused: the rest still go
                try:
                    self.sender.send_messages(message)
                    handed += 1
                except Exception as exc:
                    self._refuse(str(message), exc)
        return handed

    def _refuse(self, key: str, exc: BaseException) -> None:
        self.refused += 1
        log.error("work queue: key %.200r not handed over: %s: %s", key, type(exc).__name__, exc)
