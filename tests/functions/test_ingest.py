"""Lifecycle, decisions, announcements and approval through the ingest pipeline."""

from __future__ import annotations

from datetime import timedelta

from functions.model.policy import Match, Policy, PolicyLoad, Rule, sample_rules
from functions.pipeline.ingest import ingest_message
from tests.functions.conftest import T0, envelope, event, make_pipeline


def test_reboot_scheduled_decided_held_then_started_and_completed(store, clock, relay):
    pipeline, pub = make_pipeline(store, clock)
    ev = event("EV-R", "Reboot")
    ingest_message(envelope("vm1", 1, [ev], callback_url=relay.url), pipeline)
    assert pub.transitions("EV-R") == ["scheduled", "decided"]
    decided = pub.published[1]
    assert decided.decision.action == "hold" and decided.decision.rule == "default-hold"
    assert decided.decision.page is True  # Reboot held outside a window pages by default
    assert relay.requests == []
    started = {**ev, "EventStatus": "Started", "NotBefore": ""}
    ingest_message(envelope("vm1", 2, [started], callback_url=relay.url), pipeline)
    ingest_message(envelope("vm1", 3, [], callback_url=relay.url), pipeline)
    assert pub.transitions("EV-R") == ["scheduled", "decided", "started", "completed"]
    record = store.get_event("EV-R", reporters=True)
    assert record.ended == "completed" and record.reporters == {}
    audit = store.audit_rows("EV-R")
    assert [(a["rule"], a["action"], a["outcome"]) for a in audit] == [
        ("default-hold", "hold", "decided")
    ]


def test_removed_without_starting_is_cancelled(store, clock, relay):
    pipeline, pub = make_pipeline(store, clock)
    ingest_message(envelope("vm1", 1, [event("EV-C", "Redeploy")]), pipeline)
    ingest_message(envelope("vm1", 2, []), pipeline)
    assert pub.transitions("EV-C") == ["scheduled", "decided", "cancelled"]
    assert pub.published[1].decision.page is True  # Redeploy pages by default


def test_started_directly_is_announced_started_without_scheduled(store, clock):
    pipeline, pub = make_pipeline(store, clock)
    ev = event("EV-HW", "Reboot", status="Started", not_before=None)
    ingest_message(envelope("vm1", 1, [ev]), pipeline)
    assert pub.transitions("EV-HW") == ["started", "decided"]
    ingest_message(envelope("vm1", 2, []), pipeline)
    assert pub.transitions("EV-HW")[-1] == "completed"


def test_user_event_is_approved_through_the_relay(store, clock, relay):
    pipeline, pub = make_pipeline(store, clock)
    ev = event("EV-U", "Redeploy", source="User")
    result = ingest_message(envelope("vm1", 1, [ev], callback_url=relay.url), pipeline)
    assert pub.transitions("EV-U") == ["scheduled", "decided", "approved"]
    assert relay.starts() == ["EV-U"] and relay.requests[0]["path"] == "/v1/start"
    assert relay.bad_signatures == 0
    assert result.approvals[0].outcome == "approved" and result.approvals[0].vm == "vm1"
    record = store.get_event("EV-U")
    assert record.approval == "approved" and record.approved_by == "vm1"
    outcomes = [a["outcome"] for a in store.audit_rows("EV-U")]
    assert outcomes == ["approving", "approved via relay:vm1"]


def test_terminate_is_drained_not_approved_by_ingest(store, clock, relay):
    pipeline, pub = make_pipeline(store, clock)
    ev = event("EV-T", "Terminate", source="User", resources=("ss_3",))
    ingest_message(envelope("ss_3", 1, [ev], callback_url=relay.url, scale_set="ss"), pipeline)
    assert pub.transitions("EV-T") == ["scheduled", "decided"]
    assert pub.published[1].decision.action == "drain"
    assert pub.published[1].decision.rule == "terminate-drain"
    assert relay.requests == []


def test_short_freeze_approved_long_freeze_held(store, clock, relay):
    pipeline, _pub = make_pipeline(store, clock)
    short = event("EV-F5", "Freeze", duration=5)
    long = event("EV-F30", "Freeze", duration=30)
    ingest_message(envelope("vm1", 1, [short, long], callback_url=relay.url), pipeline)
    assert relay.starts() == ["EV-F5"]
    assert store.get_event("EV-F30").decision.action == "hold"


def test_availability_set_event_ends_only_when_every_reporter_drops_it(store, clock):
    pipeline, pub = make_pipeline(store, clock)
    ev = event("EV-AS", "Freeze", resources=("a1", "a2", "a3"), duration=30)
    for seq, vm in enumerate(("a1", "a2", "a3"), start=1):
        ingest_message(envelope(vm, seq, [ev], availability_set="as1"), pipeline)
    assert pub.transitions("EV-AS") == ["scheduled", "decided"]
    ingest_message(envelope("a1", 10, []), pipeline)
    ingest_message(envelope("a2", 10, []), pipeline)
    assert pub.transitions("EV-AS") == ["scheduled", "decided"]
    assert set(store.get_event("EV-AS", reporters=True).reporters) == {"a3"}
    ingest_message(envelope("a3", 10, []), pipeline)
    assert pub.transitions("EV-AS") == ["scheduled", "decided", "cancelled"]
    assert store.get_event("EV-AS").availability_sets == ["as1"]


