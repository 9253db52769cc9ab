"""A drain before every disruptive event: Freeze, Reboot, Redeploy, Preempt and Terminate
each drain through the same HTTP hook and relay hook, then approve; a Preempt's 30 s
notice has margins of its own, so its drain is cut in time; a drained event that ends with
its VM still there is undrained. Real relays over the IMDS simulator, real hook receivers,
the drains table in Azurite."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import timedelta

import pytest

from functions.model.event import Transition
from functions.terminate.workflow import (
    DrainSettings,
    UndrainSettings,
    run_drain,
    run_undrain,
    wants,
    wants_undrain,
)
from tests.notify.receiver import Answer, running
from tests.terminate.conftest import Harness, NoWaitClock, Relays, settings, terminate_note

pytestmark = pytest.mark.azurite

TYPES = ("Freeze", "Reboot", "Redeploy", "Preempt", "Terminate")


@pytest.mark.parametrize("event_type", TYPES)
def test_each_disruptive_type_is_drained_then_approved(
    harness: Harness, relays: Callable[..., Relays], event_type: str
) -> None:
    fleet = relays(count=1)
    harness.callbacks.update(fleet.targets)
    notice = 30 if event_type == "Preempt" else 300  # Azure's notice for a Spot eviction
    event_id = fleet.sim.add_event(event_type, resources=["web_0"], notice=notice)
    note = terminate_note(event_id, notice=notice, event_type=event_type)
    assert wants(note) and note.event is not None and note.event.not_before is not None
    with running(Answer(200)) as hook:
        result = run_drain(
            note, settings(http_url=f"{hook.url}/drain", relay_hook="drain"), harness.context()
        )
        (request,) = hook.requests
    assert result.outcome == "approved" and result.drained, result.detail
    assert request.json()["EventType"] == event_type
    assert fleet.runs() == [f"web_0 {event_id}"]  # the relay's hook script, on its VM
    margin = 5 if event_type == "Preempt" else 2  # DRAIN__PREEMPT_* default, or the test's
    ((_, give_up_at, called_at),) = harness.approvals.calls
    assert give_up_at == note.event.not_before - timedelta(seconds=margin)
    assert called_at < give_up_at
    assert harness.transitions() == ["drain_started"]
    assert {name: step.status for name, step in result.steps.items()} == {
        "announce:drain_started": "succeeded",
        "http": "succeeded",
        "hook:web_0": "succeeded",
        "approve": "succeeded",
    }


def test_a_preempt_has_margins_of_its_own() -> None:
    """The 30 s safety margin meant for a scale-in would leave a Spot eviction no time."""
    defaults = DrainSettings()
    assert defaults.margins("Terminate") == defaults.margins("Reboot") == (30, 10)
    assert defaults.margins("Preempt") == (5, 2)


def test_drain_preempt_settings_are_read_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("DRAIN__PREEMPT_SAFETY_MARGIN_SECONDS", "3")
    monkeypatch.setenv("DRAIN__PREEMPT_APPROVE_RESERVE_SECONDS", "1.5")
    assert DrainSettings().margins("Preempt") == (3, 1.5)
    monkeypatch.setenv("DRAIN__PREEMPT_SAFETY_MARGIN_SECONDS", "-1")
    with pytest.raises(ValueError, match="preempt_safety_margin_seconds"):
        DrainSettings()


@pytest.mark.parametrize("on_failure", ["hold", "approve"])
def test_a_preempt_drain_is_cut_in_time_and_the_eviction_approved_or_let_go(
    harness: Harness, on_failure: str
) -> None:
    """A hook that would take longer than the notice is cut at NotBefore - 7 s (5 s margin,
    2 s for the approval), whatever the general margins say; then the policy decides."""
    note = terminate_note(notice=10, event_type="Preempt")
    assert note.event is not None and note.event.not_before is not None
    not_before = note.event.not_before
    began = time.monotonic()
    with running(Answer(200, delay=30)) as hook:
        result = run_drain(
            note,
            settings(
                http_url=hook.url,
                step_timeout_seconds=120,
                safety_margin_seconds=30,  # a scale-in's margins: not used for a Preempt
                approve_reserve_seconds=10,
                on_failure=on_failure,
            ),
            harness.context(),
        )
    took = time.monotonic() - began
    assert took < 10 - 5, f"the drain ran {took:.1f} s, past the approval deadline"
    step = result.steps["http"]
    assert step.status == "failed" and "did not answer" in step.detail
    # Cut at its budget (NotBefore - 7 s), recorded within the second after.
    assert step.finished_at is not None and step.finished_at < not_before - timedelta(seconds=6)
    assert harness.transitions() == ["drain_started", "drain_failed"]
    failed = harness.published[1].detail
    if on_failure == "hold":
        assert result.outcome == "held" and harness.approvals.calls == []
        assert "not approving: Azure evicts it at NotBefore" in failed
    else:
        assert result.outcome == "approved" and "approving anyway" in failed
        ((_, give_up_at, called_at),) = harness.approvals.calls
        assert give_up_at == not_before - timedelta(seconds=5) and called_at < give_up_at


def test_a_preempt_seen_too_late_calls_nothing(harness: Harness) -> None:
    """NotBefore already inside the Preempt's margin: no hook is called, it is let go."""
    note = terminate_note(notice=4, event_type="Preempt")
    with running() as hook:
        result = run_drain(note, settings(http_url=hook.url), harness.context())
        assert hook.requests == []
    assert result.outcome == "held"
    assert result.steps["http"].detail == "no time left before the deadline"
    assert "Azure evicts it at NotBefore" in harness.published[-1].detail


