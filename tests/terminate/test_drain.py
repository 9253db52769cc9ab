"""The terminate workflow against a real drain hook receiver, real relays and Azurite."""

from __future__ import annotations

import base64
import threading
from datetime import UTC, datetime, timedelta

import pytest

from functions.model.event import Transition
from functions.store.drains import StepRecord
from functions.terminate.workflow import run_drain, wants
from tests.notify.receiver import Answer, running
from tests.notify.webhook_recipe import readme_verify
from tests.terminate.conftest import Harness, NoWaitClock, settings, terminate_note

pytestmark = pytest.mark.azurite


def test_drain_hook_succeeds_then_approved_before_the_deadline(harness: Harness) -> None:
    note = terminate_note(resources=("web_0", "web_1"))
    assert note.event is not None and note.event.not_before is not None
    with running(Answer(200, {"drained": True})) as hook:
        result = run_drain(note, settings(http_url=f"{hook.url}/drain"), harness.context())
        (request,) = hook.requests
    assert result.outcome == "approved" and result.drained
    body = request.json()
    assert request.path == "/drain"
    assert body["EventId"] == note.event.event_id
    assert body["EventType"] == "Terminate"
    assert [item["name"] for item in body["instances"]] == ["web_0", "web_1"]
    assert body["instances"][0]["scale_set"] == "web"
    deadline = note.event.not_before - timedelta(seconds=2)
    ((event_id, give_up_at, called_at),) = harness.approvals.calls
    assert event_id == note.event.event_id
    assert give_up_at == deadline
    assert called_at < deadline
    assert harness.transitions() == ["drain_started"]
    assert {name: step.status for name, step in result.steps.items()} == {
        "announce:drain_started": "succeeded",
        "http": "succeeded",
        "approve": "succeeded",
    }
    stored = harness.store.steps(note.event.event_id)
    assert set(stored) == set(result.steps) and all(
        s.status == "succeeded" for s in stored.values()
    )


def test_the_drain_request_is_signed_when_a_webhook_secret_is_set(harness: Harness) -> None:
    drained = terminate_note()
    with running(Answer(204)) as hook:
        run_drain(
            drained,
            settings(http_url=f"{hook.url}/drain"),
            harness.context(webhook_secret=b"webhook-secret-0123456789"),
        )
        (request,) = hook.requests
    # The same Standard Webhooks signature as the webhook channel (raw secret = its bytes).
    spec_secret = "whsec_" + base64.b64encode(b"webhook-secret-0123456789").decode()
    assert readme_verify(spec_secret, request.headers, request.body)
    assert request.headers["webhook-id"] == f"{drained.event.event_id}:drain"


@pytest.mark.parametrize("on_failure", ["hold", "approve"])
def test_a_hanging_hook_times_out_is_announced_and_the_policy_decides(
    harness: Harness, on_failure: str
) -> None:
    note = terminate_note()
    with running(Answer(200, delay=10)) as hook:
        result = run_drain(
            note,
            settings(http_url=f"{hook.url}/drain", step_timeout_seconds=0.5, on_failure=on_failure),
            harness.context(),
        )
        assert len(hook.requests) == 1
    assert not result.drained
    assert harness.transitions() == ["drain_started", "drain_failed"]
    failed = harness.published[1]
    assert "did not answer" in failed.detail and "DRAIN__ON_FAILURE" in failed.detail
    assert result.steps["http"].status == "failed"
    if on_failure == "hold":
        assert result.outcome == "held"
        assert harness.approvals.calls == []
        assert "holding until NotBefore" in failed.detail
    else:
        assert result.outcome == "approved"
        assert len(harness.approvals.calls) == 1
        assert "approving anyway" in failed.detail


def test_step_time_is_budgeted_against_the_deadline(harness: Harness) -> None:
    # 120 s step timeout, but only ~1.5 s between now and NotBefore - margin - reserve.
    note = terminate_note(notice=4.5)
    assert note.event is not None and note.event.not_before is not None
    with running(Answer(200, delay=10)) as hook:
        result = run_drain(
            note,
            settings(http_url=f"{hook.url}/drain", step_timeout_seconds=120, on_failure="approve"),
            harness.context(),
        )
    deadline = note.event.not_before - timedelta(seconds=2)
    step = result.steps["http"]
    # The step stops at its budget (the lease is a short one its runner renews).
    assert step.finished_at is not None and step.finished_at < deadline
    ((_, give_up_at, called_at),) = harness.approvals.calls
    assert give_up_at == deadline and called_at < deadline


def test_a_refusing_hook_fails_at_once(harness: Harness) -> None:
    with running(Answer(403, {"error": "not allowed"})) as hook:
        result = run_drain(terminate_note(), settings(http_url=hook.url), harness.context())
        assert len(hook.requests) == 1
    assert result.outcome == "held"
    assert "refused: HTTP 403" in result.steps["http"].detail


def test_a_flaky_hook_is_retried_within_its_time(harness: Harness) -> None:
    with running(Answer(200)) as hook:
        hook.script = [Answer(503), Answer(429)]
        result = run_drain(
            terminate_note(), settings(http_url=hook.url), harness.context(clock=NoWaitClock())
        )
        assert len(hook.requests) == 3
    assert result.outcome == "approved" and "attempt 3" in result.steps["http"].detail


