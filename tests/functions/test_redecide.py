"""Fail-closed recovery: events held on an invalid policy are re-decided, once, as soon as
the host's policy is valid (watchdog or the event's next document), then announced,
audited and approved through the ordinary paths."""

from __future__ import annotations

import threading
from datetime import timedelta

import requests

from functions.model.event import Transition
from functions.model.policy import Policy, PolicyLoad, Rule, Window, sample_rules
from functions.pipeline.announce import build
from functions.pipeline.approve import approve_event
from functions.pipeline.context import Pipeline
from functions.pipeline.ingest import ingest_message
from functions.pipeline.publish import LocalPublisher
from functions.pipeline.watchdog import run_watchdog
from functions.store.state import Store
from tests import identity_harness
from tests.functions.conftest import T0, envelope, event, make_settings

INVALID = PolicyLoad(policy=None, error="rules.0.action: Input should be 'approve'")


def pipeline_for(store, clock, publisher, policy: Policy | PolicyLoad | None = None, **kw):
    return Pipeline(
        store,
        make_settings(policy, **kw),
        publisher,
        requests.Session(),
        clock,
        admission=identity_harness.admission(store, clock.now),
    )


def failed_closed(store, clock, publisher, relay, ev):
    """Ingest `ev` from vm1 on a host whose policy is invalid."""
    invalid = pipeline_for(store, clock, publisher, INVALID)
    ingest_message(envelope("vm1", 1, [ev], callback_url=relay.url), invalid)
    record = store.get_event(ev["EventId"])
    assert record.decision.policy_error is not None
    assert publisher.transitions(ev["EventId"]) == ["scheduled", "policy_invalid"]
    return record


def test_watchdog_redecides_a_fail_closed_event_once_and_approves_it(store, clock, relay):
    pub = LocalPublisher()
    failed_closed(store, clock, pub, relay, event("EV-R", source="User"))
    clock.advance(60)
    # The operator fixed the policy: the host restarted with a valid one.
    valid = pipeline_for(store, clock, pub)
    report = run_watchdog(valid)
    assert report.redecided == ["EV-R"]
    assert [a.outcome for a in report.approvals] == ["approved"]
    assert relay.starts() == ["EV-R"]
    assert pub.transitions("EV-R") == ["scheduled", "policy_invalid", "decided", "approved"]
    decided = pub.published[2]
    assert decided.decision.policy_error is None
    assert (decided.decision.action, decided.decision.rule) == ("approve", "user-initiated")
    assert "re-decided: the policy is valid again" in decided.decision.reason
    assert "rules.0.action" in decided.decision.reason
    # Its own MessageId: duplicate detection cannot take it for a first `decided`.
    assert decided.message_id() == "event:EV-R:decided:redecided-20261121T100100"
    assert pub.duplicates == []
    record = store.get_event("EV-R")
    assert record.redecided_at == T0 + timedelta(seconds=60)
    assert record.approval == "approved" and record.announced["decided"] == "done"
    outcomes = [(r["rule"], r["outcome"]) for r in store.audit_rows("EV-R")]
    assert outcomes == [
        ("policy-invalid", "failed closed: policy invalid"),
        ("user-initiated", "approving"),
        ("user-initiated", "approved via relay:vm1"),
    ]
    # Once: later sweeps (and later documents) leave the new decision alone.
    clock.advance(60)
    assert run_watchdog(valid).redecided == []
    ingest_message(
        envelope("vm1", 2, [event("EV-R", source="User")], callback_url=relay.url), valid
    )
    assert pub.transitions("EV-R") == ["scheduled", "policy_invalid", "decided", "approved"]
    assert relay.starts() == ["EV-R"]


