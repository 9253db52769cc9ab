"""Fail-closed recovery: events held on an invalid policy are re-decided, once, as soon as
the host's policy is valid (watchdog or the event's next document), then announced,
audited and approved through the ordinary paths."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
import requests

from functions.model.event import Transition
from functions.model.policy import Policy, PolicyLoad, Rule, Window, sample_rules
from functions.pipeline import reconcile
from functions.pipeline.announce import build
from functions.pipeline.approve import approve_event
from functions.pipeline.context import Pipeline
from functions.pipeline.due import due, unannounced_before
from functions.pipeline.ingest import ingest_message
from functions.pipeline.lifecycle import ANNOUNCE_LEASE
from functions.pipeline.publish import LocalPublisher
from functions.pipeline.reconcile import reconcile_key
from functions.pipeline.redecide import redecide
from functions.pipeline.watchdog import run_watchdog
from functions.store import claims
from functions.store.state import Store
from functions.web.approval import approve_by_hand
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
        # Approved once, and announced after its `decided` whichever watchdog re-decided
        # it: the approval waits for the `decided` the other claimed (issue 46; forced
        # deterministically in test_the_approval_waits_for_the_decided_another_publishes).
        assert pub.transitions(event_id).count("approved") == 1
        assert pub.transitions(event_id)[-1] == "approved"
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


class HostDied(BaseException):
    """The host dies here: no `except Exception` of the app's runs (as tests/crash)."""


def racing_reconcile(monkeypatch, event_id: str, other, then=None) -> dict:
    """Reconcile A of `event_id`, once it re-decided the event (its `decided` claimed in
    that write) and before it claims the approval or publishes anything, lets reconcile B
    (`other`, its own Store) run to its end (then `then`): the interleaving two watchdogs
    can meet (test_two_watchdogs_at_once_redecide_once), forced."""
    original = reconcile.claiming
    seen: dict = {}

    def claiming(transitions, now, me, **options):
        change = original(transitions, now, me, **options)

        def racing(rec):
            if me == "A" and "B" not in seen:
                assert claims.holder(rec.announced["decided"]) == "A"
                seen["B"] = reconcile_key(other, event_id, "B")
                if then is not None:
                    then()
            return change(rec)

        return racing

    monkeypatch.setattr(reconcile, "claiming", claiming)
    return seen


def test_the_approval_waits_for_the_decided_another_publishes(
    azurite, store, clock, relay, monkeypatch
):
    pub = LocalPublisher()
    failed_closed(store, clock, pub, relay, event("EV-O", source="User"))
    clock.advance(60)
    valid = pipeline_for(store, clock, pub)
    other = pipeline_for(Store.from_connection_string(azurite, store.prefix), clock, pub)
    seen = racing_reconcile(monkeypatch, "EV-O", other)
    done = reconcile_key(valid, "EV-O", "A")
    assert pub.transitions("EV-O") == ["scheduled", "policy_invalid", "decided", "approved"]
    # B found A's `decided` claimed and not done: it neither approved nor announced.
    waited = seen["B"]
    assert waited.approval is None and waited.published == []
    assert done.redecided and done.approval is not None
    assert done.approval.outcome == "approved"
    assert relay.starts() == ["EV-O"]
    assert store.get_event("EV-O").announced == {
        "scheduled": "done",
        "policy_invalid": "done",
        "decided": "done",
        "approved": "done",
    }