def test_no_time_left_fails_the_steps_without_calling_anything(harness: Harness) -> None:
    note = terminate_note(notice=1)  # NotBefore inside the safety margin already
    with running() as hook:
        result = run_drain(note, settings(http_url=hook.url), harness.context())
        assert hook.requests == []
    assert result.outcome == "held"
    assert result.steps["http"].detail == "no time left before the deadline"
    assert harness.transitions() == ["drain_started", "drain_failed"]


def test_other_notifications_are_not_drained(harness: Harness) -> None:
    assert wants(terminate_note())
    assert not wants(terminate_note(action="approve"))
    assert not wants(terminate_note().model_copy(update={"transition": Transition.SCHEDULED}))
    held = terminate_note(event_type="Reboot", action="hold")
    assert run_drain(held, settings(), harness.context()).outcome == "skipped"
    dry = run_drain(
        terminate_note(dry_run=True), settings(http_url="http://127.0.0.1:9/"), harness.context()
    )
    assert dry.outcome == "skipped" and "dry run" in dry.detail
    assert harness.approvals.calls == [] and harness.published == []


def test_a_lost_runner_is_taken_over_and_the_hook_called_again_under_the_same_id(
    harness: Harness,
) -> None:
    """A host that died while its HTTP step ran (a lapsed lease) never makes the step
    "timed out" without running: the next invocation runs it again, with the same
    webhook-id, which a hook that saw the first call dedupes (issue 31)."""
    note = terminate_note()
    assert note.event is not None
    past = datetime.now(UTC) - timedelta(seconds=5)
    dead = StepRecord(
        step="http", status="running", owner="dead", started_at=past, lease_until=past
    )
    assert harness.store.claim(note.event.event_id, dead)
    with running() as hook:
        result = run_drain(note, settings(http_url=hook.url), harness.context())
        assert len(hook.requests) == 1
        assert hook.requests[0].headers["webhook-id"] == f"{note.event.event_id}:drain"
    assert result.steps["http"].status == "succeeded"
    assert result.outcome == "approved"


def test_an_interrupted_approval_is_taken_over(harness: Harness) -> None:
    note = terminate_note()
    assert note.event is not None
    past = datetime.now(UTC) - timedelta(seconds=5)
    dead = StepRecord(
        step="approve", status="running", owner="dead", started_at=past, lease_until=past
    )
    assert harness.store.claim(note.event.event_id, dead)
    with running(Answer(200)) as hook:
        result = run_drain(note, settings(http_url=hook.url), harness.context())
    assert result.outcome == "approved"
    assert len(harness.approvals.calls) == 1


@pytest.mark.parametrize(
    ("event_type", "then"),
    [("Terminate", "holding until NotBefore"), ("Preempt", "Azure evicts it at NotBefore")],
)
def test_a_drain_with_no_drain_step_configured_holds_and_says_so(
    harness: Harness, event_type: str, then: str
) -> None:
    """No DRAIN__HTTP_URL, no DRAIN__RELAY_HOOK and the readiness drain off: a `drain` for
    a scale-in must never become an immediate, undrained approval (issue 33)."""
    note = terminate_note(event_type=event_type)
    result = run_drain(note, settings(readiness=False), harness.context())
    assert result.outcome == "held" and not result.drained
    assert harness.approvals.calls == []
    assert "approve" not in result.steps
    assert harness.transitions() == ["drain_started"]
    detail = harness.published[0].detail
    assert "no drain step configured" in detail and "DRAIN__HTTP_URL" in detail, detail
    assert "DRAIN__RELAY_HOOK" in detail and then in detail, detail
    assert "no drain step configured" in result.detail
    assert "approval by" not in detail  # nothing will be approved early
    from functions.notify.describe import headline

    assert "not drained: no drain on this VM: held" in headline(harness.published[0])


def test_two_invocations_at_once_run_each_step_once(harness: Harness) -> None:
    note = terminate_note()
    results = []
    with running(Answer(200, delay=0.5)) as hook:

        def invoke() -> None:
            results.append(run_drain(note, settings(http_url=hook.url), harness.context()))

        threads = [threading.Thread(target=invoke) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(20)
        assert len(hook.requests) == 1
    assert [r.outcome for r in results] == ["approved", "approved"]
    assert len(harness.approvals.calls) == 1
    assert harness.transitions() == ["drain_started"]
    # Both saw the same stored outcome of every step.
    assert {k: v.status for k, v in results[0].steps.items()} == {
        k: v.status for k, v in results[1].steps.items()
    }


def test_announcements_carry_the_policys_paging_verdict(harness: Harness) -> None:
    with running(Answer(403)) as hook:  # refused: the drain fails at once
        run_drain(
            terminate_note(),
            settings(http_url=hook.url, step_timeout_seconds=0.3),
            harness.context(pages=lambda t: t is Transition.DRAIN_FAILED),
        )
    pages = [(n.transition.value, n.page) for n in harness.published]  # type: ignore[attr-defined]
    assert pages == [("drain_started", False), ("drain_failed", True)]
