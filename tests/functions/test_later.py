"""Issue 40: an outage burns no deliveries (functions.triggers.later).

On 2cd3d60 a refused Table call failed the delivery within milliseconds, Service Bus
redelivered at once, and `documents` dead-lettered the message after 10 deliveries: about a
minute of storage outage lost a document for good. Now a failure on an outage schedules a
copy for later (growing delays), and the original is completed."""

from __future__ import annotations

import json
import socket
import time
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import pytest
from azure.core.exceptions import HttpResponseError, ResourceNotFoundError, ServiceRequestError
from azure.data.tables import TableServiceClient

from functions.pipeline.guest_time import ENQUEUED_PROPERTY
from functions.store.rows import transport_options
from functions.store.state import Store
from functions.triggers import later
from local.host import LocalHost
from tests.functions.conftest import envelope, event, make_pipeline


def test_what_an_outage_is():
    assert later.is_outage(ServiceRequestError("refused"))
    assert later.is_outage(ConnectionError("reset"))
    busy = HttpResponseError("busy")
    busy.status_code = 503
    assert later.is_outage(busy)
    # A message's own fault is no outage: it is rejected (or dead-lettered) as before.
    assert not later.is_outage(ResourceNotFoundError("gone"))
    refused = HttpResponseError("bad")
    refused.status_code = 400
    assert not later.is_outage(refused)
    assert not later.is_outage(ValueError("a bug"))


def test_the_copies_outlast_a_30_minute_outage_with_growing_delays():
    delays = [later.delay(n).total_seconds() for n in range(1, later.MAX_RETRIES + 1)]
    assert delays == sorted(delays) and delays[0] == 15 and delays[-1] == 600
    assert later.total_wait() >= timedelta(minutes=30)  # issue 40's target
    assert later.total_wait() == timedelta(seconds=8145)  # as docs/operations.md says
    assert later.copy_id("abc|r3", 4) == "abc|r4" and len(later.copy_id("x" * 200, 1)) <= 128
    assert later.retry_of({later.RETRY_PROPERTY: 3}) == 3
    assert later.retry_of({later.RETRY_PROPERTY.encode(): b"2"}) == 2
    assert later.retry_of(None) == 0 and later.retry_of({later.RETRY_PROPERTY: "x"}) == 0


class Sender:
    """Service Bus's sender, as far as a scheduled copy goes: what Azure would check."""

    def __init__(self) -> None:
        self.scheduled: list[tuple[object, datetime]] = []

    def schedule_messages(self, message, at):
        assert at.tzinfo is not None  # ScheduledEnqueueTimeUtc
        assert message.message_id and len(message.message_id) <= 128
        self.scheduled.append((message, at))
        return [1]


def test_the_trigger_schedules_a_copy_on_the_same_session(monkeypatch):
    from functions.triggers import core

    sender = Sender()
    monkeypatch.setitem(core._later, "documents", later.ServiceBusLater(sender))
    now = datetime(2026, 11, 21, 10, tzinfo=UTC)
    current = SimpleNamespace(clock=SimpleNamespace(now=lambda: now), settings=None)
    first = now - timedelta(seconds=45)  # when Service Bus enqueued the relay's message
    msg = SimpleNamespace(
        application_properties={later.RETRY_PROPERTY: 2, ENQUEUED_PROPERTY: first.isoformat()},
        get_body=lambda: b'{"kind":"document"}',
        session_id="vmid-1",
        message_id="m-1|r2",
        enqueued_time_utc=now.replace(tzinfo=None),  # this copy's own (naive, as parsed)
    )
    assert core.later_instead(msg, ServiceRequestError("refused"), current, "documents")
    ((message, at),) = sender.scheduled
    assert at == now + later.delay(3)
    assert message.session_id == "vmid-1" and message.message_id == "m-1|r3"
    # The copy is dated as the relay's message was (functions.pipeline.guest_time).
    assert message.application_properties == {
        later.RETRY_PROPERTY: 3,
        ENQUEUED_PROPERTY: first.isoformat(),
    }
    # Not an outage, or the last retry: the caller raises (Service Bus redelivers).
    assert not core.later_instead(msg, ValueError("bug"), current, "documents")
    msg.application_properties = {later.RETRY_PROPERTY: later.MAX_RETRIES}
    assert not core.later_instead(msg, ServiceRequestError("refused"), current, "documents")


