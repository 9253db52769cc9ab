"""Fewer Table requests per document, and the ETag still guarding every write.

Ingest reuses a row it just read or wrote instead of reading it again; these tests check
that the saving happens and that a concurrent writer in between is never overwritten.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from functions.model.event import Notification
from functions.model.policy import Policy, Rule
from functions.pipeline.ingest import ingest_message
from functions.pipeline.lifecycle import end
from functions.pipeline.publish import LocalPublisher
from functions.pipeline.reconcile import reconcile_key
from functions.store.records import VmRecord
from functions.store.rows import transport_options
from functions.store.state import Store
from tests.functions.conftest import T0, envelope, event, make_pipeline


def _azure_ends(pipeline, event_id, now):
    """As Event Grid's Completed ends an event: the row says so, then it is reconciled."""

    def change(rec):
        end(rec, now, how="completed", by="azure")
        return rec

    record, _ = pipeline.store.mutate_event(event_id, change)
    reconcile_key(pipeline, event_id, row=record, worker=False)


class Calls:
    """Counts the Table calls a store makes, per table and method, on the real client."""

    def __init__(self, store: Store, mocker) -> None:
        self.spies = {
            (table, method): mocker.spy(getattr(store, table), method)
            for table in ("vms", "events")
            # submit_transaction: a write with its audit row (one request, issue 47)
            for method in ("get_entity", "create_entity", "update_entity", "submit_transaction")
        }

    def count(self, table: str, method: str) -> int:
        return self.spies[(table, method)].call_count

    def writes(self) -> int:
        return sum(
            spy.call_count
            for (_, method), spy in self.spies.items()
            if method in ("create_entity", "update_entity", "submit_transaction")
        )

    def reset(self) -> None:
        for spy in self.spies.values():
            spy.reset_mock()


def test_a_document_reads_the_vm_row_once_and_a_redelivery_writes_nothing(store, clock, mocker):
    pipeline, _ = make_pipeline(store, clock)
    calls = Calls(store, mocker)
    ingest_message(envelope("vm1", 1, [event("EV-E")]), pipeline)
    assert calls.count("vms", "get_entity") == 1 and calls.count("vms", "create_entity") == 1

    body = envelope("vm1", 3, [event("EV-E")])  # after a heartbeat (it took number 2)
    calls.reset()
    assert ingest_message(body, pipeline).outcome == "processed"
    assert calls.count("vms", "get_entity") == 1  # not re-read before the write
    assert calls.count("vms", "update_entity") == 1

    calls.reset()
    assert ingest_message(body, pipeline).outcome == "stale"
    assert calls.count("vms", "get_entity") == 1 and calls.writes() == 0


def test_a_relays_first_quiet_message_inserts_the_vm_row_without_reading_it(store, clock, mocker):
    pipeline, _ = make_pipeline(store, clock)
    calls = Calls(store, mocker)
    assert ingest_message(envelope("vm1", 1, []), pipeline).outcome == "processed"
    assert calls.count("vms", "get_entity") == 0 and calls.count("vms", "create_entity") == 1
    assert store.get_vm("vm1").last_sequence == 1


def test_a_first_message_for_a_vm_with_a_row_is_judged_on_that_row(store, clock, mocker):
    """A reimaged relay starts its sequence again, and a first message can be redelivered:
    the insert finds the row, and the document is processed from it like any other."""
    pipeline, publisher = make_pipeline(store, clock)
    ingest_message(envelope("vm1", 1, [event("EV-R")]), pipeline)
    ingest_message(envelope("vm1", 2, [event("EV-R")]), pipeline)
    redelivered = envelope("vm1", 1, [])
    reimaged = envelope("vm1", 1, [], observed_at=T0 + timedelta(minutes=5))  # newer
    assert ingest_message(redelivered, pipeline).outcome == "stale"
    assert store.get_vm("vm1").event_ids == ["EV-R"]
    assert ingest_message(reimaged, pipeline).outcome == "processed"
    assert store.get_vm("vm1").event_ids == []
    assert publisher.transitions("EV-R")[-1] == "cancelled"


