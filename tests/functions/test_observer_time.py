"""Issue 40: time from the observer. Completed or cancelled is decided by when the relay
saw the event disappear (its `observed_at`, bounded by the app's clock), never by when the
app got round to the document: on 2cd3d60 a withdrawn Reboot whose "it is gone" document
was processed after NotBefore (a storage outage, a backlog) was announced `completed`."""

from __future__ import annotations

from datetime import timedelta

from functions.pipeline.ingest import ingest_message
from functions.pipeline.lifecycle import MAX_OBSERVER_LAG, observed
from tests.functions.conftest import T0, envelope, event, make_pipeline


def test_a_withdrawal_processed_late_is_still_cancelled(store, clock):
    pipeline, pub = make_pipeline(store, clock)
    ev = event("EV-W", resources=("vm1",), not_before=T0 + timedelta(minutes=15))
    ingest_message(envelope("vm1", 1, [ev], observed_at=T0), pipeline)
    clock.advance(30 * 60)  # the app gets to the next document 30 minutes later
    gone = envelope("vm1", 2, [], observed_at=T0 + timedelta(minutes=5))
    ingest_message(gone, pipeline)
    record = store.get_event("EV-W")
    assert record.ended == "cancelled"
    assert record.ended_at == T0 + timedelta(minutes=5)  # when the relay saw it go
    assert pub.transitions("EV-W")[-1] == "cancelled"


def test_a_started_event_records_when_its_relay_saw_it_start(store, clock):
    pipeline, _ = make_pipeline(store, clock)
    ev = event("EV-S", resources=("vm1",), not_before=T0 + timedelta(minutes=15))
    ingest_message(envelope("vm1", 1, [ev], observed_at=T0), pipeline)
    clock.advance(600)
    started = {**ev, "EventStatus": "Started", "NotBefore": ""}
    seen = T0 + timedelta(minutes=2)
    ingest_message(envelope("vm1", 2, [started], observed_at=seen), pipeline)
    assert store.get_event("EV-S").started_at == seen


def test_an_observers_time_is_bounded_by_the_apps_clock():
    assert observed(T0 + timedelta(hours=1), T0) == T0  # never ahead of the app
    assert observed(T0 - timedelta(days=30), T0) == T0 - MAX_OBSERVER_LAG  # nor too old
    assert observed(T0 - timedelta(minutes=3), T0) == T0 - timedelta(minutes=3)
