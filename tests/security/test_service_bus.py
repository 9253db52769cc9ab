"""Issue 46: Service Bus as Azure runs it, where one VM's EventId or the host's threads meet it.

On 2f59d6a:
- a work item's MessageId was the EventId's key and the minute: an EventId of 115 to 128
  characters (the envelope accepts 128) made it longer than Service Bus's 128 characters,
  `ServiceBusMessage` raised ValueError, and `run_watchdog` did not catch it, so every
  sweep stopped at that key: honest keys after it never handed over, retention never ran;
- a waiter woken in the same minute as its last work item got the same MessageId, and
  duplicate detection dropped the wake-up (up to 60 s late for a 30 s Preempt);
- the topic publisher, the work queue and the copies for later shared one sender each
  across the host's worker threads with no lock (the SDK's senders are not thread-safe).

The queue here is local/bus.py's stand-in, fed real `ServiceBusMessage`s by the app's own
ServiceBusWorkQueue: it checks the sizes, duplicate detection and one call per sender at a
time, as Azure and the SDK do.
"""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from azure.servicebus import ServiceBusMessage
from azure.servicebus.exceptions import MessageSizeExceededError, ServiceBusError

from functions.model.envelope import MAX_EVENT_ID_CHARS
from functions.model.event import Notification, Transition
from functions.pipeline import watchdog
from functions.pipeline.ingest import ingest_message
from functions.pipeline.publish import ServiceBusPublisher
from functions.pipeline.reconcile import enqueue
from functions.pipeline.watchdog import run_watchdog
from functions.pipeline.workqueue import ServiceBusWorkQueue, item_id
from functions.triggers.later import ServiceBusLater
from local.bus import LocalQueue, body_of
from tests.functions.conftest import (  # noqa: F401  (fixtures)
    T0,
    clock,
    envelope,
    event,
    make_pipeline,
    new_relay,
    relay,
    store,
    vm_id_of,
)

ROOT = Path(__file__).resolve().parents[2]
MAX_MESSAGE_ID = 128  # Service Bus (Learn, "Service Bus quotas"; the SDK checks it too)


def test_every_event_id_the_envelope_accepts_makes_a_message_id_service_bus_takes():
    assert MAX_EVENT_ID_CHARS == 128
    for length in (1, 36, 114, 115, 127, 128):
        for char in ("a", "É", "%", "\u2028"):
            event_id = char * length
            for sweep in (True, False):
                message_id = item_id(event_id, T0, sweep=sweep)
                assert len(message_id) <= MAX_MESSAGE_ID, (length, char, message_id)
                ServiceBusMessage(event_id, message_id=message_id)  # the SDK's own check
    # Two keys that share their first 40 characters are two items, never one.
    assert item_id("A" * 128, T0) != item_id("A" * 127 + "B", T0)
    # The same key found by two sweeps in a minute is one item; a wake-up is its own.
    assert item_id("EV-1", T0) == item_id("ev-1", T0 + timedelta(seconds=30))
    assert item_id("EV-1", T0, sweep=False) != item_id(
        "EV-1", T0 + timedelta(microseconds=1), sweep=False
    )
    assert item_id("EV-1", T0, sweep=False) != item_id("EV-1", T0)


def test_a_long_event_id_never_stops_the_sweep(store, clock, relay, mocker):  # noqa: F811
    pipeline, _ = make_pipeline(store, clock)
    relay.default = (503, {"error": "busy"})  # nothing is approved: every event stays open
    long_id = "L" * MAX_EVENT_ID_CHARS
    ids = ["A-FIRST", long_id, *(f"Z-HONEST-{i}" for i in range(5))]
    for n, event_id in enumerate(ids):
        ev = event(event_id, "Redeploy", resources=(f"vm{n}",), source="User")
        ingest_message(envelope(f"vm{n}", 1, [ev], callback_url=relay.url), pipeline)
    queue = LocalQueue("reconcile")
    pipeline.work_queue = ServiceBusWorkQueue(queue)
    retention = mocker.patch.object(watchdog, "_retention", wraps=watchdog._retention)
    clock.advance(600)
    report = run_watchdog(pipeline)
    handed = sorted(_text(message) for message in _received(queue))
    assert handed == sorted(ids), handed  # every key, the long one too
    assert report.due == report.handed == len(ids)
    assert retention.call_count == 1