def _refusing_store(store: Store) -> Store:
    """The same tables, behind a port where nothing listens: every request refused, at
    once (no SDK retries: their back-off made this test wait 19 s for the same refusals)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    text = (
        "DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;"
        "AccountKey=Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/"
        f"KBHBeksoGMGw==;TableEndpoint=http://127.0.0.1:{port}/devstoreaccount1;"
    )
    endpoint = f"http://127.0.0.1:{port}/devstoreaccount1"
    service = TableServiceClient.from_connection_string(
        text, retry_total=0, **transport_options(endpoint)
    )
    return Store(service, store.prefix)


@pytest.mark.azurite
def test_a_storage_outage_costs_no_dead_letter_and_the_document_comes_through(
    store, clock, tmp_path
):
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    (inbox / "0001.json").write_text(envelope("vm1", 1, [event("EV-O", resources=("vm1",))]))
    pipeline, pub = make_pipeline(store, clock)
    host = LocalHost(
        inbox,
        pipeline.settings,
        store,
        pub,
        clock=clock,
        admission=pipeline.admission,
        max_delivery_count=2,  # what would dead-letter it after two failed deliveries
    )
    host.later_scale = 0.0001  # the delays, in a test's time
    host.pipeline.store = _refusing_store(store)  # Table storage is down
    enqueued = clock.now()  # the host's stand-in for EnqueuedTimeUtc: when it found the file
    passes = []
    for _ in range(4):  # more deliveries than maxDeliveryCount
        passes.append(host.run_once())
        time.sleep(0.01)  # a copy's delay (15 s and more, scaled) has passed
    assert sum(p.dead_lettered for p in passes) == 0
    assert sum(p.later for p in passes) >= 2  # each copy failed again, and went later
    copies = sorted(p.name for p in inbox.iterdir() if p.is_file())
    assert len(copies) == 1 and "~r" in copies[0], copies
    copy = json.loads((inbox / copies[0]).read_text())
    assert copy["retry"] >= 2
    assert copy["enqueued_at"] == enqueued.isoformat()  # every copy dated as the original
    host.pipeline.store = store  # storage is back
    time.sleep(0.1)  # the last copy's delay (at most 10 min, scaled)
    done = host.run_once()
    assert done.processed == 1 and done.dead_lettered == 0
    assert pub.transitions("EV-O")[:2] == ["scheduled", "decided"]
    assert not list((inbox / "deadletter").iterdir())


def test_a_channel_delivery_holds_through_an_outage_instead_of_burning_deliveries():
    """A topic subscription's message cannot be scheduled back to one subscription: the
    channel's delivery waits inside itself (the host renews its lock), growing delays, up
    to HOLD_SECONDS, then raises so Service Bus delivers it again."""
    calls, slept = [], []

    def flaky():
        calls.append(1)
        if len(calls) < 4:
            raise ServiceRequestError("storage refused")
        return "posted"

    assert later.hold_through_outage(flaky, slept.append) == "posted"
    assert slept == [5.0, 10.0, 20.0]
    slept.clear()

    def down():
        raise ServiceRequestError("storage refused")

    with pytest.raises(ServiceRequestError):
        later.hold_through_outage(down, slept.append)
    assert sum(slept) <= later.HOLD_SECONDS and slept[-1] == 60.0
    # Ten deliveries hold through at least 30 minutes of outage before a dead letter.
    assert 10 * sum(slept) >= 30 * 60
    with pytest.raises(ValueError, match="bug"):  # not an outage: raised at once
        later.hold_through_outage(lambda: (_ for _ in ()).throw(ValueError("bug")), slept.append)
