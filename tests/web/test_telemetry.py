"""The lines the alerts read are really written where it matters: once per transition the
Service Bus publisher sends, and once per watchdog run of the Azure handler."""

from __future__ import annotations

import json

import azure.functions as func
from azure.functions.timer import TimerRequest

from functions import telemetry
from functions.pipeline.ingest import ingest_message
from functions.pipeline.publish import ServiceBusPublisher
from functions.triggers import core
from tests.functions.conftest import Handed, envelope, event, make_pipeline


def _lines(caplog) -> list[dict]:
    prefix = telemetry.PREFIX
    return [
        json.loads(r.getMessage()[len(prefix) :])
        for r in caplog.records
        if r.getMessage().startswith(prefix)
    ]


def test_the_publisher_logs_each_transition_it_sends(store, clock, relay, caplog):
    caplog.set_level("INFO", logger="sebridge.telemetry")
    sent = []

    class Sender:
        def send_messages(self, message):
            sent.append(message)

    pipeline, _ = make_pipeline(store, clock)
    pipeline.publisher = ServiceBusPublisher(Sender())
    ingest_message(envelope("vm1", 1, [event("EV-TL", "Reboot")], callback_url=relay.url), pipeline)
    # One line per published transition (admission's own line, kind "admission", aside).
    lines = [line for line in _lines(caplog) if line["kind"] == "transition"]
    assert [m.message_id for m in sent] == [line["message_id"] for line in lines]
    decided = next(line for line in lines if line["transition"] == "decided")
    assert (decided["rule"], decided["action"], decided["event_id"]) == (
        "default-hold",
        "hold",
        "EV-TL",
    )
    assert decided["not_before"] and decided["vms"] == ["vm1"]


def test_the_watchdog_handler_logs_each_run(store, clock, caplog):
    caplog.set_level("INFO", logger="sebridge.telemetry")
    pipeline, _ = make_pipeline(store, clock)
    core.use_pipeline(pipeline)
    try:
        core.watchdog(TimerRequest())
    finally:
        core.use_pipeline(None)
    (line,) = _lines(caplog)
    assert line["kind"] == "watchdog_run" and line["silent"] == 0


def test_the_sweep_says_what_it_handed_over_and_each_reconcile_what_it_did(
    store, clock, relay, caplog
):
    """In Azure the sweep reconciles nothing itself: its line counts what it found due and
    handed to the work queue, and the reconcile of each work item writes what it did (what
    it published, its approval, its end): issue 46 found the sweep's counts always 0 there."""
    caplog.set_level("INFO", logger="sebridge.telemetry")
    pipeline, _ = make_pipeline(store, clock)
    queue = Handed()  # as in Azure: keys handed over, none reconciled here
    pipeline.work_queue = queue
    ingest_message(envelope("vm1", 1, [event("EV-W", "Reboot")], callback_url=relay.url), pipeline)
    clock.advance(16 * 60)  # past its NotBefore: due, and ended by its silent reporter
    core.use_pipeline(pipeline)
    try:
        caplog.clear()
        core.watchdog(TimerRequest())
        (sweep,) = [line for line in _lines(caplog) if line["kind"] == "watchdog_run"]
        assert (sweep["due"], sweep["handed"]) == (1, 1), sweep
        assert queue.keys == ["EV-W"]
        caplog.clear()
        core.reconcile(func.ServiceBusMessage(body=b"EV-W"))
    finally:
        core.use_pipeline(None)
    (done,) = [line for line in _lines(caplog) if line["kind"] == "reconciled"]
    assert (done["event_id"], done["published"]) == ("EV-W", ["completed"]), done
    assert done["ended"] and done["approval"] is None, done
