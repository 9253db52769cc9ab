"""Failures between steps: a topic outage, a crash after a claim, racing decisions."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
import requests

from functions.model.event import Notification
from functions.model.policy import Policy, Rule
from functions.pipeline.context import Pipeline
from functions.pipeline.ingest import ingest_message
from functions.pipeline.lifecycle import ANNOUNCE_LEASE
from functions.pipeline.publish import LocalPublisher
from functions.pipeline.watchdog import run_watchdog
from functions.store import claims
from functions.store.state import Store
from tests import identity_harness
from tests.functions.conftest import (
    envelope,
    event,
    make_pipeline,
    make_settings,
    write_liveness,
)


class FlakyPublisher(LocalPublisher):
    """Fails the first `failures` publishes, like a topic that is briefly unreachable."""

    def __init__(self, failures: int) -> None:
        super().__init__()
        self.failures = failures

    def publish(self, notification: Notification) -> None:
        if self.failures > 0:
            self.failures -= 1
            raise ConnectionError("topic unreachable")
        super().publish(notification)


def test_topic_outage_raises_and_the_redelivery_announces_and_approves(store, clock, relay):
    pipeline, _ = make_pipeline(store, clock)
    pipeline.publisher = flaky = FlakyPublisher(failures=2)
    body = envelope("vm1", 1, [event("EV-T", source="User")], callback_url=relay.url)
    with pytest.raises(ConnectionError):
        ingest_message(body, pipeline)  # scheduled fails: the message is abandoned
    assert store.get_event("EV-T").announced == {}  # claims released
    with pytest.raises(ConnectionError):
        ingest_message(body, pipeline)  # redelivery: fails again
    ingest_message(body, pipeline)  # third delivery goes through
    assert flaky.transitions("EV-T") == ["scheduled", "decided", "approved"]
    assert flaky.duplicates == [] and relay.starts() == ["EV-T"]
    assert len(store.audit_rows("EV-T")) == 2  # decided once, approved once


def test_claim_left_pending_by_a_crash_is_republished_by_the_watchdog(store, clock):
    pipeline, pub = make_pipeline(store, clock)
    ingest_message(envelope("vm1", 1, [event("EV-P")]), pipeline)

    def crash(rec):  # as if the process died between claiming `started` and publishing
        rec.announced["started"] = claims.pending(clock.now(), ANNOUNCE_LEASE)
        return rec

    store.mutate_event("EV-P", crash)
    assert run_watchdog(pipeline).republished == []  # could still be in flight
    clock.advance(5 * 60)
    ingest_message(envelope("vm1", 2, None, kind="heartbeat"), pipeline)
    assert run_watchdog(pipeline).republished == ["EV-P:started"]
    assert pub.transitions("EV-P") == ["scheduled", "decided", "started"]
    assert store.get_event("EV-P").announced["started"] == "done"


def test_two_events_racing_for_one_slot_get_one_approval(azurite, store, clock, new_relay):
    policy = Policy(rules=(Rule(name="all", action="approve"),), max_concurrent_per_set=1)
    settings = make_settings(policy)
    publisher = LocalPublisher()
    names = [f"web_{i}" for i in range(6)]
    relays = {n: new_relay() for n in names}
    barrier = threading.Barrier(len(names))
    errors: list[BaseException] = []

    def one(vm: str) -> None:
        try:
            own = Store.from_connection_string(azurite, store.prefix)
            pipeline = Pipeline(
                own,
                settings,
                publisher,
                requests.Session(),
                clock,
                admission=identity_harness.admission(own, clock.now),
            )
            body = envelope(
                vm,
                1,
                [event(f"E-{vm}", resources=(vm,))],
                scale_set="web",
                callback_url=relays[vm].url,
            )
            barrier.wait()
            ingest_message(body, pipeline)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(n,)) for n in names]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert sum(len(r.requests) for r in relays.values()) == 1
    assert len(store.get_capacity("ss:web").holders) == 1


def test_links_and_late_reporters(store, clock):
    pipeline, pub = make_pipeline(
        store,
        clock,
        public_base_url="https://fn.example.net/",
        operators_group_id="0b5c6d2e-0000-4000-8000-000000000001",
        app_secret="s" * 32,
        website_auth_enabled=True,
    )
    ingest_message(envelope("vm1", 1, [event("EV-L", resources=("vm1", "vm2"))]), pipeline)
    links = pub.published[0].links
    # The signed-in pages, never the function-key API: a card must not need a key.
    assert links.status_url == "https://fn.example.net/api/pages/fleet"
    assert links.approve_url == "https://fn.example.net/api/pages/events/EV-L"
    ingest_message(envelope("vm1", 2, []), pipeline)
    assert pub.transitions("EV-L")[-1] == "cancelled"
    # vm2's first document names it: vm1's end was vm1's, so it reopens for vm2 (issue 31)
    # without announcing anything new, and vm2's next document ends it again.
    ingest_message(envelope("vm2", 1, [event("EV-L", resources=("vm1", "vm2"))]), pipeline)
    assert pub.transitions("EV-L") == ["scheduled", "decided", "cancelled"]
    reopened = store.get_event("EV-L", reporters=True)
    assert not reopened.ended and reopened.reporters == {"vm2": "Scheduled"}
    ingest_message(envelope("vm2", 2, []), pipeline)
    assert pub.transitions("EV-L") == ["scheduled", "decided", "cancelled", "cancelled"]
    assert store.get_event("EV-L").ended == "cancelled"


def test_a_vm_deleted_by_terminate_is_not_announced_silent(store, clock):
    pipeline, pub = make_pipeline(store, clock)
    ev = event(
        "EV-DEL",
        "Terminate",
        source="User",
        resources=("ss_1",),
        not_before=clock.now() + timedelta(minutes=5),
    )
    ingest_message(envelope("ss_1", 1, [ev], scale_set="ss"), pipeline)
    ingest_message(envelope("other", 1, []), pipeline)
    write_liveness(store, "ss_1", clock.now())
    write_liveness(store, "other", clock.now())
    clock.advance(20 * 60)
    report = run_watchdog(pipeline)
    assert report.silent == ["other"]
    assert report.ended == ["EV-DEL"]  # its only reporter went silent after NotBefore
    assert pub.transitions("EV-DEL")[-1] == "completed"