def test_an_unchanged_document_writes_the_vm_row_but_no_event_row(store, clock, mocker):
    pipeline, publisher = make_pipeline(store, clock)
    ingest_message(envelope("vm1", 1, [event("EV-U")]), pipeline)
    calls = Calls(store, mocker)
    clock.advance(1)
    assert ingest_message(envelope("vm1", 2, [event("EV-U")]), pipeline).transitions == []
    assert calls.count("events", "update_entity") == calls.count("events", "create_entity") == 0
    assert calls.count("vms", "update_entity") == 1  # last_seen and the sequence move on
    assert store.get_vm("vm1").last_sequence == 2
    assert publisher.transitions("EV-U") == ["scheduled", "decided"]


def test_a_vm_row_changed_between_read_and_write_is_reread_not_overwritten(azurite, store, clock):
    pipeline, publisher = make_pipeline(store, clock)
    ingest_message(envelope("vm1", 1, []), pipeline)
    other = Store.from_connection_string(azurite, store.prefix)  # another worker
    silence = (T0 - timedelta(minutes=11)).isoformat()
    real_get = store.get_vm
    reads: list[VmRecord | None] = []

    def get_then_someone_writes(name: str) -> VmRecord | None:
        record = real_get(name)
        if not reads:  # after ingest's read, the watchdog marks the VM

            def mark(rec: VmRecord | None) -> VmRecord | None:
                assert rec is not None
                rec.silent_announced_for = silence  # it announced relay_silent
                return rec

            other.mutate_vm(name, mark)
        reads.append(record)
        return record

    store.get_vm = get_then_someone_writes  # type: ignore[method-assign]
    # Number 3, not 2: the relay's next message would start from the row this worker
    # wrote, without a read (the remembered-row tests below cover that path).
    result = ingest_message(envelope("vm1", 3, [event("EV-R")]), pipeline)
    assert result.outcome == "processed"
    assert len(reads) == 2  # the failed conditional write sent it back to read again
    saved = real_get("vm1")
    assert saved.last_sequence == 3 and saved.event_ids == ["EV-R"]
    # The watchdog's write was read, not overwritten: this document ends that silence.
    assert saved.silent_announced_for is None and saved.recovery_pending is None
    assert [n.occurrence for n in publisher.published if n.transition == "relay_recovered"] == [
        "20261121T094900"
    ]
    assert store.get_event("EV-R", reporters=True).reporters == {"vm1": "Scheduled"}


class WritingPublisher(LocalPublisher):
    """Another VM reports the event while its announcement is being published: the row's
    ETag moves between the claim and marking the claim done."""

    def __init__(self, other: Store, body: str, pipeline_factory) -> None:
        super().__init__()
        self.other, self.body, self.pipeline_factory = other, body, pipeline_factory
        self.done = False

    def publish(self, notification: Notification) -> None:
        if not self.done:
            self.done = True
            ingest_message(self.body, self.pipeline_factory(self.other))
        super().publish(notification)


def test_marking_an_announcement_done_after_a_concurrent_write_keeps_both(azurite, store, clock):
    other = Store.from_connection_string(azurite, store.prefix)
    pipeline, _ = make_pipeline(store, clock)
    second = envelope("vm2", 1, [event("EV-M", resources=("vm1", "vm2"))])
    pipeline.publisher = publisher = WritingPublisher(
        other, second, lambda s: make_pipeline(s, clock)[0]
    )
    ingest_message(envelope("vm1", 1, [event("EV-M", resources=("vm1", "vm2"))]), pipeline)
    record = store.get_event("EV-M", reporters=True)
    assert record.reporters == {"vm1": "Scheduled", "vm2": "Scheduled"}
    assert record.announced == {"scheduled": "done", "decided": "done"}
    assert publisher.transitions("EV-M") == ["scheduled", "decided"]


