"""Service Bus for the function app: one client per namespace, senders safe across threads.

The app sends on three entities: the `notifications` topic (functions.pipeline.publish),
the `reconcile` work queue (functions.pipeline.workqueue) and copies for later on the
documents and Event Grid queues (functions.triggers.later). All of them are used from the
Functions host's worker threads at once (host.json `maxConcurrentCalls`, and the thread
pool sized to it in infra/modules/functionapp.bicep), and the SDK does not make them safe
for that: "We do not guarantee that the `ServiceBusClient`, `ServiceBusSender`, and
`ServiceBusReceiver` are thread-safe ... For scenarios requiring concurrent sending from
multiple threads, ensure proper thread-safety management using mechanisms like
`threading.Lock()`" (azure-servicebus 7.15.0 README, "Thread safety"; the version
requirements.txt pins). So the client is built once here, under a lock, and every sender
is a `LockedSender`: one AMQP link per entity, one call on it at a time.

This is the one copy of the code that builds clients (a connection string locally, the
app's managed identity in Azure: `Settings.service_bus()`).
"""

from __future__ import annotations

import threading
from datetime import datetime
from typing import Any

_lock = threading.Lock()
_clients: dict[tuple[str, str], Any] = {}
_senders: dict[tuple[str, str, str, str], LockedSender] = {}


class LockedSender:
    """A ServiceBusSender (or a stand-in with its methods) behind a lock: the SDK's senders
    are not thread-safe, and the host's workers share one per entity."""

    def __init__(self, sender: Any) -> None:
        self.sender = sender
        self.lock = threading.Lock()

    def send_messages(self, messages: Any, **kwargs: Any) -> Any:
        with self.lock:
            return self.sender.send_messages(messages, **kwargs)

    def schedule_messages(self, messages: Any, schedule_time_utc: datetime, **kwargs: Any) -> Any:
        with self.lock:
            return self.sender.schedule_messages(messages, schedule_time_utc, **kwargs)

    def close(self) -> None:
        with self.lock:
            close = getattr(self.sender, "close", None)
            if close is not None:
                close()


def locked(sender: Any) -> LockedSender:
    """`sender` behind a lock (a LockedSender stays as it is)."""
    return sender if isinstance(sender, LockedSender) else LockedSender(sender)


def client(settings: Any) -> Any:
    """The host's ServiceBusClient for the settings' namespace (built once)."""
    kind, value = settings.service_bus()
    with _lock:
        found = _clients.get((kind, value))
        if found is None:
            from azure.servicebus import ServiceBusClient

            if kind == "connection_string":
                found = ServiceBusClient.from_connection_string(value)
            else:
                from azure.identity import DefaultAzureCredential

                found = ServiceBusClient(value, credential=DefaultAzureCredential())
            _clients[(kind, value)] = found
        return found


def queue_sender(settings: Any, queue: str) -> LockedSender:
    """The host's one sender for `queue`, behind its lock."""
    return _sender(settings, "queue", queue)


def topic_sender(settings: Any, topic: str) -> LockedSender:
    """The host's one sender for `topic`, behind its lock."""
    return _sender(settings, "topic", topic)


def _sender(settings: Any, kind: str, name: str) -> LockedSender:
    bus = client(settings)  # before taking the lock: client() takes it too
    key = (*settings.service_bus(), kind, name)
    with _lock:  # the client is not thread-safe either: its senders are made one at a time
        found = _senders.get(key)
        if found is None:
            made = (
                bus.get_queue_sender(queue_name=name)
                if kind == "queue"
                else bus.get_topic_sender(topic_name=name)
            )
            found = _senders[key] = LockedSender(made)
        return found