def test_the_next_document_redecides_too(store, clock, relay):
    pub = LocalPublisher()
    ev = event("EV-N", "Freeze", duration=2)
    failed_closed(store, clock, pub, relay, ev)
    valid = pipeline_for(store, clock, pub)
    clock.advance(5)
    result = ingest_message(envelope("vm1", 2, [ev], callback_url=relay.url), valid)
    assert ("EV-N", "decided") in result.transitions
    assert [a.outcome for a in result.approvals] == ["approved"]
    assert pub.transitions("EV-N") == ["scheduled", "policy_invalid", "decided", "approved"]
    assert pub.published[2].decision.rule == "short-freeze"
    assert pub.published[2].message_id().startswith("event:EV-N:decided:redecided-")
    assert run_watchdog(valid).redecided == []
    assert relay.starts() == ["EV-N"]


def test_a_hold_is_redecided_and_announced_but_not_approved(store, clock, relay):
    pub = LocalPublisher()
    failed_closed(store, clock, pub, relay, event("EV-H"))  # a platform Reboot
    report = run_watchdog(pipeline_for(store, clock, pub))
    assert report.redecided == ["EV-H"] and report.approvals == []
    assert pub.published[-1].decision.rule == "default-hold"
    assert relay.requests == []


def test_still_invalid_nothing_changes(store, clock, relay):
    pub = LocalPublisher()
    failed_closed(store, clock, pub, relay, event("EV-I", source="User"))
    report = run_watchdog(pipeline_for(store, clock, pub, INVALID))
    assert report.redecided == [] and relay.requests == []
    assert store.get_event("EV-I").decision.policy_error is not None


def test_dry_run_redecides_and_approves_nothing(store, clock, relay):
    pub = LocalPublisher()
    failed_closed(store, clock, pub, relay, event("EV-D", source="User"))
    report = run_watchdog(
        pipeline_for(store, clock, pub, Policy(rules=sample_rules(), dry_run=True))
    )
    assert report.redecided == ["EV-D"]
    assert pub.published[-1].decision.dry_run is True
    assert relay.requests == []
    # Both decisions were made in one instant (the clock stands still here): which of
    # their rows sorts last is not fixed, that the re-decision was audited is.
    outcomes = [r["outcome"] for r in store.audit_rows("EV-D")]
    assert outcomes.count("dry run: would approve") == 1, outcomes


def test_terminate_redecided_as_drain_goes_to_the_drain_workflow(store, clock, relay):
    pub = LocalPublisher()
    failed_closed(store, clock, pub, relay, event("EV-T", "Terminate", source="User"))
    run_watchdog(pipeline_for(store, clock, pub))
    note = pub.published[-1]
    assert note.transition is Transition.DECIDED and note.decision.action == "drain"
    from functions.terminate.workflow import wants

    assert wants(note)  # the terminate subscription drains, then approves
    assert relay.requests == []  # never approved before the drain


def test_window_closed_waits_for_the_window(store, clock, relay):
    pub = LocalPublisher()
    failed_closed(
        store, clock, pub, relay, event("EV-W", not_before=T0 + timedelta(hours=3), source="User")
    )
    policy = Policy(
        rules=(Rule(name="all", action="approve"),),
        windows=(Window(days=("Sat",), start="11:00", end="12:00"),),  # T0 is Sat 10:00
    )
    valid = pipeline_for(store, clock, pub, policy)
    assert run_watchdog(valid).redecided == ["EV-W"]
    record = store.get_event("EV-W")
    # Not yet tried: the decision's window says when (functions.pipeline.due.window_of).
    assert record.approval == "" and record.decision.approve_after == T0 + timedelta(hours=1)
    assert relay.requests == []
    clock.advance(3600)
    ingest_message(envelope("vm1", 2, None, kind="heartbeat", callback_url=relay.url), valid)
    assert [a.outcome for a in run_watchdog(valid).approvals] == ["approved"]
    assert relay.starts() == ["EV-W"]


