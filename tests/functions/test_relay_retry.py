"""A relay's 4xx: asked again when the cause may pass (a key mid-rotation, 409, 429, an
event not in its document yet), within the approval budget; never again when it is final
(400, an event that left the VM's document). RELAY_KEY_PREVIOUS bridges a rotation."""

from __future__ import annotations

import pytest

from functions.pipeline.approve import approve_event
from functions.pipeline.ingest import ingest_message
from functions.pipeline.watchdog import run_watchdog
from tests.functions.conftest import KEY, envelope, event, make_pipeline

OLD_KEY = "old-relay-key-0123456789abcdef"
NEW_KEY = "new-relay-key-0123456789abcdef"
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


def test_mid_rotation_the_previous_key_approves_at_once(store, clock, relay):
    """Rotation step 2: the app signs with the new key, this relay still has only the old."""
    relay.keys = [OLD_KEY]
    pipeline, pub = make_pipeline(store, clock, relay_key=NEW_KEY, relay_key_previous=OLD_KEY)
    body = envelope("vm1", 1, [event("EV-6", source="User")], callback_url=relay.url)
    result = ingest_message(body, pipeline)
    assert [a.outcome for a in result.approvals] == ["approved"]
    assert relay.bad_signatures == 1 and relay.starts() == ["EV-6"]
    assert clock.slept == []  # at once, no backoff
    (attempt,) = store.get_event("EV-6").approval_attempts
    assert (
        attempt.outcome
        == "approved (signed with RELAY_KEY_PREVIOUS: this relay still has the old key)"
    )
    assert pub.transitions("EV-6")[-1] == "approved"
    # A rotated relay verifies the new key: asked once, no fallback.
    relay.keys = [NEW_KEY, OLD_KEY]
    ingest_message(
        envelope("vm1", 2, [event("EV-7", source="User")], callback_url=relay.url), pipeline
    )
    assert relay.bad_signatures == 1 and relay.starts() == ["EV-6", "EV-7"]


def test_without_the_previous_key_a_mid_rotation_401_is_retried_not_final(store, clock, relay):
    relay.keys = [OLD_KEY]
    pipeline, _ = make_pipeline(store, clock, relay_key=NEW_KEY, approval_budget_seconds=3)
    body = envelope("vm1", 1, [event("EV-8", source="User")], callback_url=relay.url)
    result = ingest_message(body, pipeline)
    assert [a.outcome for a in result.approvals] == ["retry_later"]
    assert relay.bad_signatures == 2
    relay.keys = [NEW_KEY, OLD_KEY]  # the relay is rotated
    clock.advance(60)
    assert [a.outcome for a in run_watchdog(pipeline).approvals] == ["approved"]
    assert KEY not in (NEW_KEY, OLD_KEY)


def test_an_unresolved_key_vault_reference_never_signs(store, clock, relay):
    reference = (
        "@Microsoft.KeyVault(SecretUri=https://kv.vault.azure.net/secrets/relay-key-previous)"
    )
    pipeline, _ = make_pipeline(store, clock, relay_key_previous=reference)
    assert pipeline.settings.relay_key_previous_bytes is None
    relay.script = [(401, SIGNATURE_ERROR)]
    body = envelope("vm1", 1, [event("EV-9", source="User")], callback_url=relay.url)
    assert [a.outcome for a in ingest_message(body, pipeline).approvals] == ["approved"]
    assert clock.slept == [1.0]  # retried after backoff with RELAY_KEY, not the reference