def test_redelivery_and_reordering_change_nothing(store, clock):
    pipeline, pub = make_pipeline(store, clock)
    first = envelope("vm1", 1, [event("EV-O")])
    second = envelope("vm1", 2, [])
    assert ingest_message(first, pipeline).outcome == "processed"
    assert ingest_message(second, pipeline).outcome == "processed"
    # An old document arriving late, and a plain redelivery: both ignored.
    assert ingest_message(first, pipeline).outcome == "stale"
    assert ingest_message(second, pipeline).outcome == "stale"
    assert pub.transitions("EV-O") == ["scheduled", "decided", "cancelled"]
    assert pub.duplicates == []
    vm = store.get_vm("vm1")
    assert vm.last_sequence == 2 and vm.event_ids == []


def test_a_relay_that_restarted_its_sequence_is_still_heard(store, clock):
    pipeline, pub = make_pipeline(store, clock)
    ingest_message(envelope("vm1", 50, []), pipeline)
    later = T0 + timedelta(hours=1)
    clock.advance(3600)
    ev = event("EV-N", not_before=later + timedelta(minutes=15))
    result = ingest_message(envelope("vm1", 0, [ev], observed_at=later), pipeline)
    assert result.outcome == "processed"
    assert pub.transitions("EV-N") == ["scheduled", "decided"]


def test_poison_envelope_is_recorded_and_completed(store, clock):
    pipeline, pub = make_pipeline(store, clock)
    result = ingest_message(b'{"schema": 1, "kind": "document", "vm": {}}', pipeline, "m-1")
    assert result.outcome == "rejected"
    bad_doc = envelope("vm1", 1, [{"EventId": "X"}])
    assert ingest_message(bad_doc, pipeline, "m-2").outcome == "rejected"
    assert ingest_message(b"\xff not json", pipeline, "m-3").outcome == "rejected"
    rows = sorted(store.rejected_rows(), key=lambda r: r["message_id"])
    assert [r["message_id"] for r in rows] == ["m-1", "m-2", "m-3"]
    assert "vm" in rows[0]["reason"] and "EventStatus" in rows[1]["reason"]
    assert pub.published == []


def test_heartbeat_updates_the_vm_without_touching_events(store, clock, relay):
    pipeline, _pub = make_pipeline(store, clock)
    ingest_message(envelope("vm1", 1, [event("EV-H")]), pipeline)
    ingest_message(envelope("vm1", 2, None, kind="heartbeat", callback_url=relay.url), pipeline)
    vm = store.get_vm("vm1")
    assert vm.callback_url == relay.url and vm.last_sequence == 2 and vm.event_ids == ["EV-H"]
    assert store.get_event("EV-H", reporters=True).reporters == {"vm1": "Scheduled"}


def test_dry_run_decides_audits_announces_never_approves(store, clock, relay):
    pipeline, pub = make_pipeline(store, clock, Policy(rules=sample_rules(), dry_run=True))
    ingest_message(
        envelope("vm1", 1, [event("EV-D", source="User")], callback_url=relay.url), pipeline
    )
    assert pub.transitions("EV-D") == ["scheduled", "decided"]
    assert pub.published[1].decision.dry_run is True
    assert pub.published[1].decision.action == "approve"
    assert relay.requests == []
    assert store.audit_rows("EV-D")[0]["outcome"] == "dry run: would approve"


def test_invalid_policy_fails_closed(store, clock, relay):
    pipeline, pub = make_pipeline(store, clock, PolicyLoad(policy=None, error="rules: bad"))
    ev = event("EV-P", "Freeze", duration=2, source="User")
    ingest_message(envelope("vm1", 1, [ev], callback_url=relay.url), pipeline)
    assert pub.transitions("EV-P") == ["scheduled", "policy_invalid"]
    note = pub.published[1]
    assert note.decision.policy_error == "rules: bad" and note.decision.action == "hold"
    assert note.page is True
    assert relay.requests == []
    assert store.audit_rows("EV-P")[0]["outcome"] == "failed closed: policy invalid"


def test_resource_glob_and_scale_set_rules(store, clock, relay):
    policy = Policy(
        rules=(
            Rule(name="web", match=Match(scale_sets=("web",)), action="approve"),
            Rule(name="db", match=Match(resources=("db-*",)), action="hold"),
            Rule(name="rest", action="drain"),
        ),
        max_concurrent_per_set=5,
    )
    pipeline, _pub = make_pipeline(store, clock, policy)
    ingest_message(
        envelope(
            "web_1",
            1,
            [event("E-W", resources=("web_1",))],
            scale_set="web",
            callback_url=relay.url,
        ),
        pipeline,
    )
    ingest_message(envelope("db-7", 1, [event("E-D", resources=("db-7",))]), pipeline)
    ingest_message(envelope("x", 1, [event("E-X", resources=("x",))]), pipeline)
    assert store.get_event("E-W").decision.rule == "web"
    assert relay.starts() == ["E-W"]
    assert store.get_event("E-D").decision.rule == "db"
    assert store.get_event("E-X").decision.rule == "rest"