def test_ending_a_held_event_reads_no_capacity_slot(store, clock, mocker):
    pipeline, publisher = make_pipeline(store, clock)
    ingest_message(envelope("vm1", 1, [event("EV-H")], availability_set="as1"), pipeline)
    get_slot = mocker.spy(store, "get_capacity")
    change_slot = mocker.spy(store, "mutate_capacity")
    ingest_message(envelope("vm1", 2, [], availability_set="as1"), pipeline)
    assert publisher.transitions("EV-H") == ["scheduled", "decided", "cancelled"]
    assert get_slot.call_count == change_slot.call_count == 0


def test_ending_an_approved_event_still_frees_its_slot(store, clock, relay):
    policy = Policy(rules=(Rule(name="all", action="approve"),), max_concurrent_per_set=1)
    pipeline, publisher = make_pipeline(store, clock, policy)
    ss = {"scale_set": "web", "callback_url": relay.url}
    ingest_message(envelope("web_0", 1, [event("E-0", resources=("web_0",))], **ss), pipeline)
    assert relay.starts() == ["E-0"] and store.get_capacity("ss:web").holders == ["E-0"]
    ingest_message(envelope("web_0", 2, [], **ss), pipeline)
    assert publisher.transitions("E-0")[-1] == "completed"
    assert store.get_capacity("ss:web").holders == []


def test_mutate_with_a_stale_known_row_reads_again(azurite, store):
    store.mutate_vm("vm9", lambda rec: VmRecord(name="vm9", relay_version="1"))
    stale = store.get_vm("vm9")
    other = Store.from_connection_string(azurite, store.prefix)

    def bump(rec: VmRecord | None) -> VmRecord | None:
        assert rec is not None
        rec.relay_version = "2"
        return rec

    other.mutate_vm("vm9", bump)
    seen: list[str | None] = []

    def set_scale_set(rec: VmRecord | None) -> VmRecord | None:
        assert rec is not None
        seen.append(rec.relay_version)
        rec.scale_set = "web"
        return rec

    _, won = store.mutate_vm("vm9", set_scale_set, known=stale)
    assert won and seen == ["1", "2"]  # the stale row's write failed on its ETag
    saved = store.get_vm("vm9")
    assert (saved.relay_version, saved.scale_set) == ("2", "web")

    absent_seen: list[bool] = []

    def first_one(rec: VmRecord | None) -> VmRecord | None:
        absent_seen.append(rec is None)
        return (rec or VmRecord(name="vm9")).model_copy(update={"callback_url": "http://x/"})

    # Told "it did not exist" when it does: the conditional insert fails, then it reads.
    store.mutate_vm("vm9", first_one, known=None)
    assert absent_seen == [True, False]
    assert store.get_vm("vm9").relay_version == "2"


# ----------------------------------------------------------------------- HTTP settings


PROXY_VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY", "CURL_CA_BUNDLE")


@pytest.fixture
def clean_env(monkeypatch):
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)
    return monkeypatch


def test_transport_options_read_proxies_and_ca_bundle_once(clean_env):
    monkeypatch = clean_env
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.example:3128")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", "/etc/ssl/corp.pem")
    remote = transport_options("https://acct.table.core.windows.net")
    assert remote["transport"].proxy == "http://proxy.example:3128"
    assert remote["transport"].verify == "/etc/ssl/corp.pem"
    assert transport_options("http://127.0.0.1:10002/devstoreaccount1")["transport"].proxy is None
    monkeypatch.delenv("REQUESTS_CA_BUNDLE")
    monkeypatch.delenv("HTTPS_PROXY")
    plain = transport_options("https://acct.table.core.windows.net")["transport"]
    assert plain.proxy is None and plain.verify is True


class RecordingProxy:
    """An HTTP proxy that records what it is asked for and answers 404."""

    def __init__(self) -> None:
        self.seen: list[str] = []
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                proxy.seen.append(self.path)
                body = b'{"odata.error":{"code":"ResourceNotFound","message":{"value":"no"}}}'
                self.send_response(404)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def recording_proxy() -> Iterator[RecordingProxy]:
    proxy = RecordingProxy()
    yield proxy
    proxy.close()


