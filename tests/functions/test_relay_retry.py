"""A relay's 4xx: asked again when the cause may pass (a key mid-rotation, 409, 429, an
event not in its document yet), within the approval budget; never again when it is final
(400, an event that left the VM's document). A relay's previous key bridges a rotation."""

from __future__ import annotations

import pytest
import requests

from functions.approvers.relay import post_start, start_attempt_id
from functions.identity.keys import CallbackKey, key_id_of
from functions.pipeline.approve import approve_event
from functions.pipeline.ingest import ingest_message
from functions.pipeline.watchdog import run_watchdog
from tests.functions.conftest import envelope, event, make_pipeline, vm_id_of

OLD_KEY = CallbackKey(key_id=key_id_of(b"o" * 32), secret=b"o" * 32)
NEW_KEY = CallbackKey(key_id=key_id_of(b"n" * 32), secret=b"n" * 32)
SIGNATURE_ERROR = {"error": "signature does not match"}


@pytest.mark.parametrize(
    "answer",
    [
        (401, SIGNATURE_ERROR),
        (403, {"error": "forbidden"}),
        (409, {"error": "replayed request"}),
        (429, {"error": "too many concurrent requests; try again shortly"}),
    ],
)
def test_a_4xx_that_may_pass_is_asked_again_and_approves(store, clock, relay, answer):
    relay.script = [answer, answer]
    pipeline, pub = make_pipeline(store, clock)
    body = envelope("vm1", 1, [event("EV-1", source="User")], callback_url=relay.url)
    result = ingest_message(body, pipeline)
    assert [a.outcome for a in result.approvals] == ["approved"]
    assert relay.starts() == ["EV-1"] * 3
    assert pub.transitions("EV-1") == ["scheduled", "decided", "approved"]
    outcomes = [a.outcome for a in store.get_event("EV-1").approval_attempts]
    assert (
        outcomes[:2] == [f"answered {answer[0]} (may pass; asking again): {answer[1]['error']}"] * 2
    )
    assert outcomes[2] == "approved"
    assert clock.slept == [1.0, 2.0]  # the approval backoff, inside the budget


def test_a_401_that_outlasts_the_budget_is_left_to_the_watchdog_which_approves(store, clock, relay):
    relay.default = (401, SIGNATURE_ERROR)
    pipeline, pub = make_pipeline(store, clock, approval_budget_seconds=10)
    body = envelope("vm1", 1, [event("EV-2", source="User")], callback_url=relay.url)
    result = ingest_message(body, pipeline)
    assert [a.outcome for a in result.approvals] == ["retry_later"]
    assert store.get_event("EV-2").approval == "pending"
    asked = len(relay.requests)
    # The relay is rotated (it now verifies our key): the watchdog asks the same relay again.
    relay.default = (200, {"imds_status": 200})
    clock.advance(60)
    ingest_message(
        envelope("vm1", 2, [event("EV-2", source="User")], callback_url=relay.url), pipeline
    )
    report = run_watchdog(pipeline)
    assert [a.outcome for a in report.approvals] == ["approved"]
    assert len(relay.requests) == asked + 1
    assert pub.transitions("EV-2") == ["scheduled", "decided", "approved"]


def test_a_final_4xx_is_never_asked_again(store, clock, relay):
    relay.default = (400, {"error": "body must be a JSON object"})
    pipeline, pub = make_pipeline(store, clock)
    body = envelope("vm1", 1, [event("EV-3", source="User")], callback_url=relay.url)
    result = ingest_message(body, pipeline)
    assert [a.outcome for a in result.approvals] == ["failed"]
    assert len(relay.requests) == 1
    relay.default = (200, {"imds_status": 200})
    again = approve_event("EV-3", pipeline)  # e.g. the operator's manual approval
    assert again.outcome == "failed" and "refused before: vm1" in again.detail
    assert len(relay.requests) == 1
    assert pub.transitions("EV-3") == ["scheduled", "decided", "approval_failed"]
    assert store.get_event("EV-3").approval_attempts[0].outcome.startswith("refused 400")


def test_a_404_means_not_yet_before_the_vm_reports_and_gone_after(store, clock, new_relay):
    """vm2's relay is asked (vm1's document named it) before vm2 reported the event: its
    404 "unknown EventId" may pass. Once vm2 has reported it, a 404 means it left vm2's
    document: final for that relay."""
    r1, r2 = new_relay(), new_relay()
    r1.default = (503, {"error": "IMDS down"})
    r2.script = [(404, {"error": "unknown EventId"})]
    pipeline, _ = make_pipeline(store, clock, approval_budget_seconds=5)
    ingest_message(envelope("vm2", 1, [], callback_url=r2.url), pipeline)  # relay known
    ev = event("EV-4", source="User", resources=("vm1", "vm2"))
    result = ingest_message(envelope("vm1", 1, [ev], callback_url=r1.url), pipeline)
    # Asked again after its 404 (vm2 had not reported EV-4), and it approved.
    assert [(a.outcome, a.vm) for a in result.approvals] == [("approved", "vm2")]
    attempts = [(a.vm, a.outcome) for a in store.get_event("EV-4").approval_attempts]
    assert attempts == [
        ("vm1", "503 IMDS down"),
        ("vm2", "answered 404 (may pass; asking again): unknown EventId"),
        ("vm1", "503 IMDS down"),
        ("vm2", "approved"),
    ]