def test_a_waiting_approval_is_not_lost_when_the_decided_s_publisher_dies(
    azurite, store, clock, relay, monkeypatch
):
    pub = LocalPublisher()
    failed_closed(store, clock, pub, relay, event("EV-Q", source="User"))
    clock.advance(60)
    own = Store.from_connection_string(azurite, store.prefix)
    other = pipeline_for(own, clock, pub)

    def die() -> None:
        raise HostDied()

    seen = racing_reconcile(monkeypatch, "EV-Q", other, then=die)
    with pytest.raises(HostDied):
        reconcile_key(pipeline_for(store, clock, pub), "EV-Q", "A")
    monkeypatch.undo()
    # A died holding `decided`, before announcing or approving anything; B waited for it
    # and put the key back in the open index for when A's claim lapses.
    assert pub.transitions("EV-Q") == ["scheduled", "policy_invalid"]
    assert relay.requests == []
    lapses = clock.now() + ANNOUNCE_LEASE
    assert seen["B"].approval is None and seen["B"].next_at == lapses
    assert [key for key, _ in own.due_events(lapses - timedelta(microseconds=1), 10)] == []
    assert [key for key, _ in own.due_events(lapses, 10)] == ["EV-Q"]
    clock.advance(ANNOUNCE_LEASE.total_seconds())
    report = run_watchdog(other)  # the sweep finds it then: announced, then approved
    assert [a.outcome for a in report.approvals] == ["approved"]
    assert pub.transitions("EV-Q") == ["scheduled", "policy_invalid", "decided", "approved"]
    assert relay.starts() == ["EV-Q"]


class PublishHook:
    """The topic, with `hook` run once just before the first note `when` picks is sent."""

    def __init__(self, inner: LocalPublisher, when, hook) -> None:
        self.inner, self.when, self.hook = inner, when, hook

    def publish(self, note) -> None:
        hook, self.hook = (self.hook, None) if self.when(note) else (None, self.hook)
        if hook is not None:
            hook()
        self.inner.publish(note)


def test_an_approval_asked_while_the_decided_is_published_follows_it_at_once(
    azurite, store, clock, relay
):
    pub = LocalPublisher()
    failed_closed(store, clock, pub, relay, event("EV-P"))  # a Platform Reboot: held
    clock.advance(60)
    by_hand = pipeline_for(Store.from_connection_string(azurite, store.prefix), clock, pub)
    asked = []

    def ask() -> None:  # a person approves while the sweep is publishing the new decision
        asked.append(approve_by_hand(by_hand, "EV-P", "alice"))

    hooked = PublishHook(pub, lambda note: note.transition is Transition.DECIDED, ask)
    report = run_watchdog(pipeline_for(store, clock, hooked))
    assert report.redecided == ["EV-P"]
    # The person's reconcile found the `decided` claimed, not done: it left the approval
    # for later; the sweep, marking its `decided` done, found it due and woke the event
    # (the work queue: here, at once), which approved it.
    assert pub.transitions("EV-P") == ["scheduled", "policy_invalid", "decided", "approved"]
    assert [(a.outcome, a.detail) for a in asked] == [
        ("skipped", "its decision is being announced: approved for you once that is out")
    ]
    assert pub.published[-1].detail.startswith("approved by alice (by hand)")
    assert relay.starts() == ["EV-P"]
    assert store.get_event("EV-P").approval == "approved"


def test_the_decider_leaves_the_approval_to_whoever_publishes_the_decided(store, clock, relay):
    record = failed_closed(store, clock, LocalPublisher(), relay, event("EV-U", source="User"))
    valid = make_settings().policy
    now = T0 + timedelta(seconds=60)
    redecide(record, valid, now)
    assert "decided" not in record.announced
    # Unclaimed: the approving reconcile claims it in the write that claims the approval
    # and publishes it first; in that write, one left unclaimed would wait.
    assert due(record, valid, now, me="B").approve
    assert unannounced_before(record, now, "B") == ()
    assert unannounced_before(record, now, "B", claimed=True) == (Transition.DECIDED,)
    claims.take(record.announced, "decided", now, ANNOUNCE_LEASE, "A")
    assert due(record, valid, now, me="A").approve  # A's own: A publishes it, then approves
    waiting = due(record, valid, now, me="B")  # another's, live: B leaves the approval
    assert not waiting.approve and not waiting.capacity
    assert waiting.next_at == now + ANNOUNCE_LEASE  # when A's claim lapses
    assert due(record, valid, now + ANNOUNCE_LEASE, me="B").approve  # A died: B takes over
    claims.finish(record.announced, ["decided"])
    assert due(record, valid, now, me="B").approve  # done: anyone approves