def test_an_http_proxy_from_the_environment_is_still_used(azurite, monkeypatch, recording_proxy):
    monkeypatch.setenv("HTTP_PROXY", recording_proxy.url)
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    store = Store.from_connection_string(azurite, "proxied")
    assert store.get_vm("vm1") is None
    assert len(recording_proxy.seen) == 1
    assert recording_proxy.seen[0].startswith("http://127.0.0.1:")  # a proxy request


# ----------------------------------------------------------------------- remembered rows


def test_the_next_document_about_an_event_starts_from_the_row_this_worker_wrote(
    store, clock, mocker
):
    pipeline, publisher = make_pipeline(store, clock)
    ingest_message(envelope("vm1", 1, [event("EV-N")]), pipeline)
    calls = Calls(store, mocker)
    clock.advance(60)
    ingest_message(envelope("vm1", 2, [event("EV-N", status="Started")]), pipeline)
    assert calls.count("events", "get_entity") == 0  # remembered, and its ETag held
    ingest_message(envelope("vm1", 3, []), pipeline)
    assert calls.count("events", "get_entity") == 0
    assert publisher.transitions("EV-N") == ["scheduled", "decided", "started", "completed"]


def test_a_remembered_row_another_worker_changed_is_read_again_and_both_changes_kept(
    azurite, store, clock
):
    pipeline, _ = make_pipeline(store, clock)
    two = ("vm1", "vm2")
    ingest_message(envelope("vm1", 1, [event("EV-W", resources=two)]), pipeline)
    other, _ = make_pipeline(Store.from_connection_string(azurite, store.prefix), clock)
    ingest_message(envelope("vm2", 1, [event("EV-W", resources=two)]), other)
    # This worker still remembers the row without vm2; its conditional write must fail.
    ingest_message(envelope("vm1", 2, [event("EV-W", status="Started", resources=two)]), pipeline)
    assert store.get_event("EV-W", reporters=True).reporters == {
        "vm1": "Started",
        "vm2": "Scheduled",
    }


def test_a_repeated_report_with_nothing_new_reads_no_event_row(store, clock, mocker):
    pipeline, _ = make_pipeline(store, clock)
    two = ("vm1", "vm2")
    ingest_message(envelope("vm1", 1, [event("EV-Q", resources=two)]), pipeline)
    calls = Calls(store, mocker)
    ingest_message(envelope("vm2", 1, [event("EV-Q", resources=two)]), pipeline)
    # decided (hold) and announced: a new reporter writes its own row, reads no event row
    assert calls.count("events", "get_entity") == 0
    assert calls.count("events", "update_entity") == 0
    assert store.get_event("EV-Q", reporters=True).reporters == {
        "vm1": "Scheduled",
        "vm2": "Scheduled",
    }


def test_a_late_report_of_an_ended_event_costs_no_event_request(store, clock, mocker):
    pipeline, publisher = make_pipeline(store, clock)
    ingest_message(envelope("vm1", 1, [event("EV-L")]), pipeline)
    ingest_message(envelope("vm1", 2, []), pipeline)  # cancelled; vm1 a past reporter
    assert publisher.transitions("EV-L")[-1] == "cancelled"
    calls = Calls(store, mocker)
    ingest_message(envelope("vm1", 3, [event("EV-L")]), pipeline)
    ingest_message(envelope("vm1", 4, []), pipeline)
    assert sum(calls.count("events", m) for m in ("get_entity", "update_entity")) == 0
    assert store.get_event("EV-L").ended == "cancelled"
    # A VM that never reported it reopens it for itself (the end was vm1's, issue 31): its
    # reporter row is inserted (one request), and its next document ends it again.
    before = calls.count("events", "create_entity")
    ingest_message(envelope("vm2", 1, [event("EV-L", resources=("vm1", "vm2"))]), pipeline)
    assert calls.count("events", "create_entity") == before + 1
    record = store.get_event("EV-L", reporters=True)
    assert not record.ended and record.reopened == 1 and record.reporters == {"vm2": "Scheduled"}
    ingest_message(envelope("vm2", 2, []), pipeline)
    record = store.get_event("EV-L", reporters=True)
    assert record.past_reporters == ["vm1", "vm2"] and record.ended == "cancelled"
    # vm2 names two VMs where vm1 named one: views differ, so the decision is re-announced.
    assert publisher.transitions("EV-L") == [
        "scheduled",
        "decided",
        "cancelled",
        "decided",
        "cancelled",
    ]


