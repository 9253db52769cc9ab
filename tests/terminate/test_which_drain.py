"""A drain that knows whether it works (issue 44 item 2, issue 45 "which drain"): the
readiness drain only where a load balancer probed the relay lately (its heartbeat's
`probe_at`); elsewhere no drain, and the event is held (Platform) or approved at once
(User), saying so. On 2f59d6a every VM was drained through its probe whether or not a load
balancer probed it, and the card said "out of their load balancer".

Real relays (callback, hook runner, readiness probe) over the IMDS simulator; the drains
table in Azurite; drain_for is pure."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest

from functions.model.drains import NO_DRAIN, RelayFacts, count_kinds, drain_for
from functions.terminate.plan import drain_summary
from functions.terminate.workflow import run_drain
from tests.terminate.conftest import Harness, Relays, settings, terminate_note

NOW = datetime(2026, 12, 3, 20, 0, tzinfo=UTC)


def heard(probe_ago: float | None, *, contract: int = 2, drain: tuple[str, ...] | None = None):
    """A relay heard at NOW whose last load-balancer probe was `probe_ago` s before."""
    probe = None if probe_ago is None else NOW - timedelta(seconds=probe_ago)
    offers = ("readiness",) if drain is None and contract >= 2 else drain
    return RelayFacts(heard=NOW, contract=contract, probe_at=probe, drain=offers)


def test_the_order_hook_http_readiness_none() -> None:
    hook = settings(relay_hook="drain")
    http = settings(http_url="https://drain.example/")
    bare = settings()
    assert drain_for(heard(5, drain=("hook", "readiness")), hook, NOW).kind == "hook"
    assert drain_for(None, hook, NOW).kind == "hook"  # asked; a relay without it says so
    # A relay that reports it offers no hook: the next drain in the order.
    assert drain_for(heard(5, drain=("readiness",)), hook, NOW).kind == "readiness"
    assert drain_for(heard(None, drain=("readiness",)), hook, NOW).kind == "none"
    assert drain_for(heard(None), http, NOW).kind == "http"
    assert drain_for(heard(5), bare, NOW).kind == "readiness"
    assert "probed its relay 5 s before its heartbeat" in drain_for(heard(5), bare, NOW).why
    # Learn's default probe interval is 15 s: two of them.
    assert drain_for(heard(30), bare, NOW).kind == "readiness"
    stale = drain_for(heard(31), bare, NOW)
    assert stale.kind == "none" and stale.why.startswith(NO_DRAIN)
    assert "30 s before its heartbeat" in stale.why
    never = drain_for(heard(None), bare, NOW)
    assert never.kind == "none" and "since it started" in never.why
    old = drain_for(heard(None, contract=1), bare, NOW)
    assert old.kind == "none" and "contract 1" in old.why
    assert drain_for(None, bare, NOW).kind == "none"
    off = drain_for(heard(5, drain=("hook",)), bare, NOW)
    assert off.kind == "none" and "probe is off" in off.why
    assert drain_for(heard(None, drain=("file",)), bare, NOW).kind == "readiness"
    assert drain_for(heard(5), settings(readiness=False), NOW).kind == "none"
    # Operator-set probe timing widens the window.
    slow = settings(probe_interval_seconds=60)
    assert drain_for(heard(100), slow, NOW).kind == "readiness"
    kinds = [drain_for(f, bare, NOW) for f in (heard(5), heard(None), None)]
    assert count_kinds(kinds) == {"hook": 0, "http": 0, "readiness": 1, "none": 2}


def test_the_wait_is_the_probes_timing_and_the_connection_drain() -> None:
    assert settings().readiness_wait_seconds() == 15 * 2 + 30
    custom = settings(probe_interval_seconds=5, probe_threshold=3, connection_seconds=45)
    assert custom.readiness_wait_seconds() == 5 * 3 + 45
    assert settings(readiness_seconds=7).readiness_wait_seconds() == 7  # the older setting
    text = drain_summary(custom)
    assert "where a load balancer probed its relay" in text
    assert "DRAIN__CONNECTION_SECONDS" in text and "then 60 s to drain" in text
    assert "a Platform event or a scale-in is held until NotBefore" in text
    assert "its load balancer takes it out)" not in text


@pytest.mark.azurite
def test_a_vm_no_load_balancer_probes_is_held_not_drained(
    harness: Harness, relays: Callable[..., Relays]
) -> None:
    """A Platform Reboot on a VM whose relay no load balancer probed: its probe is not
    turned 503 (it would take nothing out), nothing is approved, and the card says why."""
    fleet = relays(count=1, hooks=False, readiness=True)
    harness.callbacks.update(fleet.targets)
    now = datetime.now(UTC)
    harness.facts["web_0"] = RelayFacts(heard=now, contract=2, probe_at=None, drain=("readiness",))
    event_id = fleet.sim.add_event("Reboot", resources=["web_0"], notice=300)
    note = terminate_note(event_id, event_type="Reboot", notice=60)
    result = run_drain(note, settings(readiness_seconds=0), harness.context())
    assert result.outcome == "held" and not result.drained
    assert harness.approvals.calls == []
    assert fleet.ready("web_0") == 200  # never turned out of a rotation it is not in
    assert "ready:web_0" not in result.steps and "wait:readiness" not in result.steps
    assert harness.transitions() == ["drain_started"]
    started = harness.published[0].detail
    assert started.startswith(f"{NO_DRAIN}: held: holding until NotBefore"), started
    assert "web_0: no load balancer has probed its relay since it started" in started
    assert "out of their load balancer" not in started


@pytest.mark.azurite
def test_a_user_event_on_a_vm_with_no_drain_is_approved_at_once(
    harness: Harness, relays: Callable[..., Relays]
) -> None:
    fleet = relays(count=1, hooks=False, readiness=True)
    harness.callbacks.update(fleet.targets)
    harness.facts["web_0"] = None  # no heartbeat of its relay believed
    event_id = fleet.sim.add_event("Reboot", resources=["web_0"], notice=300)
    note = terminate_note(event_id, event_type="Reboot", notice=60)
    assert note.event is not None
    note = note.model_copy(update={"event": note.event.model_copy(update={"event_source": "User"})})
    result = run_drain(note, settings(readiness_seconds=30), harness.context())
    assert result.outcome == "approved" and not result.drained
    assert fleet.ready("web_0") == 200
    ((_, _, approved_at),) = harness.approvals.calls
    assert approved_at - note.occurred_at < timedelta(seconds=20)  # no 30 s wait
    started = harness.published[0].detail
    assert f"{NO_DRAIN}: approved at once (a User event)" in started


@pytest.mark.azurite
def test_the_probed_vm_is_drained_and_waits_for_probe_and_connections(
    harness: Harness, relays: Callable[..., Relays]
) -> None:
    """web_0 is behind a load balancer, web_1 is not: web_0 goes 503 and its wait is the
    probe's timing plus the connection drain; web_1 has no drain, so the Platform event is
    held (web_0 stays drained: Azure takes both at NotBefore)."""
    fleet = relays(count=2, hooks=False, readiness=True)
    harness.callbacks.update(fleet.targets)
    now = datetime.now(UTC)
    harness.facts["web_1"] = RelayFacts(
        heard=now, contract=2, probe_at=now - timedelta(minutes=10), drain=("readiness",)
    )
    names = ("web_0", "web_1")
    event_id = fleet.sim.add_event("Terminate", resources=list(names), notice=300)
    timing = settings(probe_interval_seconds=1, probe_threshold=1, connection_seconds=0.5)
    result = run_drain(
        terminate_note(event_id, resources=names, notice=60), timing, harness.context()
    )
    assert result.outcome == "held"
    assert fleet.ready("web_0") == 503 and fleet.ready("web_1") == 200
    out = result.steps["ready:web_0"]
    wait = result.steps["wait:readiness"]
    assert out.finished_at is not None and wait.finished_at is not None
    assert wait.finished_at >= out.finished_at + timedelta(seconds=1.5)
    started = harness.published[0].detail
    assert "readiness probe 503 on 1 VM(s) a load balancer probes" in started
    assert "web_1: no load balancer probed its relay in the 2 s before its heartbeat" in started


@pytest.mark.azurite
def test_both_probed_are_drained_and_approved(
    harness: Harness, relays: Callable[..., Relays]
) -> None:
    fleet = relays(count=2, hooks=False, readiness=True)
    harness.callbacks.update(fleet.targets)
    names = ("web_0", "web_1")
    event_id = fleet.sim.add_event("Terminate", resources=list(names), notice=300)
    timing = settings(probe_interval_seconds=1, probe_threshold=1, connection_seconds=0)
    result = run_drain(
        terminate_note(event_id, resources=names, notice=60), timing, harness.context()
    )
    assert result.outcome == "approved" and result.drained
    assert fleet.ready("web_0") == fleet.ready("web_1") == 503