def test_a_key_the_queue_refuses_costs_only_itself_and_retention_still_runs(store, clock, mocker):  # noqa: F811
    pipeline, _ = make_pipeline(store, clock)

    class Refusing(LocalQueue):
        """Refuses one key (as Service Bus would refuse a message it cannot take)."""

        def send_messages(self, messages, **kwargs):
            batch = [messages] if isinstance(messages, ServiceBusMessage) else list(messages)
            if any(m.message_id.startswith("ev-bad") for m in batch):
                raise MessageSizeExceededError(message="refused")
            return super().send_messages(messages, **kwargs)

    queue = Refusing("reconcile")
    work = ServiceBusWorkQueue(queue)
    handed = work.enqueue(["EV-OK-1", "EV-BAD", "EV-OK-2", "x" * 5000], T0, sweep=True)
    assert handed == 2 and work.refused == 2
    assert sorted(_text(m) for m in _received(queue)) == ["EV-OK-1", "EV-OK-2"]

    class Down:
        def send_messages(self, messages, **kwargs):
            raise ServiceBusError("the namespace is down", retryable=True)

    for n in range(3):
        store.open_event(f"EV-{n}", clock.now())
    pipeline.work_queue = ServiceBusWorkQueue(Down())
    retention = mocker.patch.object(watchdog, "_retention", wraps=watchdog._retention)
    report = run_watchdog(pipeline)  # never raises: the next sweep finds them again
    assert report.due == 3 and report.handed == 0
    assert retention.call_count == 1


def test_a_wake_up_in_the_minute_of_the_last_item_is_not_dropped(store, clock):  # noqa: F811
    """A waiter's item ran at 10:00:05 (found by the sweep); its slot is given back at
    10:00:35 and it is woken: duplicate detection must keep that item."""
    pipeline, _ = make_pipeline(store, clock)
    store.open_event("EV-WAITER", clock.now())
    queue = LocalQueue("reconcile")
    pipeline.work_queue = ServiceBusWorkQueue(queue)
    clock.advance(5)
    run_watchdog(pipeline)
    clock.advance(30)
    enqueue(pipeline, ["EV-WAITER"], clock.now())  # the woken waiter (reconcile.enqueue)
    assert [_text(m) for m in _received(queue)] == ["EV-WAITER", "EV-WAITER"]
    assert queue.dropped == []
    # A second sweep in the same minute is a true duplicate: dropped.
    clock.advance(10)
    run_watchdog(pipeline)
    assert len(queue.dropped) == 1


def test_senders_are_never_used_by_two_threads_at_once():
    """The stand-in raises when a call on a sender starts while another is in progress,
    as the SDK does not guarantee anything then; each send takes 20 ms here."""

    def slow_queue() -> LocalQueue:
        queue = LocalQueue("entity", duplicate_detection=False)
        queue.on_message(lambda _: time.sleep(0.02))
        return queue

    publisher = ServiceBusPublisher(slow_queue())
    work = ServiceBusWorkQueue(slow_queue())
    later = ServiceBusLater(slow_queue())
    errors: list[BaseException] = []

    def use(n: int) -> None:
        try:
            note = Notification(
                transition=Transition.RELAY_SILENT,
                occurred_at=T0,
                vm=f"vm{n}",
                detail="silent",
                occurrence=str(n),
            )
            publisher.publish(note)
            assert work.enqueue([f"EV-{n}"], T0) == 1
            later.schedule(b"{}", session_id="s", message_id=f"m{n}", retry=1, now=T0)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=use, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert len(publisher.sender.sender.accepted) == 8
    assert len(work.sender.sender.accepted) == 8


def test_one_copy_of_the_client_code():
    """The clients and senders are built in functions/servicebus.py only."""
    for path in (ROOT / "functions").rglob("*.py"):
        if path.name == "servicebus.py" and path.parent.name == "functions":
            continue
        text = path.read_text()
        assert "ServiceBusClient" not in text, path
        assert "get_queue_sender" not in text and "get_topic_sender" not in text, path


