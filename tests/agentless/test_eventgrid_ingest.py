"""Event Grid notifications through ingest: lifecycle, duplicates, reordering, mixed sources."""

from __future__ import annotations

import json
from datetime import timedelta

from functions.model.policy import Match, Policy, Rule
from tests.agentless.grid import event, grid_event, owner_id
from tests.agentless.queues import deliver
from tests.functions.conftest import T0, envelope, make_pipeline

HOLD_ALL = Policy(rules=[Rule(name="hold-all", match=Match(), action="hold")])


def send(pipeline, *items, schema="eventgrid"):
    body = [grid_event(i, schema=schema) if "EventId" in i else i for i in items]
    return deliver(json.dumps(body[0] if len(body) == 1 else body), pipeline)


def test_scheduled_started_completed(store, clock):
    pipeline, pub = make_pipeline(store, clock)
    ev = event("EV-1", "Reboot")
    result = send(pipeline, ev)
    assert result.outcome == "processed" and result.vm is None
    assert pub.transitions("EV-1") == ["scheduled", "decided"]
    record = store.get_event("EV-1", reporters=True)
    assert record.decision.action == "hold" and record.reporters == {}
    assert record.arm_resource == owner_id()
    send(pipeline, {**ev, "EventStatus": "Started", "NotBefore": ""}, schema="cloudevents")
    send(pipeline, {**ev, "EventStatus": "Completed", "NotBefore": ""})
    assert pub.transitions("EV-1") == ["scheduled", "decided", "started", "completed"]
    record = store.get_event("EV-1")
    assert record.ended == "completed" and record.started and record.not_before is not None


def test_canceled_is_announced_cancelled(store, clock):
    pipeline, pub = make_pipeline(store, clock)
    ev = event("EV-C", "Redeploy")
    send(pipeline, ev)
    send(pipeline, {**ev, "EventStatus": "Canceled"})
    assert pub.transitions("EV-C") == ["scheduled", "decided", "cancelled"]
    assert store.get_event("EV-C").ended == "cancelled"


def test_started_directly_skips_scheduled(store, clock):
    pipeline, pub = make_pipeline(store, clock)
    send(pipeline, event("EV-HW", "Reboot", status="Started", not_before=None))
    assert pub.transitions("EV-HW") == ["started", "decided"]


def test_same_notification_twice_is_dropped_by_its_event_grid_id(store, clock):
    pipeline, pub = make_pipeline(store, clock)
    item = grid_event(event("EV-D", "Reboot"), grid_id="grid-1")
    first = deliver(json.dumps(item), pipeline)
    again = deliver(json.dumps(item), pipeline)
    assert first.outcome == "processed" and again.outcome == "stale"
    assert pub.transitions("EV-D") == ["scheduled", "decided"]
    # A new notification (new id) about the same state is processed and changes nothing.
    other = deliver(json.dumps(grid_event(event("EV-D", "Reboot"))), pipeline)
    assert other.outcome == "processed" and other.transitions == []


def test_late_scheduled_after_completed_does_not_reopen(store, clock):
    pipeline, pub = make_pipeline(store, clock)
    ev = event("EV-O", "Reboot")
    send(pipeline, {**ev, "EventStatus": "Completed", "NotBefore": ""})
    assert pub.transitions("EV-O") == ["completed"]
    send(pipeline, {**ev, "EventStatus": "Started", "NotBefore": ""})
    send(pipeline, ev)
    assert pub.transitions("EV-O") == ["completed"]
    record = store.get_event("EV-O")
    assert record.ended == "completed" and record.decision is None


def test_started_before_scheduled_keeps_started(store, clock):
    pipeline, pub = make_pipeline(store, clock)
    ev = event("EV-R", "Freeze", duration=30)
    send(pipeline, {**ev, "EventStatus": "Started", "NotBefore": ""})
    send(pipeline, ev)
    assert pub.transitions("EV-R") == ["started", "decided"]
    record = store.get_event("EV-R")
    assert record.started and record.event_status == "Started"


def test_relay_and_event_grid_report_one_event(store, clock, relay):
    """A relay's VM and Event Grid name the same EventId: one row, decided and announced
    once, approved once (through the relay: it reported first); Event Grid's Completed
    ends it although the relay still lists it, and the relay's later report keeps it ended."""
    pipeline, pub = make_pipeline(store, clock)
    ev = event("EV-M", "Freeze", duration=5, resources=("vm1",))
    deliver(envelope("vm1", 1, [ev], callback_url=relay.url), pipeline)
    assert pub.transitions("EV-M") == ["scheduled", "decided", "approved"]
    send(pipeline, ev)
    send(pipeline, {**ev, "EventStatus": "Started", "NotBefore": ""})
    assert relay.starts() == ["EV-M"]
    assert pub.transitions("EV-M") == ["scheduled", "decided", "approved", "started"]
    send(pipeline, {**ev, "EventStatus": "Completed", "NotBefore": ""})
    deliver(
        envelope("vm1", 2, [{**ev, "EventStatus": "Started"}], callback_url=relay.url), pipeline
    )
    deliver(envelope("vm1", 3, [], callback_url=relay.url), pipeline)
    assert pub.transitions("EV-M") == ["scheduled", "decided", "approved", "started", "completed"]
    record = store.get_event("EV-M")
    assert record.ended == "completed" and record.arm_resource == owner_id()
    assert [a["outcome"] for a in store.audit_rows("EV-M")] == [
        "approving",
        "approved via relay:vm1",
    ]