def test_a_vm_that_reported_before_the_end_keeps_its_status_and_leaves(store, clock, mocker):
    """Only a VM that joined after the end is spared writes: one that reported the event
    before it ended still has its status recorded, and its absence recorded."""
    pipeline, _ = make_pipeline(store, clock)
    two = ("vm1", "vm2")
    ingest_message(envelope("vm1", 1, [event("EV-K", resources=two)]), pipeline)
    ingest_message(envelope("vm2", 1, [event("EV-K", resources=two)]), pipeline)
    _azure_ends(pipeline, "EV-K", clock.now())
    ingest_message(envelope("vm2", 2, [event("EV-K", status="Started", resources=two)]), pipeline)
    assert store.get_event("EV-K", reporters=True).reporters == {
        "vm1": "Scheduled",
        "vm2": "Started",
    }
    assert store.get_vm("vm2").late_event_ids == []
    ingest_message(envelope("vm2", 3, []), pipeline)
    assert store.get_event("EV-K", reporters=True).reporters == {"vm1": "Scheduled"}


def test_a_relays_next_document_starts_from_the_vm_row_this_worker_wrote(store, clock, mocker):
    pipeline, publisher = make_pipeline(store, clock)
    calls = Calls(store, mocker)
    ingest_message(envelope("vm1", 1, [event("EV-V")]), pipeline)
    assert calls.count("vms", "get_entity") == 1  # a first message with events reads
    calls.reset()
    clock.advance(30)
    ingest_message(envelope("vm1", 2, [event("EV-V", status="Started")]), pipeline)
    ingest_message(envelope("vm1", 3, []), pipeline)
    assert calls.count("vms", "get_entity") == 0
    assert calls.count("vms", "update_entity") == 2
    # A heartbeat took number 4: the next document may not trust the remembered row.
    ingest_message(envelope("vm1", 5, [event("EV-V2")]), pipeline)
    assert calls.count("vms", "get_entity") == 1
    saved = store.get_vm("vm1")
    assert (saved.last_sequence, saved.event_ids) == (5, ["EV-V2"])
    assert publisher.transitions("EV-V") == ["scheduled", "decided", "started", "completed"]


def test_a_remembered_vm_row_a_heartbeat_moved_is_read_again_and_both_kept(azurite, store, clock):
    """A heartbeat merged by someone else (the relay itself, or the heartbeat function on
    another instance) changes the row's ETag: the document's guarded write fails, and it
    is processed again from a fresh read, keeping the heartbeat's columns."""
    pipeline, publisher = make_pipeline(store, clock)
    ingest_message(envelope("vm1", 1, [event("EV-B")]), pipeline)
    beat_at = T0 + timedelta(minutes=3)
    other = Store.from_connection_string(azurite, store.prefix)
    other.heard([("vm1", beat_at, "http://10.0.0.4:8080", "9.9")])
    clock.advance(240)
    assert store.recent_vm("vm1") is not None  # this worker does not know of the heartbeat
    real_get = store.get_vm
    counted: list[str] = []

    def get(name: str) -> VmRecord | None:
        counted.append(name)
        return real_get(name)

    store.get_vm = get  # type: ignore[method-assign]
    result = ingest_message(envelope("vm1", 2, [event("EV-B", status="Started")]), pipeline)
    assert result.outcome == "processed" and counted == ["vm1"]  # one read, after the 412
    saved = real_get("vm1")
    assert saved.last_sequence == 2
    assert saved.event_statuses == {"ev-b": "Started"}
    assert saved.callback_url == "http://10.0.0.4:8080" and saved.relay_version == "test"
    assert saved.last_seen == T0 + timedelta(minutes=4)  # the document's, after the beat
    assert store.get_event("EV-B", reporters=True).reporters == {"vm1": "Started"}
    assert publisher.transitions("EV-B") == ["scheduled", "decided", "started"]


