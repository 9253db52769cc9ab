"""No VM drains another through its view of a shared event (issue 27 follow-up).

An event's decision is the strictest of its reporters' views (hold > drain > approve), so
a set-mate reporting the victim's Reboot as a Terminate, or with itself added to
`Resources` under a rule that drains it, makes the whole event a drain. The drain workflow
must still take out of rotation only the VMs whose own view decided drain: the victim's
HTTP drain hook entry and its relay's drain hook are never reached on the attacker's word.

Everything is real but Service Bus: attested messages from each VM's relay code, the
admission, ingest and approval on Azurite, each VM's relay (callback with hook scripts)
reading its own IMDS (the simulator), a loopback HTTP drain hook receiver, and the drain
workflow wired as the deployed app wires it (functions.terminate.wiring).
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from azure.data.tables import TableServiceClient

from functions.model.event import Notification, Transition
from functions.model.policy import Match, Policy, PolicyLoad, Rule, sample_rules
from functions.pipeline.approve import approve_event
from functions.store.drains import DrainStore
from functions.terminate.context import DrainResult
from functions.terminate.settings import DrainSettings
from functions.terminate.wiring import pipeline_context
from functions.terminate.workflow import run_drain
from local.hook_unit import HookUnit
from relay.hooks import HookRunner
from tests.notify.receiver import Answer, running
from tests.security.conftest import Fleet

pytestmark = pytest.mark.azurite


@dataclass
class Drains:
    """Each VM's relay with a `drain` hook script; `ran` lists "<vm> <event id>" per run."""

    fleet: Fleet
    store: DrainStore
    ran: Path

    def runs(self) -> list[str]:
        return self.ran.read_text().splitlines() if self.ran.exists() else []

    def run(self, note: Notification, hook_url: str) -> DrainResult:
        settings = DrainSettings(
            http_url=hook_url,
            relay_hook="drain",
            step_timeout_seconds=5,
            safety_margin_seconds=2,
            approve_reserve_seconds=1,
            poll_seconds=0.2,
        )
        return run_drain(note, settings, pipeline_context(self.fleet.pipeline, self.store))


@pytest.fixture
def drains(fleet: Fleet, azurite: str, tmp_path: Path) -> Iterator[Drains]:
    ran = tmp_path / "ran.txt"
    script = tmp_path / "drain.sh"
    script.write_text(f'#!/bin/sh\necho "$SCHEDULED_EVENT_VM_NAME $SCHEDULED_EVENT_ID" >> {ran}\n')
    script.chmod(0o755)
    unit = HookUnit(tmp_path / "hooks.sock", {"drain": script}, 5).start()  # runs the script
    for vm in fleet.vms.values():
        # The same relays, now with a drain hook configured (set on the running callback
        # rather than rebinding its address: the port could be taken meanwhile).
        assert vm.callback is not None
        app = vm.callback.app
        app.hooks = HookRunner({"drain": script}, vm.state / "hooks", 5, vm.name, unit.path)
        app.hook_wait = 3
    service = TableServiceClient.from_connection_string(azurite)
    prefix = f"d{uuid.uuid4().hex[:10]}"
    store = DrainStore.from_service(service, prefix).ensure_table()
    try:
        yield Drains(fleet, store, ran)
    finally:
        service.delete_table(f"{prefix}drains")
        unit.stop()


def imds_event(fleet: Fleet, vm: str, event_id: str) -> dict[str, Any]:
    return next(e for e in fleet.imds_events(vm) if e["EventId"] == event_id)


def own_document(fleet: Fleet, vm: str) -> list[dict[str, Any]]:
    return [e for e in fleet.imds_events(vm) if vm in e.get("Resources", [])]


def decided_drain(fleet: Fleet, event_id: str) -> Notification:
    """The `decided` drain the terminate subscription receives."""
    notes = [
        n
        for n in fleet.publisher.published
        if n.transition is Transition.DECIDED
        and n.event is not None
        and n.event.event_id == event_id
        and n.decision is not None
        and n.decision.action == "drain"
    ]
    assert notes, fleet.publisher.transitions(event_id)
    return notes[-1]


def use_policy(fleet: Fleet, *rules: Rule) -> None:
    policy = Policy(rules=(*rules, *sample_rules()))
    fleet.pipeline.settings = fleet.pipeline.settings.with_policy(PolicyLoad(policy=policy))