def test_the_stand_in_checks_what_service_bus_checks():
    queue = LocalQueue("documents", requires_session=True)
    with pytest.raises(ServiceBusError, match="SessionId"):
        queue.send_messages(ServiceBusMessage(b"{}", message_id="m1"))
    with pytest.raises(MessageSizeExceededError):
        queue.send_messages(ServiceBusMessage(b"x" * (256 * 1024), message_id="m2", session_id="s"))
    with pytest.raises(MessageSizeExceededError):  # a list is one batch
        queue.send_messages(
            [
                ServiceBusMessage(b"x" * 100_000, message_id=f"b{i}", session_id="s")
                for i in range(3)
            ]
        )
    handed: list[str] = []
    queue.on_message(lambda m: handed.append(m.message_id))
    for n in range(3):
        queue.send_messages(ServiceBusMessage(b"{}", message_id=f"s{n}", session_id="vm-a"))
    queue.send_messages(ServiceBusMessage(b"{}", message_id="s0", session_id="vm-a"))  # dup
    assert handed == ["s0"] and queue.dropped == ["s0"]  # one at a time per session
    queue.settled(queue.accepted[0])
    queue.settled(queue.accepted[1])
    assert handed == ["s0", "s1", "s2"]


def test_the_stand_in_delivers_an_abandoned_message_again_then_dead_letters_it():
    """As Service Bus under the Functions host (a function that raises abandons its
    message): the same message at once, its DeliveryCount one higher, and after
    maxDeliveryCount deliveries the dead-letter queue (issue 46, 7d: the demo's
    `terminate` subscription dropped a drain run that raised)."""
    queue = LocalQueue("terminate", duplicate_detection=False, max_delivery_count=3)
    handed: list[tuple[str, int]] = []
    queue.on_message(lambda m: handed.append((m.message_id, queue.delivery_count(m))))
    queue.send_messages(ServiceBusMessage(b"{}", message_id="drain"))
    (message,) = queue.accepted
    assert not queue.abandon(message, "storage refused")
    assert not queue.abandon(message, "storage refused")
    assert handed == [("drain", 1), ("drain", 2), ("drain", 3)]
    assert queue.abandon(message, "storage refused")  # its third delivery failed too
    assert handed == [("drain", 1), ("drain", 2), ("drain", 3)]  # not handed over again
    assert queue.dead_letters == [(message, "storage refused")]
    assert queue.delivery_count(message) == 0  # settled
    queue.send_messages(ServiceBusMessage(b"{}", message_id="undrain"))
    queue.settled(queue.accepted[1])  # completed on its first delivery
    assert handed[-1] == ("undrain", 1) and len(queue.dead_letters) == 1


def _received(queue: LocalQueue) -> list[ServiceBusMessage]:
    return list(queue.accepted)


def _text(message: ServiceBusMessage) -> str:
    return body_of(message).decode()


def test_a_message_in_another_vms_session_is_refused_with_the_reason(store, clock, relay):  # noqa: F811
    """On 2f59d6a ingest never compared a message's SessionId with the sender: one VM could
    write into a victim's session (holding up the victim's documents behind its own) or
    spread its messages over every session. Now it is refused, recorded with the reason
    and completed (never left to dead-letter), and a relay's own session is accepted."""
    from functions.triggers import core

    pipeline, _ = make_pipeline(store, clock)
    core.use_pipeline(pipeline)
    try:
        body = envelope("liar", 1, [event("EV-LIAR", resources=("liar",))]).encode()
        core.ingest(_Message(body, session_id=vm_id_of("victim"), message_id="m1"))
        assert store.get_event("EV-LIAR") is None
        reasons = [row["reason"] for row in store.rejected_rows()]
        assert any("SessionId" in r and "vmId" in r for r in reasons), reasons
        core.ingest(_Message(body, session_id=vm_id_of("liar").upper(), message_id="m2"))
        assert store.get_event("EV-LIAR") is not None  # its own session: accepted
    finally:
        core.use_pipeline(None)


class _Message:
    """What the Functions host hands the `ingest` trigger (azure.functions cannot set a
    SessionId on the message it builds)."""

    def __init__(self, body: bytes, *, session_id: str, message_id: str) -> None:
        self.body, self.session_id, self.message_id = body, session_id, message_id
        self.application_properties: dict = {}
        self.enqueued_time_utc = datetime.now(UTC)  # Service Bus stamps it on arrival

    def get_body(self) -> bytes:
        return self.body