def test_after_another_worker_took_the_session_the_next_document_is_read_afresh(
    azurite, store, clock, mocker
):
    """The VM's session moved to another worker, which handled numbers 2 and 3; this
    worker still remembers the row after number 1. Number 4 does not follow it, so it is
    judged on a fresh read."""
    pipeline, publisher = make_pipeline(store, clock)
    other, _ = make_pipeline(Store.from_connection_string(azurite, store.prefix), clock)
    ingest_message(envelope("vm1", 1, [event("EV-S")]), pipeline)
    ingest_message(envelope("vm1", 2, [event("EV-S", status="Started")]), other)
    ingest_message(envelope("vm1", 3, []), other)
    reads = mocker.spy(store, "get_vm")
    assert ingest_message(envelope("vm1", 4, [event("EV-T")]), pipeline).outcome == "processed"
    assert reads.call_count == 1
    saved = store.get_vm("vm1")
    assert (saved.last_sequence, saved.event_statuses) == (4, {"ev-t": "Scheduled"})
    assert publisher.transitions("EV-S") == ["scheduled", "decided"]  # the rest went to other
    assert store.get_event("EV-S", reporters=True).reporters == {}


def test_a_redelivery_of_what_another_worker_handled_repeats_it_and_is_found_stale(
    azurite, store, clock
):
    """Another worker handled number 2 but could not complete the message, so it comes
    back here, where the remembered row is from number 1. It follows that row, so the
    document is processed from it: the same writes the other worker made, then the
    guarded VM write fails and a fresh read shows it stale."""
    pipeline, publisher = make_pipeline(store, clock)
    other, other_publisher = make_pipeline(
        Store.from_connection_string(azurite, store.prefix), clock
    )
    two = ("vm1", "vm2")
    ingest_message(envelope("vm1", 1, [event("EV-D", resources=two)]), pipeline)
    ingest_message(envelope("vm2", 1, [event("EV-D", resources=two)]), other)
    body = envelope("vm1", 2, [event("EV-D", status="Started", resources=two)])
    ingest_message(body, other)
    assert ingest_message(body, pipeline).outcome == "stale"
    saved = store.get_vm("vm1")
    assert (saved.last_sequence, saved.event_statuses) == (2, {"ev-d": "Started"})
    assert store.get_event("EV-D", reporters=True).reporters == {
        "vm1": "Started",
        "vm2": "Scheduled",
    }
    announced = publisher.transitions("EV-D") + other_publisher.transitions("EV-D")
    # vm2's own view still says Scheduled: vm1's Started is vm1's word, not the event's.
    assert sorted(announced) == ["decided", "scheduled"]  # each once


def test_a_reinstalled_relays_numbers_do_not_match_an_old_remembered_row(store, clock, mocker):
    """A relay whose state directory was wiped counts from 1 again; a number that happens
    to follow the remembered row, observed long after it, is read, not assumed."""
    pipeline, _ = make_pipeline(store, clock)
    ingest_message(envelope("vm1", 1, [event("EV-I")]), pipeline)
    calls = Calls(store, mocker)
    later = T0 + timedelta(hours=2)
    clock.advance(2 * 3600)
    ingest_message(envelope("vm1", 2, [], observed_at=later), pipeline)
    assert calls.count("vms", "get_entity") == 1
    assert store.get_vm("vm1").event_ids == []