def known(fleet: Fleet) -> None:
    """Both relays have reported (an empty document): the app knows them and their keys."""
    for vm in fleet.vms.values():
        fleet.deliver(vm.message([]))


def drained_names(request: Any) -> list[str]:
    return [item["name"] for item in request.json()["instances"]]


# --------------------------------------------------------------- a set-mate's forged view


@pytest.mark.parametrize("forgery", ["a Terminate", "itself added under a rule that drains it"])
def test_a_set_mates_forged_view_does_not_drain_the_victim(
    fleet: Fleet, drains: Drains, forgery: str
) -> None:
    """The victim's user-initiated Reboot (its own view: approve, rule user-initiated).
    The attacker sees it in its IMDS and reports it first, as a Terminate naming both, or
    with itself added under a rule that drains Reboots of its tier: the event becomes a
    drain. Then the victim reports its genuine view."""
    use_policy(
        fleet,
        Rule(
            name="drain-att-tier",
            match=Match(event_types=("Reboot",), resources=("att*",)),
            action="drain",
        ),
    )
    known(fleet)
    event_id = fleet.sim.add_event("Reboot", resources=["victim"], source="User", notice=900)
    forged = {**imds_event(fleet, "attacker", event_id), "Resources": ["victim", "attacker"]}
    if forgery == "a Terminate":
        forged["EventType"] = "Terminate"
    fleet.deliver(fleet.vms["attacker"].message([forged]))
    fleet.deliver(fleet.vms["victim"].message(own_document(fleet, "victim")))
    record = fleet.store.get_event(event_id)
    assert record.decision.action == "drain"  # the strictest view, the attacker's
    assert {v.decision.action for v in record.views} == {"drain", "approve"}

    with running(Answer(200)) as hook:
        result = drains.run(decided_drain(fleet, event_id), f"{hook.url}/drain")
        requests_seen = list(hook.requests)

    assert not any(line.startswith("victim ") for line in drains.runs()), drains.runs()
    assert all("victim" not in drained_names(r) for r in requests_seen), requests_seen
    assert all("victim" not in r.json()["Resources"] for r in requests_seen)
    assert "hook:victim" not in result.steps
    assert "decided approve" in result.not_drained["victim"], result.not_drained
    started = [
        n.detail
        for n in fleet.publisher.published
        if n.transition is Transition.DRAIN_STARTED and n.event.event_id == event_id
    ]
    assert started and "victim: its own view decided approve" in started[0], started
    # The attacker was "drained" (its own view, its own VM): its relay refused the hook, as
    # its IMDS does not name it, so nothing is approved on the attacker's word either.
    assert result.steps["hook:attacker"].status == "failed"
    assert "does not name this VM" in result.steps["hook:attacker"].detail
    assert fleet.sim.approvals == []
    assert imds_event(fleet, "victim", event_id)["EventStatus"] == "Scheduled"


def test_a_drain_decided_before_the_victims_hold_view_does_not_drain_it(
    fleet: Fleet, drains: Drains
) -> None:
    """The attacker's forged Terminate is decided (a drain) before the victim reports its
    genuine Platform Reboot (held by the reference policy): the event is held now, but
    the drain workflow already has the `decided` drain. The victim is neither drained nor
    asked to approve."""
    known(fleet)
    event_id = fleet.sim.add_event("Reboot", resources=["victim"], notice=900)
    forged = {
        **imds_event(fleet, "attacker", event_id),
        "EventType": "Terminate",
        "Resources": ["victim", "attacker"],
    }
    fleet.deliver(fleet.vms["attacker"].message([forged]))
    note = decided_drain(fleet, event_id)
    fleet.deliver(fleet.vms["victim"].message(own_document(fleet, "victim")))
    assert fleet.store.get_event(event_id).decision.action == "hold"

    result = drains.run(note, "http://127.0.0.1:9/unused")

    assert not any(line.startswith("victim ") for line in drains.runs())
    assert "decided hold" in result.not_drained["victim"]
    assert result.outcome == "skipped" and "hold now" in result.detail, result
    assert drains.runs() == []  # the event is held: not even the attacker is drained
    record = fleet.store.get_event(event_id)
    assert [a for a in record.approval_attempts if a.vm == "victim"] == []
    assert fleet.sim.approvals == []