def test_not_redecided_after_not_before_or_once_an_operator_approved(store, clock, relay):
    pub = LocalPublisher()
    late = event("EV-L", not_before=T0 + timedelta(minutes=2), source="User")
    failed_closed(store, clock, pub, relay, late)
    ingest_message(
        envelope("vm1", 2, [late, event("EV-M", source="User")], callback_url=relay.url),
        pipeline_for(store, clock, pub, INVALID),
    )
    manual = approve_event(
        "EV-M",
        Pipeline(
            store,
            make_settings(INVALID),
            pub,
            requests.Session(),
            clock,
            admission=identity_harness.admission(store, clock.now),
        ),
        announce=False,
        by="manual:alice",
    )
    assert manual.outcome == "approved"
    clock.advance(3 * 60)
    report = run_watchdog(pipeline_for(store, clock, pub))
    assert report.redecided == []
    assert report.overdue == ["EV-L"]
    assert relay.starts() == ["EV-M"]


def test_two_watchdogs_at_once_redecide_once(azurite, store, clock, new_relay):
    relay = new_relay()
    pub = LocalPublisher()
    ids = [f"EV-C{i}" for i in range(4)]
    # vm0..vm3 each report their own User event on the invalid host.
    invalid = pipeline_for(store, clock, pub, INVALID)
    for i, event_id in enumerate(ids):
        vm = f"vm{i}"
        ingest_message(
            envelope(
                vm, 5, [event(event_id, source="User", resources=(vm,))], callback_url=relay.url
            ),
            invalid,
        )
    settings = make_settings(Policy(rules=sample_rules(), max_concurrent_per_set=10))
    barrier = threading.Barrier(2)
    reports, errors = [], []

    def one() -> None:
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
            reports.append(run_watchdog(p))
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=one) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert sorted(e for r in reports for e in r.redecided) == ids
    assert sorted(relay.starts()) == ids
    for event_id in ids:
        assert pub.transitions(event_id).count("decided") == 1
        # Approved once. Which of the two racing watchdogs publishes first is not fixed:
        # one may publish `approved` while the other is still publishing the `decided` it
        # claimed (each announcement carries its transition; see the closing note).
        assert pub.transitions(event_id).count("approved") == 1
        outcomes = [r["outcome"] for r in store.audit_rows(event_id)]
        assert outcomes.count("approving") == 1
    assert pub.duplicates == []


def test_a_failed_publish_of_the_new_decision_is_announced_by_the_next_sweep(store, clock, relay):
    pub = LocalPublisher()
    failed_closed(store, clock, pub, relay, event("EV-F"))

    class Down:
        def publish(self, note):
            raise ConnectionError("topic unreachable")

    report = run_watchdog(pipeline_for(store, clock, Down()))  # logged, not raised
    assert report.redecided == ["EV-F"]  # decided again; its announcement is still due
    record = store.get_event("EV-F")
    assert record.decision.policy_error is None and "decided" not in record.announced
    report = run_watchdog(pipeline_for(store, clock, pub))
    assert report.republished == ["EV-F:decided"]
    assert pub.published[-1].message_id().startswith("event:EV-F:decided:redecided-")
    assert store.get_event("EV-F").announced["decided"] == "done"


def test_message_id_of_a_redecided_decision_differs_from_a_first_one(store, clock, relay):
    pub = LocalPublisher()
    record = failed_closed(store, clock, pub, relay, event("EV-X"))
    first = build(record, Transition.DECIDED, T0, None)
    record.redecided_at = T0
    again = build(record, Transition.DECIDED, T0, None)
    assert first.message_id() == "event:EV-X:decided"
    assert again.message_id() == "event:EV-X:decided:redecided-20261121T100000"
    assert build(record, Transition.APPROVED, T0, None).message_id() == "event:EV-X:approved"


def test_started_events_are_not_redecided(store, clock, relay):
    pub = LocalPublisher()
    failed_closed(store, clock, pub, relay, event("EV-S", source="User"))
    ingest_message(
        envelope(
            "vm1", 2, [event("EV-S", status="Started", source="User")], callback_url=relay.url
        ),
        pipeline_for(store, clock, pub),
    )
    assert run_watchdog(pipeline_for(store, clock, pub)).redecided == []
    assert relay.requests == []
    assert "decided" not in pub.transitions("EV-S")
