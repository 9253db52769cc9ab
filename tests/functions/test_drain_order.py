"""The drain workflow's own approval waits for the `decided` another reconcile claimed and
has not marked done (issue 46), as the decider's does (tests/functions/test_redecide.py):
the drain approves through approve_event (functions.terminate.wiring), which claims the
approval by the same rule (due.unannounced_before), and while it must wait the one decider
publishes what is due (reconcile_key), so a channel never reads `approved` before
`decided`, and the approval is not lost when the `decided`'s publisher dies. Azurite, a
real drain hook receiver, a real callback receiver."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from functions.model.event import Transition
from functions.pipeline.publish import LocalPublisher
from functions.pipeline.reconcile import Reconciled, reconcile_key
from functions.store import claims
from functions.store.drains import DrainStore
from functions.store.state import Store
from functions.terminate.settings import DrainSettings, UndrainSettings
from functions.terminate.wiring import pipeline_context, row_drainer
from tests.functions.conftest import FakeClock, event
from tests.functions.test_redecide import HostDied, PublishHook, failed_closed, pipeline_for
from tests.notify.receiver import Answer, running

pytestmark = pytest.mark.azurite

WAIT = 60.0  # a bound on waiting for the other thread's condition, never a pace


class GatedClock:
    """The shared FakeClock for the drain's host, whose first sleep (the drain's approval
    waiting: nothing else in this drain sleeps) tells the test (`turn`) and returns only
    once the test says so (`go`)."""

    def __init__(self, inner: FakeClock, turn: threading.Event) -> None:
        self.inner, self.turn, self.go = inner, turn, threading.Event()

    def now(self) -> Any:
        return self.inner.now()

    def sleep(self, seconds: float) -> None:
        self.turn.set()
        assert self.go.wait(WAIT), "the test never let the drain go on"
        self.inner.sleep(seconds)


def drainer_host(azurite: str, prefix: str, clock: Any, pub: LocalPublisher, hook: str) -> Any:
    """A host whose reconcile runs the drain workflow from the row, as in Azure
    (functions.triggers.core): an HTTP drain hook, then the approval."""
    own = Store.from_connection_string(azurite, prefix)
    pipeline = pipeline_for(own, clock, pub)
    drains = DrainStore.from_service(own.service, prefix).ensure_table()
    settings = DrainSettings(
        http_url=hook, step_timeout_seconds=5, safety_margin_seconds=2, poll_seconds=0.2
    )
    pipeline.drainer = row_drainer(
        pipeline, lambda: pipeline_context(pipeline, drains), lambda: settings, UndrainSettings
    )
    return pipeline


def racing(
    event_id: str,
    store: Store,
    clock: FakeClock,
    pub: LocalPublisher,
    drainer: Any,
    turn: threading.Event,
    then: Any = None,
) -> tuple[Any, dict[str, Any]]:
    """The pipeline of reconcile A, which, once it re-decided the event to a drain (its
    `decided` claimed in that write) and just before it publishes that `decided`, starts
    reconcile B (the drainer's: a sweep's unit of work) and lets it run until it waits or
    ends (`turn`), then calls `then`: B's drain reaches its approval while A's `decided`
    is claimed and not done."""
    seen: dict[str, Any] = {}

    def run_b() -> None:
        try:
            seen["B"] = reconcile_key(drainer, event_id, "B")
        finally:
            turn.set()

    def start_b() -> None:
        record = store.get_event(event_id)
        assert claims.holder(record.announced["decided"]) == "A"
        assert record.decision.action == "drain"
        seen["thread"] = threading.Thread(target=run_b, daemon=True)
        seen["thread"].start()
        assert turn.wait(WAIT), "B neither waited nor ended"
        if then is not None:
            then()

    hooked = PublishHook(pub, lambda note: note.transition is Transition.DECIDED, start_b)
    return pipeline_for(store, clock, hooked), seen


def finished(seen: dict[str, Any], clock: GatedClock) -> Reconciled:
    clock.go.set()
    seen["thread"].join(WAIT)
    assert not seen["thread"].is_alive()
    return seen["B"]


def test_the_drain_s_approval_waits_for_the_decided_another_publishes(azurite, store, clock, relay):
    pub = LocalPublisher()
    failed_closed(store, clock, pub, relay, event("EV-DT", "Terminate", source="User"))
    clock.advance(60)
    turn = threading.Event()
    gated = GatedClock(clock, turn)
    with running(Answer(200, {"drained": True})) as hook:
        drainer = drainer_host(azurite, store.prefix, gated, pub, f"{hook.url}/drain")
        a, seen = racing("EV-DT", store, clock, pub, drainer, turn)
        done = reconcile_key(a, "EV-DT", "A")
        waited = finished(seen, gated)
    assert done.redecided and done.published == ["decided"]
    # B drained while A's `decided` was claimed, then its approval waited for it: the
    # topic has the decision before the approval.
    assert pub.transitions("EV-DT") == [
        "scheduled",
        "policy_invalid",
        "drain_started",
        "decided",
        "approved",
    ]
    assert waited.ended == "" and relay.starts() == ["EV-DT"]
    record = store.get_event("EV-DT")
    assert record.approval == "approved" and record.drain_outcome == "approved"
    assert record.announced["decided"] == "done"


def test_the_drain_s_waiting_approval_is_not_lost_when_the_decided_s_publisher_dies(
    azurite, store, clock, relay
):
    pub = LocalPublisher()
    failed_closed(store, clock, pub, relay, event("EV-DD", "Terminate", source="User"))
    clock.advance(60)
    turn = threading.Event()
    gated = GatedClock(clock, turn)

    def die() -> None:
        raise HostDied()

    with running(Answer(200, {"drained": True})) as hook:
        drainer = drainer_host(azurite, store.prefix, gated, pub, f"{hook.url}/drain")
        a, seen = racing("EV-DD", store, clock, pub, drainer, turn, then=die)
        with pytest.raises(HostDied):
            reconcile_key(a, "EV-DD", "A")
        # A died holding `decided`, before publishing it: the drain's approval waits; once
        # A's claim lapses (the drain's clock moves on while it waits), the one decider
        # publishes the `decided` for it, and the drain approves after it.
        assert pub.transitions("EV-DD") == ["scheduled", "policy_invalid", "drain_started"]
        assert relay.requests == []
        waited = finished(seen, gated)
    assert pub.transitions("EV-DD") == [
        "scheduled",
        "policy_invalid",
        "drain_started",
        "decided",
        "approved",
    ]
    assert waited.approval is None and relay.starts() == ["EV-DD"]
    record = store.get_event("EV-DD")
    assert record.approval == "approved" and record.drain_outcome == "approved"
    assert record.announced["decided"] == "done"


def test_the_drain_waits_on_the_words_approve_event_says():
    from functions.pipeline import approve
    from functions.terminate import workflow

    assert workflow.ANNOUNCING == approve.ANNOUNCING