# --------------------------------------------------------------- legitimate drains


def test_both_vms_are_drained_when_each_ones_own_view_decides_drain(
    fleet: Fleet, drains: Drains
) -> None:
    """A Terminate naming both VMs, reported by each as its IMDS shows it: both drained
    (the HTTP hook lists both, each relay ran its hook), then approved through a relay
    whose own view decided drain."""
    known(fleet)
    event_id = fleet.sim.add_event("Terminate", resources=["victim", "attacker"], notice=900)
    for name in ("attacker", "victim"):
        fleet.deliver(fleet.vms[name].message(own_document(fleet, name)))

    with running(Answer(200)) as hook:
        result = drains.run(decided_drain(fleet, event_id), f"{hook.url}/drain")
        (request,) = hook.requests

    assert sorted(drained_names(request)) == ["attacker", "victim"]
    assert sorted(drains.runs()) == [f"attacker {event_id}", f"victim {event_id}"]
    assert result.outcome == "approved" and result.drained, result
    assert result.not_drained == {}
    assert [a.event_id.casefold() for a in fleet.sim.approvals] == [event_id.casefold()]
    assert fleet.store.get_event(event_id).approved_by in ("victim", "attacker")


def test_a_named_vm_reporting_late_is_waited_for_then_drained(
    fleet: Fleet, drains: Drains, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The drain starts on the first VM's report; the second VM's relay reports a moment
    later: the workflow waits for it (a few reads of the reporter rows) and drains both.
    "Later" is a condition, not a sleep: the victim reports once the workflow has read the
    reporter rows twice without it, so the test always exercises the wait."""
    known(fleet)
    event_id = fleet.sim.add_event("Terminate", resources=["victim", "attacker"], notice=900)
    fleet.deliver(fleet.vms["attacker"].message(own_document(fleet, "attacker")))
    note = decided_drain(fleet, event_id)
    store = fleet.pipeline.store
    read_rows, waiting = store.reporter_rows, threading.Event()
    reads_without_victim = []

    def reporter_rows(key: str) -> list:
        rows = read_rows(key)
        if not any(r.vm.casefold() == "victim" for r in rows):
            reads_without_victim.append(key)
            if len(reads_without_victim) >= 2:
                waiting.set()
        return rows

    monkeypatch.setattr(store, "reporter_rows", reporter_rows)

    def late() -> None:
        assert waiting.wait(60), "the workflow never waited for the unheard VM"
        fleet.deliver(fleet.vms["victim"].message(own_document(fleet, "victim")))

    reporter = threading.Thread(target=late)
    reporter.start()
    try:
        with running(Answer(200)) as hook:
            result = drains.run(note, f"{hook.url}/drain")
            (request,) = hook.requests
    finally:
        reporter.join()
    assert sorted(drained_names(request)) == ["attacker", "victim"]
    assert sorted(drains.runs()) == [f"attacker {event_id}", f"victim {event_id}"]
    assert result.outcome == "approved", result


def test_the_approval_after_a_drain_asks_only_the_relays_it_is_given(
    fleet: Fleet, drains: Drains
) -> None:
    """approve_event(relays=...): the drain's approval goes only to the relays of VMs it
    drained; another named VM's relay is not asked, even when it is the only one up."""
    known(fleet)
    event_id = fleet.sim.add_event("Terminate", resources=["victim", "attacker"], notice=900)
    for name in ("attacker", "victim"):
        fleet.deliver(fleet.vms[name].message(own_document(fleet, name)))
    attacker = fleet.vms["attacker"]
    assert attacker.callback is not None
    attacker.callback.stop()  # the only relay the approval may ask is down
    attacker.callback = None
    soon = datetime.now(UTC) + timedelta(seconds=2)

    first = approve_event(
        event_id, fleet.pipeline, give_up_at=soon, by="drain", relays=("attacker",)
    )

    assert first.outcome != "approved" and fleet.sim.approvals == []
    assert {a.vm for a in first.attempts} <= {"attacker"}, first.attempts
    later = datetime.now(UTC) + timedelta(seconds=2)
    second = approve_event(
        event_id, fleet.pipeline, give_up_at=later, by="drain", relays=("victim",)
    )
    assert second.outcome == "approved" and second.vm == "victim", second