def test_a_404_from_a_relay_whose_vm_reported_it_is_final(store, clock, relay):
    relay.default = (404, {"error": "unknown EventId"})
    pipeline, _ = make_pipeline(store, clock)
    body = envelope("vm1", 1, [event("EV-5", source="User")], callback_url=relay.url)
    result = ingest_message(body, pipeline)
    assert [a.outcome for a in result.approvals] == ["failed"]
    assert len(relay.requests) == 1
    assert store.get_event("EV-5").approval_attempts[0].outcome.startswith("refused 404")


def test_a_relay_that_has_not_rotated_yet_approves_with_its_previous_key(store, clock, relay):
    """The app knows the relay's new key (its last message carried it) and the one before;
    this relay answers only to the old one (say its state was restored): asked once more at
    once with the previous key, which approves."""
    pipeline, pub = make_pipeline(store, clock)
    ingest_message(envelope("vm1", 1, [], callback_url=relay.url, key=OLD_KEY), pipeline)
    relay.own, relay.keys = False, [OLD_KEY]
    body = envelope("vm1", 2, [event("EV-6", source="User")], callback_url=relay.url, key=NEW_KEY)
    result = ingest_message(body, pipeline)
    assert [a.outcome for a in result.approvals] == ["approved"]
    assert relay.bad_signatures == 1 and relay.starts() == ["EV-6"]
    assert clock.slept == []  # at once, no backoff
    (attempt,) = store.get_event("EV-6").approval_attempts
    assert (
        attempt.outcome == "approved (signed with the relay's previous key: it has not rotated yet)"
    )
    assert pub.transitions("EV-6")[-1] == "approved"
    # The relay catches up: asked once with the new key, no fallback.
    relay.keys = [NEW_KEY, OLD_KEY]
    ingest_message(
        envelope("vm1", 3, [event("EV-7", source="User")], callback_url=relay.url, key=NEW_KEY),
        pipeline,
    )
    assert relay.bad_signatures == 1 and relay.starts() == ["EV-6", "EV-7"]


def test_a_key_the_relay_does_not_hold_is_retried_not_final(store, clock, relay):
    """Only the new key is known to the app; the relay still answers to another: 401 is
    retried, never final, and the watchdog approves once the relay has the key."""
    relay.own, relay.keys = False, [OLD_KEY]
    pipeline, _ = make_pipeline(store, clock, approval_budget_seconds=3)
    body = envelope("vm1", 1, [event("EV-8", source="User")], callback_url=relay.url, key=NEW_KEY)
    result = ingest_message(body, pipeline)
    assert [a.outcome for a in result.approvals] == ["retry_later"]
    assert relay.bad_signatures == 2
    relay.keys = [NEW_KEY, OLD_KEY]  # the relay has the key now
    clock.advance(60)
    assert [a.outcome for a in run_watchdog(pipeline).approvals] == ["approved"]


def test_every_try_for_one_vm_and_event_carries_the_same_attempt_id(store, clock, relay):
    """Issue 31: the relay dedupes StartRequests by AttemptId, so the id must be the same
    on a retry, and again after the app crashed and the message was redelivered (a new
    pipeline, a new claim), but differ between events and between VMs."""
    relay.script = [(503, {"error": "IMDS unreadable"})]
    pipeline, _ = make_pipeline(store, clock)
    body = envelope("vm1", 1, [event("EV-9", source="User")], callback_url=relay.url)
    assert [a.outcome for a in ingest_message(body, pipeline).approvals] == ["approved"]
    first, second = relay.attempt_ids()
    assert first == second == start_attempt_id(vm_id_of("vm1"), "EV-9")
    assert first is not None and first.startswith("sa1-") and len(first) == 36
    # After a crash (the relay's 200 lost with the app): a fresh process asks again.
    again, _ = make_pipeline(store, clock)
    target = again.relay_target(store.get_vm("vm1"))
    assert target is not None
    with requests.Session() as session:
        assert post_start(target, "EV-9", session, 10.0)[0] == "approved"
    assert relay.attempt_ids()[-1] == first
    assert start_attempt_id(vm_id_of("vm1"), "ev-9") == first  # EventIds are case-blind
    assert start_attempt_id(vm_id_of("vm1"), "EV-10") != first
    assert start_attempt_id(vm_id_of("vm2"), "EV-9") != first
