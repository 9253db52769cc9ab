"""A drain's target out of reach for a while (issue 40): the drain step keeps trying until
the drain deadline, not a fixed step budget, and the undrain undoes only what ran. Real
relays over the IMDS simulator, whose callbacks refuse connections until they listen;
the drains table in Azurite."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest

from functions.model.event import Notification, Transition
from functions.store.drains import StepRecord
from functions.terminate.plan import UndoPlan, drain_deadlines, reached, steps_to_undo
from functions.terminate.steps import NO_SUCH_HOOK
from functions.terminate.workflow import UndrainSettings, run_drain, run_undrain
from local.azurite import free_port
from tests.notify.receiver import Answer, Receiver
from tests.terminate.conftest import Harness, Relays, settings, terminate_note

pytestmark = pytest.mark.azurite


def cancelled(note: Notification) -> Notification:
    return note.model_copy(update={"transition": Transition.CANCELLED})


def test_an_unreachable_relay_is_asked_again_until_the_drain_deadline(
    harness: Harness, relays: Callable[..., Relays]
) -> None:
    """The relay's callback refuses connections for 3 s; the step's own timeout is 1 s,
    but the notice leaves 20 s: the drain waits for the relay and drains (on 2cd3d60 the
    step failed after its 1 s budget and the event was held undrained)."""
    fleet = relays(count=1, listening=False)
    harness.callbacks.update(fleet.targets)
    event_id = fleet.sim.add_event("Terminate", resources=["web_0"], notice=300)
    back = threading.Timer(3.0, fleet.listen)
    back.start()
    try:
        result = run_drain(
            terminate_note(event_id, notice=23),
            settings(relay_hook="drain", step_timeout_seconds=1),
            harness.context(),
        )
    finally:
        back.join()
    step = result.steps["hook:web_0"]
    assert result.outcome == "approved" and result.drained, step.detail
    assert fleet.runs() == [f"web_0 {event_id}"]
    assert step.reached is True
    assert harness.transitions() == ["drain_started"]


def test_an_unreachable_http_hook_is_tried_until_the_drain_deadline(harness: Harness) -> None:
    """The same for the HTTP drain hook: nothing listens at its address for 3 s."""
    port = free_port()
    came_back: list[Receiver] = []
    back = threading.Timer(3.0, lambda: came_back.append(Receiver(Answer(200), port).start()))
    back.start()
    try:
        result = run_drain(
            terminate_note(notice=23),
            settings(http_url=f"http://127.0.0.1:{port}/drain", step_timeout_seconds=1),
            harness.context(),
        )
    finally:
        back.join()
        for receiver in came_back:
            receiver.stop()
    assert result.outcome == "approved", result.steps["http"].detail
    assert len(came_back[0].requests) == 1


def test_a_relay_never_reached_is_given_up_at_the_drain_deadline(
    harness: Harness, relays: Callable[..., Relays]
) -> None:
    fleet = relays(count=1, listening=False)
    harness.callbacks.update(fleet.targets)
    event_id = fleet.sim.add_event("Terminate", resources=["web_0"], notice=300)
    note = terminate_note(event_id, notice=6)
    assert note.event is not None and note.event.not_before is not None
    result = run_drain(note, settings(relay_hook="drain"), harness.context())
    step = result.steps["hook:web_0"]
    assert result.outcome == "held"
    assert "cannot reach the relay" in step.detail and step.reached is False
    # Tried until NotBefore - margin - reserve (2 s + 1 s), recorded right after.
    _, drain_until = drain_deadlines(note.event.not_before, "Terminate", settings())
    assert step.finished_at is not None
    assert drain_until - timedelta(seconds=1) <= step.finished_at
    assert step.finished_at <= drain_until + timedelta(seconds=0.5)
    assert harness.transitions() == ["drain_started", "drain_failed"]


def test_a_drain_that_never_reached_the_relay_is_not_undone_and_pages_nobody(
    harness: Harness, relays: Callable[..., Relays]
) -> None:
    """Issue 40's false page: the relay was unreachable through the drain, its hook never
    ran; the event is cancelled and the relay is back. The undrain has nothing to undo: it
    asks nothing, announces nothing, and no `undrain_failed` tells anyone to put the VM
    back by hand (on 2cd3d60: the relay answered "unknown EventId", announced as
    `undrain_failed`)."""
    fleet = relays(count=1, listening=False)
    harness.callbacks.update(fleet.targets)
    event_id = fleet.sim.add_event("Terminate", resources=["web_0"], notice=300)
    note = terminate_note(event_id, notice=5)
    drained = run_drain(note, settings(relay_hook="drain"), harness.context())
    assert drained.outcome == "held"
    fleet.listen()
    fleet.sim.cancel_event(event_id)
    result = run_undrain(
        cancelled(note),
        UndrainSettings(relay_hook="undrain", step_timeout_seconds=5, poll_seconds=0.2),
        harness.context(pages=lambda t: True),
        drain_hook="drain",
    )
    assert result.outcome == "skipped" and result.detail == "nothing was drained"
    assert fleet.undrains() == []
    assert "undrain_failed" not in harness.transitions()
    assert harness.transitions() == ["drain_started", "drain_failed"]


def row(step: str, status: str = "succeeded", detail: str = "", **extra: object) -> StepRecord:
    now = datetime.now(UTC)
    return StepRecord(
        step=step,
        status=status,  # type: ignore[arg-type]
        owner="t",
        started_at=now,
        lease_until=now,
        finished_at=now,
        detail=detail,
        **extra,  # type: ignore[arg-type]
    )


def test_steps_to_undo_reads_what_each_step_reached() -> None:
    rows = {
        "announce:drain_started": row("announce:drain_started"),
        "http": row("http", "failed", "drain hook ran out of time", reached=False),
        "hook:web_0": row("hook:web_0", "failed", "hook drain failed (exit 1)", reached=True),
        "hook:web_1": row("hook:web_1", "failed", "cannot reach the relay", reached=False),
        "hook:web_2": row("hook:web_2", "succeeded", "hook drain succeeded", reached=True),
        # Rows written before `reached` existed: read from their detail, as before.
        "hook:web_3": row("hook:web_3", "failed", "no relay known for web_3"),
        "hook:web_4": row("hook:web_4", "failed", "relay did not answer in time"),
        # A relay without that hook ran nothing, even if a row (written before issue 47)
        # carried `reached` over from a try whose connection was lost.
        "hook:web_6": row("hook:web_6", "failed", f"{NO_SUCH_HOOK} (hooks ...)", reached=True),
        "approve": row("approve"),
    }
    assert steps_to_undo(rows) == UndoPlan(http=False, hooks=("web_0", "web_2", "web_4"))
    assert steps_to_undo({}).empty
    assert not reached(None)
    # A step whose runner died mid-step: not known, so undone (the relay says if it ran).
    assert reached(row("hook:web_5", "running"))


def test_drain_deadlines_are_the_notice_less_the_margins() -> None:
    not_before = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
    config = settings(safety_margin_seconds=30, approve_reserve_seconds=10)
    assert drain_deadlines(not_before, "Terminate", config) == (
        not_before - timedelta(seconds=30),
        not_before - timedelta(seconds=40),
    )
    preempt = drain_deadlines(not_before, "Preempt", config)
    assert preempt == (not_before - timedelta(seconds=5), not_before - timedelta(seconds=7))
