"""relay_recovered: announced once when a relay announced silent reports again; a failed
publish is left to the watchdog; racing documents announce it once."""

from __future__ import annotations

import threading
from datetime import timedelta

import requests

from functions.pipeline.context import Pipeline
from functions.pipeline.ingest import ingest_message
from functions.pipeline.publish import LocalPublisher
from functions.pipeline.watchdog import run_watchdog
from functions.store.state import Store
from tests import identity_harness
from tests.functions.conftest import (
    T0,
    VERIFIER,
    envelope,
    event,
    make_pipeline,
    make_settings,
    write_liveness,
)


def heartbeat(vm: str, sequence: int, clock) -> str:
    return envelope(vm, sequence, None, kind="heartbeat", observed_at=clock.now())


def silence(pipeline, clock, vm: str = "vm1") -> None:
    ingest_message(envelope(vm, 1, [event("E-1", resources=(vm,))]), pipeline)
    write_liveness(pipeline.store, vm, clock.now())
    clock.advance(11 * 60)
    assert run_watchdog(pipeline).silent == [vm]


def of(pub: LocalPublisher, transition: str) -> list:
    return [n for n in pub.published if n.transition == transition]


def test_announced_once_when_a_silent_relay_reports_again(store, clock):
    pipeline, pub = make_pipeline(store, clock)
    silence(pipeline, clock)
    clock.advance(60)
    ingest_message(heartbeat("vm1", 2, clock), pipeline)
    ingest_message(heartbeat("vm1", 3, clock), pipeline)
    assert run_watchdog(pipeline).recovered == []
    (silent,) = of(pub, "relay_silent")
    (recovered,) = of(pub, "relay_recovered")
    assert recovered.vm == "vm1" and recovered.event is None and recovered.page is False
    assert recovered.occurrence == silent.occurrence == "20261121T100000"
    assert recovered.message_id() == "vm:vm1:relay_recovered:20261121T100000"
    assert "12 min of silence" in recovered.detail
    vm = store.get_vm("vm1")
    assert vm.silent_announced_for is None and vm.recovery_pending is None
    # Silent again later: a new silence, and its own recovery.
    clock.advance(11 * 60)
    assert run_watchdog(pipeline).silent == ["vm1"]
    ingest_message(heartbeat("vm1", 4, clock), pipeline)
    ids = [n.message_id() for n in of(pub, "relay_recovered")]
    assert len(ids) == 2 and len(set(ids)) == 2
    assert pub.duplicates == []


def test_not_announced_for_a_relay_never_announced_silent(store, clock):
    pipeline, pub = make_pipeline(store, clock)
    ingest_message(envelope("vm1", 1, [event("E-1")]), pipeline)
    clock.advance(5 * 60)  # quiet, but not silent for long enough
    assert run_watchdog(pipeline).silent == []
    ingest_message(heartbeat("vm1", 2, clock), pipeline)
    assert of(pub, "relay_recovered") == []


def test_a_failed_publish_is_republished_by_the_watchdog(store, clock):
    pipeline, pub = make_pipeline(store, clock)
    silence(pipeline, clock)

    class Down:
        def publish(self, note):
            raise ConnectionError("topic unreachable")

    down = Pipeline(
        store,
        pipeline.settings,
        Down(),
        requests.Session(),
        clock,
        liveness_verifier=VERIFIER,
        admission=pipeline.admission,
    )
    result = ingest_message(heartbeat("vm1", 2, clock), down)  # processed, not raised
    assert result.outcome == "processed"
    assert store.get_vm("vm1").recovery_pending is not None
    assert of(pub, "relay_recovered") == []
    clock.advance(60)
    assert run_watchdog(pipeline).recovered == []  # it may still be on its way
    clock.advance(3 * 60)
    assert run_watchdog(pipeline).recovered == ["vm1"]
    (recovered,) = of(pub, "relay_recovered")
    assert recovered.message_id() == "vm:vm1:relay_recovered:20261121T100000"
    assert store.get_vm("vm1").recovery_pending is None
    assert run_watchdog(pipeline).recovered == []


def test_racing_documents_announce_it_once(azurite, store, clock):
    pub = LocalPublisher()
    settings = make_settings()
    pipeline = Pipeline(
        store,
        settings,
        pub,
        requests.Session(),
        clock,
        liveness_verifier=VERIFIER,
        admission=identity_harness.admission(store, clock.now),
    )
    silence(pipeline, clock)
    clock.advance(3600 - 11 * 60)  # the relay is back an hour after it was last heard
    bodies = [
        envelope(
            "vm1", 10 + i, None, kind="heartbeat", observed_at=T0 + timedelta(hours=1, seconds=i)
        )
        for i in range(6)
    ]
    barrier = threading.Barrier(len(bodies))
    errors: list[BaseException] = []

    def one(body: str) -> None:
        try:
            own = Store.from_connection_string(azurite, store.prefix)
            p = Pipeline(
                own,
                settings,
                pub,
                requests.Session(),
                clock,
                admission=identity_harness.admission(own, clock.now),
            )
            barrier.wait()
            ingest_message(body, p)
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(b,)) for b in bodies]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(of(pub, "relay_recovered")) == 1
    assert pub.duplicates == []  # not even a second publish


def test_a_mark_that_is_not_a_time_is_still_announced():
    from functions.pipeline.relay_recovery import recovery_note

    note = recovery_note("vm1", "not a time!", T0)
    assert note.message_id() == "vm:vm1:relay_recovered:notatime"
    assert "not a time!" in note.detail