def test_a_failed_reboot_drain_is_announced_and_held(
    harness: Harness, relays: Callable[..., Relays]
) -> None:
    fleet = relays(count=1)
    harness.callbacks.update(fleet.targets)
    event_id = fleet.sim.add_event("Reboot", resources=["web_0"], notice=300)
    note = terminate_note(event_id, notice=300, event_type="Reboot")
    with running(Answer(409, {"error": "node still has pods"})) as hook:
        result = run_drain(note, settings(http_url=hook.url, relay_hook="drain"), harness.context())
    assert result.outcome == "held" and not result.drained
    assert harness.approvals.calls == []
    assert harness.transitions() == ["drain_started", "drain_failed"]
    failed = harness.published[1]
    assert failed.event is not None and failed.event.event_type == "Reboot"
    assert "refused: HTTP 409" in failed.detail and "holding until NotBefore" in failed.detail
    assert fleet.runs() == [f"web_0 {event_id}"]  # the relay hook still ran: undone later


@pytest.mark.parametrize(
    ("event_type", "ended", "undrain"),
    [
        ("Freeze", Transition.COMPLETED, True),
        ("Reboot", Transition.COMPLETED, True),
        ("Redeploy", Transition.COMPLETED, True),
        ("Preempt", Transition.COMPLETED, False),  # evicted: nothing to put back
        ("Terminate", Transition.COMPLETED, False),  # deleted
        ("Preempt", Transition.CANCELLED, True),
        ("Terminate", Transition.CANCELLED, True),
        ("Reboot", Transition.CANCELLED, True),
        ("Reboot", Transition.STARTED, False),
    ],
)
def test_undrain_follows_whether_the_vm_is_still_there(
    event_type: str, ended: Transition, undrain: bool
) -> None:
    note = terminate_note(event_type=event_type).model_copy(update={"transition": ended})
    assert wants_undrain(note) is undrain
    held = terminate_note(event_type=event_type, action="hold")
    assert not wants_undrain(held.model_copy(update={"transition": ended}))
    dry = terminate_note(event_type=event_type, dry_run=True)
    assert not wants_undrain(dry.model_copy(update={"transition": ended}))


def test_a_completed_reboot_is_undrained_on_the_vm_it_drained(
    harness: Harness, relays: Callable[..., Relays]
) -> None:
    fleet = relays(count=2)
    harness.callbacks.update(fleet.targets)
    event_id = fleet.sim.add_event("Reboot", resources=["web_0"], notice=300)
    note = terminate_note(event_id, notice=300, event_type="Reboot")
    with running(Answer(200)) as drain_hook, running(Answer(204)) as undrain_hook:
        drained = run_drain(
            note,
            settings(http_url=f"{drain_hook.url}/drain", relay_hook="drain"),
            harness.context(),
        )
        assert drained.outcome == "approved"
        fleet.sim.start_event(event_id)  # the reboot happens ...
        fleet.sim.remove_event(event_id)  # ... and is over: IMDS drops it
        completed = note.model_copy(update={"transition": Transition.COMPLETED})
        assert wants_undrain(completed)
        options = UndrainSettings(
            http_url=f"{undrain_hook.url}/undrain",
            relay_hook="undrain",
            step_timeout_seconds=5,
            poll_seconds=0.2,
        )
        result = run_undrain(completed, options, harness.context(), drain_hook="drain")
        (request,) = undrain_hook.requests
    assert result.outcome == "undrained", result.detail
    assert request.json()["action"] == "undrain" and request.json()["EventType"] == "Reboot"
    # Only the VM whose drain hook ran is undrained (web_1 was never drained).
    assert [line.split()[:2] for line in fleet.undrains()] == [["web_0", event_id]]
    assert harness.transitions() == ["drain_started", "undrained"]


def test_a_drain_waits_for_capacity_in_its_set_and_holds_without_it(harness: Harness) -> None:
    """No capacity in the set (another VM of it is down) before the drain deadline: nothing
    is drained or approved, and that is announced; capacity freed in time: it goes on."""
    asked: list[str] = []

    def full(event_id: str) -> bool:
        asked.append(event_id)
        return False

    note = terminate_note(notice=4, event_type="Reboot")  # ~1 s until NotBefore - 2 s - 1 s
    with running(Answer(200)) as hook:
        result = run_drain(
            note,
            settings(http_url=hook.url, poll_seconds=0.2, on_failure="approve"),
            harness.context(capacity=full),
        )
        assert hook.requests == []
    assert result.outcome == "held" and harness.approvals.calls == []
    assert len(asked) > 1  # asked again while there was time
    assert harness.transitions() == ["drain_failed"]
    assert "no capacity" in harness.published[0].detail
    assert "nothing drained, holding until NotBefore" in harness.published[0].detail

    answers = iter([False, False, True])
    later = terminate_note(event_type="Reboot")
    with running(Answer(200)) as hook:
        freed = run_drain(
            later,
            settings(http_url=hook.url),
            harness.context(capacity=lambda _id: next(answers), clock=NoWaitClock()),
        )
        assert len(hook.requests) == 1
    assert freed.outcome == "approved" and freed.steps["capacity"].status == "succeeded"
