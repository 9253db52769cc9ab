"""The drain that needs no script of the operator's (issue 38): each relay's readiness probe
answers 503 (its built-in hook), the drain waits the stated drain time and approves early;
the undrain turns the probe back to 200. The operator's own hook wins where a relay has it.
Real relays (callback, hook runner, readiness probe) over the IMDS simulator; the drains
table in Azurite."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
import requests

from functions.model.event import Notification, Transition
from functions.terminate.plan import (
    READY_DRAIN,
    READY_UNDRAIN,
    drain_deadlines,
    drain_summary,
    relay_drain,
)
from functions.terminate.relays import NO_PROBE
from functions.terminate.workflow import UndrainSettings, run_drain, run_undrain
from relay.ready import Readiness
from tests.notify.receiver import Answer, running
from tests.terminate.conftest import Harness, Relays, settings, terminate_note

pytestmark = pytest.mark.azurite


def cancelled(note: Notification) -> Notification:
    return note.model_copy(update={"transition": Transition.CANCELLED})


def test_with_no_drain_step_configured_the_probe_drains_and_the_event_is_approved_early(
    harness: Harness, relays: Callable[..., Relays]
) -> None:
    """A first deploy: no DRAIN__HTTP_URL, no DRAIN__RELAY_HOOK, no script on the VMs. The
    scale-in goes out of its load balancer (probe 503), the stated drain time passes, and
    it is approved long before NotBefore (2cd3d60 held it to NotBefore undrained)."""
    fleet = relays(count=2, hooks=False, readiness=True)
    harness.callbacks.update(fleet.targets)
    names = ("web_0", "web_1")
    event_id = fleet.sim.add_event("Terminate", resources=list(names), notice=300)
    note = terminate_note(event_id, resources=names, notice=60)
    assert note.event is not None and note.event.not_before is not None
    assert fleet.ready("web_0") == fleet.ready("web_1") == 200
    result = run_drain(note, settings(readiness_seconds=1), harness.context())
    assert result.outcome == "approved" and result.drained, result.steps
    assert fleet.ready("web_0") == fleet.ready("web_1") == 503  # out of rotation
    assert fleet.runs() == []  # nothing of the operator's ran
    out = [result.steps[f"ready:{vm}"] for vm in names]
    assert [step.detail for step in out] == ["readiness probe 503: out of rotation"] * 2
    ((_, _, approved_at),) = harness.approvals.calls
    last_out = max(step.finished_at for step in out if step.finished_at)
    assert approved_at >= last_out + timedelta(seconds=1)  # the stated drain time
    approve_by, _ = drain_deadlines(note.event.not_before, "Terminate", settings())
    assert approved_at < approve_by - timedelta(seconds=40)  # early
    assert harness.transitions() == ["drain_started"]
    started = harness.published[0].detail
    assert "readiness probe 503 on 2 VM(s)" in started and "then 1 s to drain" in started


def test_the_undrain_puts_the_probe_back_with_no_setting(
    harness: Harness, relays: Callable[..., Relays]
) -> None:
    fleet = relays(count=1, hooks=False, readiness=True)
    harness.callbacks.update(fleet.targets)
    event_id = fleet.sim.add_event("Reboot", resources=["web_0"], notice=300)
    note = terminate_note(event_id, event_type="Reboot", notice=60)
    harness.approvals.answer = "failed"
    run_drain(note, settings(readiness_seconds=0), harness.context())
    assert fleet.ready("web_0") == 503
    fleet.sim.cancel_event(event_id)
    undo = UndrainSettings(step_timeout_seconds=5, poll_seconds=0.2)  # nothing configured
    result = run_undrain(cancelled(note), undo, harness.context(), drain_hook=None)
    assert result.outcome == "undrained", result.detail
    assert fleet.ready("web_0") == 200
    assert "undrain:ready:web_0: " not in result.detail
    assert result.detail == "readiness probe 200: back in rotation"
    assert harness.transitions()[-1] == "undrained"


def test_the_operators_hook_wins_where_its_relay_has_it(
    harness: Harness, relays: Callable[..., Relays]
) -> None:
    """DRAIN__RELAY_HOOK=drain; only web_0 has that script. web_0 runs it; web_1, whose
    relay answers "unknown hook", is drained through its probe instead of failing."""
    fleet = relays(count=2, hooks=frozenset({"web_0"}), readiness=True)
    harness.callbacks.update(fleet.targets)
    names = ("web_0", "web_1")
    event_id = fleet.sim.add_event("Terminate", resources=list(names), notice=300)
    result = run_drain(
        terminate_note(event_id, resources=names, notice=60),
        settings(relay_hook="drain", readiness_seconds=0.5),
        harness.context(),
    )
    assert result.outcome == "approved" and result.drained, result.steps
    assert fleet.runs() == [f"web_0 {event_id}"]
    assert result.steps["hook:web_0"].status == "succeeded"
    assert "ready:web_0" not in result.steps
    assert result.steps["hook:web_1"].reached is False  # refused: nothing ran there
    assert result.steps["ready:web_1"].status == "succeeded"
    assert fleet.ready("web_0") == fleet.ready("web_1") == 503
    assert harness.transitions() == ["drain_started"]


def test_a_relay_without_the_probe_is_not_drained_and_says_why(
    harness: Harness, relays: Callable[..., Relays]
) -> None:
    fleet = relays(count=1, hooks=False, readiness=False)
    harness.callbacks.update(fleet.targets)
    event_id = fleet.sim.add_event("Terminate", resources=["web_0"], notice=300)
    result = run_drain(terminate_note(event_id, notice=30), settings(), harness.context())
    assert result.outcome == "held" and harness.approvals.calls == []
    step = result.steps["ready:web_0"]
    assert step.detail == NO_PROBE and step.reached is False
    assert harness.transitions() == ["drain_started", "drain_failed"]


def test_the_stated_drain_time_never_runs_past_the_drain_deadline(
    harness: Harness, relays: Callable[..., Relays]
) -> None:
    fleet = relays(count=1, hooks=False, readiness=True)
    harness.callbacks.update(fleet.targets)
    event_id = fleet.sim.add_event("Preempt", resources=["web_0"], notice=300)
    note = terminate_note(event_id, event_type="Preempt", notice=8)
    assert note.event is not None and note.event.not_before is not None
    result = run_drain(note, settings(readiness_seconds=600), harness.context())
    assert result.outcome == "approved"
    assert "cut at the drain deadline" in result.steps["wait:readiness"].detail
    ((_, _, approved_at),) = harness.approvals.calls
    assert approved_at < note.event.not_before - timedelta(seconds=5)  # the Preempt margin


def test_which_drain_applies() -> None:
    assert relay_drain(settings()) == "readiness"
    assert relay_drain(settings(relay_hook="drain")) == "hook"
    assert relay_drain(settings(http_url="https://drain.example/")) is None  # it wins
    assert relay_drain(settings(readiness=False)) is None
    assert "readiness probe 503" in drain_summary(settings())
    assert "then 30 s to drain" in drain_summary(settings(readiness_seconds=30))
    both = drain_summary(settings(relay_hook="drain"))
    assert both.startswith("relay hook 'drain'") and "no such hook" in both
    assert drain_summary(settings(http_url="https://drain.example/")) == (
        "HTTP drain hook (DRAIN__HTTP_URL), then approve"
    )
    assert "held until NotBefore" in drain_summary(settings(readiness=False))
    # The relay's built-in hooks, by the names the app asks for.
    assert set(Readiness.hooks) == {READY_DRAIN, READY_UNDRAIN}


def test_an_http_hook_alone_does_not_touch_the_probe(
    harness: Harness, relays: Callable[..., Relays]
) -> None:
    fleet = relays(count=1, hooks=False, readiness=True)
    harness.callbacks.update(fleet.targets)
    event_id = fleet.sim.add_event("Terminate", resources=["web_0"], notice=300)
    with running(Answer(200)) as hook:
        result = run_drain(
            terminate_note(event_id, notice=60), settings(http_url=hook.url), harness.context()
        )
    assert result.outcome == "approved" and "ready:web_0" not in result.steps
    assert fleet.ready("web_0") == 200


class LostFirstHookCall(requests.Session):
    """The first call to a relay's hook endpoint gets no answer: its connection is lost
    (as the chaos suite's unreachable callback, or a reset), so the relay may have acted."""

    def __init__(self) -> None:
        super().__init__()
        self.lost = 0

    def send(self, request: requests.PreparedRequest, **kwargs: Any) -> requests.Response:
        if self.lost == 0 and (request.url or "").endswith("/v1/hook"):
            self.lost += 1
            raise requests.ConnectionError("connection lost before an answer")
        return super().send(request, **kwargs)


def test_a_relay_without_the_hook_has_nothing_to_undrain_after_a_lost_try(
    harness: Harness, relays: Callable[..., Relays]
) -> None:
    """Issue 47 (chaos 'callback unreachable through the drain'): the drain's first try of
    the `drain` hook lost its connection, the next was answered "unknown hook". A relay
    with no such hook ran nothing, whatever became of the lost try, so the VM is drained
    through its probe and the undrain puts the probe back: no `undrain` hook is asked for
    (its "unknown hook" was announced undrain_failed and paged)."""
    fleet = relays(count=1, hooks=False, readiness=True)
    harness.callbacks.update(fleet.targets)
    event_id = fleet.sim.add_event("Reboot", resources=["web_0"], notice=300)
    note = terminate_note(event_id, event_type="Reboot", notice=60)
    session = LostFirstHookCall()
    context = harness.context(session=session)
    drained = run_drain(note, settings(relay_hook="drain", readiness_seconds=0), context)
    assert drained.outcome == "approved" and session.lost == 1, drained.steps
    assert drained.steps["hook:web_0"].detail.startswith("relay refused: unknown hook")
    assert drained.steps["hook:web_0"].reached is False
    assert fleet.ready("web_0") == 503
    fleet.sim.cancel_event(event_id)
    undo = UndrainSettings(relay_hook="undrain", step_timeout_seconds=5, poll_seconds=0.2)
    result = run_undrain(cancelled(note), undo, context, drain_hook="drain")
    assert result.outcome == "undrained", result.detail
    assert "undrain:hook:web_0" not in result.steps
    assert fleet.ready("web_0") == 200
    assert harness.transitions()[-1] == "undrained"
