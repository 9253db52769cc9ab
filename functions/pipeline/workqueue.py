"""The work queue: a due event is a key, each key its own unit of work.

As in a Kubernetes controller, the sweep only finds what is due (functions.pipeline.
watchdog) and hands over keys; workers reconcile each one (functions.pipeline.reconcile.
reconcile_key) with their own deadline, concurrently, so one slow relay, one event that
names a thousand VMs or one NotBefore a week out costs only its own event's work item.

- In Azure: the `reconcile` Service Bus queue (infra/modules/servicebus.bicep, duplicate
  detection on), read by the `reconcile` function (functions/triggers/core.py) with the
  host's `maxConcurrentCalls`. The MessageId is the key and the minute it was found due,
  so two sweeps (or a sweep and ingest) within a minute queue it once; a redelivered
  item carries the same MessageId, which names its claims' holder, so it takes over the
  claims its dead host left at once.
- Locally: the local host's worker pool (local/host.py), the same rules in memory.
- A pipeline without a queue (the single-threaded tests): reconciled in turn, at once
  (functions.pipeline.reconcile.enqueue).
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any

from functions.store.keys import row_key

log = logging.getLogger(__name__)

BATCH = 100  # keys per Service Bus send (a batch stays far below the 256 KiB message limit)


def item_id(event_id: str, now: datetime) -> str:
    """The work item's MessageId: the key and the minute it was found due."""
    return f"{row_key(event_id)[:200]}@{now.astimezone(UTC):%Y%m%dT%H%M}"


class ServiceBusWorkQueue:
    """Keys to the `reconcile` queue, in batches."""

    def __init__(self, sender: Any) -> None:
        self.sender = sender  # azure.servicebus.ServiceBusSender for the queue

    @classmethod
    def from_settings(cls, settings: Any) -> ServiceBusWorkQueue:
        from azure.servicebus import ServiceBusClient

        kind, value = settings.service_bus()
        if kind == "connection_string":
            client = ServiceBusClient.from_connection_string(value)
        else:
            from azure.identity import DefaultAzureCredential

            client = ServiceBusClient(value, credential=DefaultAzureCredential())
        return cls(client.get_queue_sender(queue_name=settings.reconcile_queue))

    def enqueue(self, keys: list[str], now: datetime) -> int:
        from azure.servicebus import ServiceBusMessage

        for start in range(0, len(keys), BATCH):
            chunk = keys[start : start + BATCH]
            self.sender.send_messages(
                [ServiceBusMessage(key, message_id=item_id(key, now)) for key in chunk]
            )
        return len(keys)
