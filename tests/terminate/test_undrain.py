"""A Terminate cancelled after its drain: the instance is put back (HTTP undrain hook and
the relays' undrain hook), once, audited and announced. Real receivers, real relays over
the IMDS simulator, the drains table in Azurite."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from functions.model.event import Notification, Transition
from functions.terminate.workflow import UndrainSettings, run_drain, run_undrain, wants_undrain
from tests.notify.receiver import Answer, running
from tests.terminate.conftest import Harness, Relays, settings, terminate_note

pytestmark = pytest.mark.azurite


def cancelled(note: Notification) -> Notification:
    return note.model_copy(update={"transition": Transition.CANCELLED})


def undrain_settings(**fields: object) -> UndrainSettings:
    return UndrainSettings(**{"step_timeout_seconds": 5, "poll_seconds": 0.2, **fields})


def test_a_cancelled_drain_is_undrained_through_http_and_relay_hooks(
    harness: Harness, relays: Callable[..., Relays]
) -> None:
    fleet = relays(count=2)
    harness.callbacks.update(fleet.targets)
    event_id = fleet.sim.add_event("Terminate", resources=["web_0", "web_1"], notice=300)
    note = terminate_note(event_id, resources=("web_0", "web_1"))
    audits: list[tuple[str, str, str]] = []
    harness.approvals.answer = "failed"  # say the approval did not go through in time
    with running(Answer(200)) as drain_hook, running(Answer(204)) as undrain_hook:
        run_drain(
            note,
            settings(http_url=f"{drain_hook.url}/drain", relay_hook="drain"),
            harness.context(),
        )
        assert sorted(fleet.runs()) == [f"web_0 {event_id}", f"web_1 {event_id}"]
        fleet.sim.cancel_event(event_id)  # the scale-in is called off; IMDS drops it
        gone = cancelled(note)
        assert wants_undrain(gone)
        options = undrain_settings(http_url=f"{undrain_hook.url}/undrain", relay_hook="undrain")
        ctx = harness.context(audit=lambda *row: audits.append(row))
        result = run_undrain(gone, options, ctx, drain_hook="drain")
        again = run_undrain(gone, options, harness.context(), drain_hook="drain")  # redelivery
        (request,) = undrain_hook.requests
    assert result.outcome == again.outcome == "undrained"
    body = request.json()
    assert body["action"] == "undrain" and body["EventId"] == event_id
    assert sorted(fleet.undrains()) == [
        f"web_0 {event_id} Cancelled",
        f"web_1 {event_id} Cancelled",
    ]
    assert harness.transitions() == ["drain_started", "undrained"]
    undrained = harness.published[-1]
    assert "undrain hook answered 204" in undrained.detail
    assert [(e, outcome) for e, outcome, _ in audits] == [(event_id, "undrained")]
    stored = harness.store.steps(event_id)
    assert {k: v.status for k, v in stored.items() if "undrain" in k} == {
        "undrain:http": "succeeded",
        "undrain:hook:web_0": "succeeded",
        "undrain:hook:web_1": "succeeded",
        "announce:undrained": "succeeded",
        "audit:undrain": "succeeded",
    }


def test_a_relay_runs_no_undrain_for_an_event_it_never_drained(
    harness: Harness, relays: Callable[..., Relays]
) -> None:
    """`Undoes` is honoured only where that drain hook ran for that EventId; the relay's
    "unknown EventId" then means nothing to undo (issue 40), not `undrain_failed` (on
    2cd3d60 it paged "put the VM back in service by hand" for a VM never taken out)."""
    fleet = relays(count=1)
    harness.callbacks.update(fleet.targets)
    event_id = fleet.sim.add_event("Terminate", resources=["web_0"], notice=300)
    note = terminate_note(event_id)
    # As if the drain had reached the relay (a step row), though its hook never ran there.
    from datetime import UTC, datetime

    from functions.store.drains import StepRecord

    now = datetime.now(UTC)
    harness.store.claim(
        event_id,
        StepRecord(
            step="hook:web_0",
            status="failed",
            owner="x",
            started_at=now,
            lease_until=now,
            finished_at=now,
            detail="hook drain failed (exit 1)",
        ),
    )
    fleet.sim.cancel_event(event_id)
    result = run_undrain(
        cancelled(note),
        undrain_settings(relay_hook="undrain"),
        harness.context(),
        drain_hook="drain",
    )
    assert result.outcome == "skipped", result.detail
    assert "nothing to undo: drain never ran" in result.detail
    assert fleet.undrains() == []
    assert harness.published == []  # nothing to say: the VM was never out of service
    step = harness.store.get(event_id, "undrain:hook:web_0")
    assert step is not None and step.status == "succeeded" and step.reached is False


def test_undrain_not_configured_is_announced_as_failed(harness: Harness) -> None:
    note = terminate_note()
    with running(Answer(200)) as drain_hook:
        run_drain(note, settings(http_url=f"{drain_hook.url}/drain"), harness.context())
    result = run_undrain(cancelled(note), undrain_settings(), harness.context(pages=lambda t: True))
    assert result.outcome == "undrain_failed"
    assert "UNDRAIN__HTTP_URL is not set" in result.detail
    failed = harness.published[-1]
    assert failed.transition is Transition.UNDRAIN_FAILED and failed.page is True


def test_an_undrain_hook_that_refuses_is_reported(harness: Harness) -> None:
    note = terminate_note()
    with running(Answer(200)) as drain_hook, running(Answer(400, {"error": "no"})) as undo:
        run_drain(note, settings(http_url=f"{drain_hook.url}/drain"), harness.context())
        result = run_undrain(
            cancelled(note), undrain_settings(http_url=f"{undo.url}/u"), harness.context()
        )
    assert result.outcome == "undrain_failed"
    assert "undrain hook refused: HTTP 400" in result.detail


def test_nothing_drained_means_nothing_to_undo(harness: Harness) -> None:
    note = terminate_note()
    result = run_undrain(
        cancelled(note), undrain_settings(http_url="http://127.0.0.1:9/u"), harness.context()
    )
    assert result.outcome == "skipped" and result.detail == "nothing was drained"
    assert harness.published == []
    # Only a cancelled drain decision qualifies.
    assert not wants_undrain(note)
    assert not wants_undrain(cancelled(terminate_note(action="approve")))
    assert not wants_undrain(cancelled(terminate_note(dry_run=True)))


def test_undrain_waits_for_a_drain_step_still_running(harness: Harness) -> None:
    """Cancelled while the HTTP drain hook still runs: undone after it, not before."""
    from datetime import timedelta

    from functions.store.drains import StepRecord
    from tests.functions.conftest import FakeClock

    clock = FakeClock()
    note = terminate_note()
    assert note.event is not None
    start = clock.now()
    harness.store.claim(
        note.event.event_id,
        StepRecord(
            step="http",
            status="running",
            owner="other",
            started_at=start,
            lease_until=start + timedelta(seconds=30),
        ),
    )
    with running(Answer(204)) as undo:
        result = run_undrain(
            cancelled(note),
            undrain_settings(http_url=f"{undo.url}/u"),
            harness.context(clock=clock),
        )
        assert len(undo.requests) == 1
    assert clock.now() >= start + timedelta(seconds=30)  # waited out the running step
    assert result.outcome == "undrained"
