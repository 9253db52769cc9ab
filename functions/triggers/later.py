"""Back off, don't burn deliveries: a message that fails because a dependency is down is
tried again later, with growing delays, instead of ten times in seconds.

Service Bus redelivers an abandoned message at once (there is no delayed abandon), and the
documents queue dead-letters it after `maxDeliveryCount` (10) deliveries: a minute of Table
storage outage used to dead-letter a document, and a relay sends a document only when it
changes. So when processing fails on an outage (`is_outage`: a connection refused, reset
or timed out, a 5xx, a 408 or 429 from storage or Service Bus), the handler schedules a copy
of the message on the same queue and session (Service Bus's scheduled messages:
`ScheduledEnqueueTimeUtc`, Learn "Message sequencing and timestamps", "Scheduled
messages") at `delay(retry)` from now, and completes the original. The copy carries its
retry number (`RETRY_PROPERTY`) and a MessageId of its own, so duplicate detection keeps
it, and when Service Bus first enqueued the original (`ENQUEUED_PROPERTY`): a copy is the
same message, dated as it was (functions.pipeline.guest_time). Delays: 15 s, 30 s, 1, 2,
4, 8 min, then every 10 min, for MAX_RETRIES tries: about 2 h 15 min of outage before the
copy is left to dead-letter like any message (with the reason), and the relay's resend
(contract §11) brings the document back even then.

A message newer than a delayed copy may be processed first (the copy is invisible until
its time): documents are whole snapshots of a VM's IMDS, and ingest refuses an older one
as stale, so order is kept where it matters.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from azure.core.exceptions import (
    HttpResponseError,
    ServiceRequestError,
    ServiceResponseError,
)

from functions.pipeline.guest_time import ENQUEUED_PROPERTY
from functions.servicebus import locked, queue_sender

RETRY_PROPERTY = "bridge_retry"
DELAYS = (15, 30, 60, 120, 240, 480)  # seconds, then STEADY until MAX_RETRIES
STEADY = 600
MAX_RETRIES = 18
PASSING_STATUSES = frozenset({408, 429, 500, 502, 503, 504})


def is_outage(exc: BaseException) -> bool:
    """A failure that says a dependency is down (not that the message is wrong)."""
    if isinstance(exc, ServiceRequestError | ServiceResponseError | ConnectionError):
        return True
    if isinstance(exc, HttpResponseError):
        return exc.status_code in PASSING_STATUSES
    try:
        from azure.servicebus.exceptions import ServiceBusError
    except ImportError:  # pragma: no cover - azure-servicebus is a dependency
        return False
    return isinstance(exc, ServiceBusError) and bool(getattr(exc, "retryable", False))


def delay(retry: int) -> timedelta:
    """How long the `retry`-th copy waits (retry counts from 1)."""
    seconds = DELAYS[retry - 1] if retry <= len(DELAYS) else STEADY
    return timedelta(seconds=seconds)


def total_wait(retries: int = MAX_RETRIES) -> timedelta:
    """How long an outage the copies outlast before the last one dead-letters."""
    return sum((delay(n) for n in range(1, retries + 1)), timedelta())


def retry_of(properties: dict[Any, Any] | None) -> int:
    """The retry number a message carries (0: the relay's own message)."""
    if not properties:
        return 0
    value = properties.get(RETRY_PROPERTY, properties.get(RETRY_PROPERTY.encode(), 0))
    try:
        return max(0, int(value))
    except (TypeError, ValueError):
        return 0


def copy_id(message_id: str, retry: int) -> str:
    """The copy's MessageId: its own, so duplicate detection keeps it (at most 128)."""
    base = message_id.split("|r", 1)[0][:100]
    return f"{base}|r{retry}"


class ServiceBusLater:
    """Schedules copies on one queue (the documents queue, or Event Grid's)."""

    def __init__(self, sender: Any) -> None:
        # azure.servicebus.ServiceBusSender for the queue, behind a lock (not thread-safe)
        self.sender = locked(sender)

    @classmethod
    def for_queue(cls, settings: Any, queue: str) -> ServiceBusLater:
        return cls(queue_sender(settings, queue))

    def schedule(
        self,
        body: bytes,
        *,
        session_id: str | None,
        message_id: str,
        retry: int,
        now: datetime,
        enqueued: datetime | None = None,
    ) -> datetime:
        """Schedule the `retry`-th copy; returns when it becomes visible. `enqueued`: when
        Service Bus first enqueued the original (carried, so the copy is dated as it was)."""
        from azure.servicebus import ServiceBusMessage

        at = now + delay(retry)
        properties: dict[str | bytes, Any] = {RETRY_PROPERTY: retry}
        if enqueued is not None:
            properties[ENQUEUED_PROPERTY] = enqueued.isoformat()
        message = ServiceBusMessage(
            body,
            session_id=session_id,
            message_id=copy_id(message_id, retry),
            application_properties=properties,
            content_type="application/json",
        )
        self.sender.schedule_messages(message, at)
        return at


# A topic subscription's message cannot be scheduled back to that subscription alone (a
# copy sent to the topic would reach every subscription), so a channel's delivery that
# fails on an outage waits inside the delivery instead, while the Functions host renews its
# lock (single-message triggers: host.json `maxAutoLockRenewalDuration`): up to
# HOLD_SECONDS a delivery, growing delays, then the failure is raised and Service Bus
# delivers again. Ten deliveries hold through about 40 minutes of storage outage.
HOLD_SECONDS = 240.0
HOLD_DELAYS = (5.0, 10.0, 20.0, 40.0, 60.0)


def hold_through_outage(
    call: Any, sleep: Any, budget: float = HOLD_SECONDS, scale: float = 1.0
) -> Any:
    """`call()`, again after growing delays while it fails on an outage, for at most
    `budget` seconds of waiting (times `scale`: a demo's faster time); then the last
    failure is raised."""
    waited = 0.0
    attempt = 0
    while True:
        try:
            return call()
        except Exception as exc:
            pause = HOLD_DELAYS[min(attempt, len(HOLD_DELAYS) - 1)] * scale
            if not is_outage(exc) or waited + pause > budget * scale:
                raise
            sleep(pause)
            waited += pause
            attempt += 1