def test_event_grid_first_then_relay(store, clock, relay):
    pipeline, pub = make_pipeline(store, clock, HOLD_ALL)
    ev = event("EV-G", "Reboot", resources=("vm1",))
    send(pipeline, ev)
    deliver(envelope("vm1", 1, [ev], callback_url=relay.url), pipeline)
    assert pub.transitions("EV-G") == ["scheduled", "decided"]
    record = store.get_event("EV-G", reporters=True)
    assert record.reporters == {"vm1": "Scheduled"} and record.arm_resource == owner_id()
    # Absence from every relay's document still ends it (IMDS says so too); Event Grid's
    # own end, arriving later, changes nothing.
    deliver(envelope("vm1", 2, [], callback_url=relay.url), pipeline)
    assert pub.transitions("EV-G")[-1] == "cancelled"
    send(pipeline, {**ev, "EventStatus": "Completed"})
    assert pub.transitions("EV-G") == ["scheduled", "decided", "cancelled"]


def test_scale_set_owner_feeds_the_capacity_guard(store, clock):
    pipeline, _ = make_pipeline(store, clock)
    item = grid_event(
        event("EV-S", "Reboot", resources=("web_1",)),
        owner=owner_id("virtualMachineScaleSets", "web"),
    )
    deliver(json.dumps(item), pipeline)
    assert store.get_event("EV-S").scale_sets == ["web"]


def test_malformed_notifications_are_recorded_never_raised(store, clock):
    pipeline, pub = make_pipeline(store, clock)
    bad = grid_event(event("EV-B"))
    bad["data"]["resourceInfo"]["properties"]["EventStatus"] = "Exploded"
    good = grid_event(event("EV-OK", "Reboot"))
    result = deliver(json.dumps([bad, good]), pipeline)
    assert result.outcome == "processed" and "Exploded" in result.reason
    assert pub.transitions("EV-OK") == ["scheduled", "decided"]
    only_bad = deliver(json.dumps(bad), pipeline)
    broken = deliver(b'[{"eventType": ', pipeline)
    assert only_bad.outcome == "rejected" and broken.outcome == "rejected"
    reasons = sorted(r["reason"] for r in store.rejected_rows())
    assert len(reasons) == 3 and all(reasons)
    assert any("not JSON" in r for r in reasons)


def test_a_failed_write_forgets_the_notification_so_the_redelivery_applies_it(store, clock):
    pipeline, pub = make_pipeline(store, clock)

    class Down(Exception):
        pass

    def boom(note):
        raise Down("topic down")

    item = grid_event(event("EV-F", "Reboot"), grid_id="grid-f")
    pipeline.publisher.publish, real = boom, pipeline.publisher.publish
    try:
        deliver(json.dumps(item), pipeline)
    except Down:
        pass
    else:
        raise AssertionError("a topic failure must reach the caller (message abandoned)")
    pipeline.publisher.publish = real
    assert deliver(json.dumps(item), pipeline).outcome == "processed"
    assert pub.transitions("EV-F") == ["scheduled", "decided"]


def test_not_before_from_event_grid_is_used(store, clock):
    pipeline, _ = make_pipeline(store, clock)
    send(pipeline, event("EV-N", "Reboot", not_before=T0 + timedelta(minutes=7)))
    assert store.get_event("EV-N").not_before == T0 + timedelta(minutes=7)


def test_watchdog_ends_an_event_grid_only_event_whose_end_never_came(store, clock, relay):
    """No relay's silence can end it: past EVENTGRID_END_AFTER_SECONDS beyond NotBefore the
    watchdog ends it (its capacity slot freed), and leaves relay-reported events alone."""
    from functions.pipeline.watchdog import run_watchdog

    approve_all = Policy(rules=[Rule(name="all", match=Match(), action="approve")])
    pipeline, pub = make_pipeline(
        store,
        clock,
        approve_all,
        eventgrid_end_after_seconds=3600,
        approvers="relay",
        relay_silent_after_seconds=10**6,  # vm2 never counts as silent here
    )
    send(pipeline, event("EV-LOST", "Reboot"))
    deliver(envelope("vm2", 1, [event("EV-RELAY", "Reboot", resources=("vm2",))]), pipeline)
    clock.advance(15 * 60 + 3599)
    assert "EV-LOST" not in run_watchdog(pipeline).ended
    clock.advance(2)
    report = run_watchdog(pipeline)
    assert "EV-LOST" in report.ended and "EV-RELAY" not in report.ended
    assert pub.transitions("EV-LOST")[-1] == "completed"
    last = [n for n in pub.published if n.event and n.event.event_id == "EV-LOST"][-1]
    assert "no Event Grid notification of its end" in last.detail
    assert store.get_event("EV-LOST").ended == "completed"
    assert store.get_event("EV-RELAY").ended == ""
    assert "EV-LOST" not in run_watchdog(pipeline).ended  # once
