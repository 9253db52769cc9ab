"""Who a drain may take out of service (functions.terminate.targets), without Azurite: the
named VMs whose own view decided drain, never one only a set-mate's view made a drain."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import UTC, datetime

import pytest

from functions.model.event import Decision
from functions.model.view import VmView
from functions.store.events import Reporter
from functions.store.records import EventRecord, ViewDecision
from functions.terminate.targets import UNHEARD, DrainTargets, drain_targets
from functions.terminate.workflow import run_drain
from tests.notify.receiver import Answer, running
from tests.terminate.conftest import Harness, Relays, settings, terminate_note

NOW = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)
DRAIN = Decision(action="drain", rule="terminate-drain")
APPROVE = Decision(action="approve", rule="user-initiated")
HOLD = Decision(action="hold", rule="default-hold")


def view(vm: str, event_type: str, *names: str) -> VmView:
    return VmView(
        vm=vm, event_type=event_type, resources=tuple(sorted(n.casefold() for n in names))
    )


def entry(key: str, seen: VmView, decision: Decision) -> ViewDecision:
    return ViewDecision(key=key, view=seen, decision=decision, decided_at=NOW, first_vm=seen.vm)


def record(resources: list[str], *views: ViewDecision, decision: Decision = DRAIN) -> EventRecord:
    return EventRecord(
        event_id="E1",
        event_type="Reboot",
        event_status="Scheduled",
        resources=resources,
        first_seen=NOW,
        decision=decision,
        views=list(views),
    )


def reporter(seen: VmView, key: str, status: str = "Scheduled") -> Reporter:
    return Reporter(vm=seen.vm, status=status, view=seen, key=key, decision=None)


def forged() -> tuple[EventRecord, list[Reporter]]:
    """The victim's Reboot (approve), the attacker's forged Terminate naming both (drain)."""
    attacker = view("attacker", "Terminate", "victim", "attacker")
    victim = view("victim", "Reboot", "victim")
    row = record(["victim", "attacker"], entry("a", attacker, DRAIN), entry("v", victim, APPROVE))
    return row, [reporter(attacker, "a"), reporter(victim, "v")]


def test_only_vms_whose_own_view_decided_drain_are_drained() -> None:
    row, reporters = forged()
    targets = drain_targets(row, reporters)
    assert targets.drain == ("attacker",)
    assert targets.not_drained == {"victim": "its own view decided approve (user-initiated)"}
    assert targets.unheard == ()
    assert "victim: its own view decided approve" in targets.summary()


def test_a_vm_whose_own_view_decided_hold_is_not_drained() -> None:
    row, reporters = forged()
    row.views[1] = row.views[1].model_copy(update={"decision": HOLD})
    row.decision = HOLD  # the strictest view: the event is held now
    targets = drain_targets(row, reporters)
    assert targets.drain == ("attacker",) and targets.now_decided == "hold"


@pytest.mark.azurite
def test_an_event_held_since_its_drain_was_decided_is_neither_drained_nor_approved(
    harness: Harness,
) -> None:
    note = terminate_note(resources=("web_0",))
    held = DrainTargets(drain=("web_0",), now_decided="hold")
    ctx = harness.context(own_drains=lambda _event_id, _ended: held)
    with running(Answer(200)) as hook:
        result = run_drain(note, settings(http_url=hook.url, relay_hook="drain"), ctx)
        assert hook.requests == []
    assert result.outcome == "skipped" and result.steps == {}
    assert harness.approvals.calls == [] and harness.published == []


def test_a_named_vm_that_has_not_reported_is_unheard_not_drained() -> None:
    row, reporters = forged()
    targets = drain_targets(row, reporters[:1])
    assert targets.drain == ("attacker",)
    assert targets.unheard == ("victim",) and targets.not_drained["victim"] == UNHEARD


def test_a_view_that_does_not_name_its_reporter_drains_nothing() -> None:
    """A VM reporting a set-mate's event (FORWARD_ALL_EVENTS, or forged) without itself in
    Resources is not named by its own view: its drain decision drains no one."""
    attacker = view("attacker", "Terminate", "victim")
    victim = view("victim", "Terminate", "victim", "web_9")
    row = record(["victim", "web_9"], entry("a", attacker, DRAIN), entry("v", victim, HOLD))
    targets = drain_targets(row, [reporter(attacker, "a"), reporter(victim, "v")])
    assert targets.drain == ()
    assert targets.unheard == ("web_9",)


def test_a_reporter_that_stopped_listing_counts_only_once_the_event_ended() -> None:
    row, reporters = forged()
    gone = [Reporter(r.vm, "", r.view, r.key, r.decision) for r in reporters]
    assert drain_targets(row, gone).drain == ()
    assert drain_targets(row, gone, ended=True).drain == ("attacker",)


def test_a_view_beyond_the_row_decides_by_its_reporter_rows_decision() -> None:
    row, reporters = forged()
    beyond = view("victim", "Terminate", "victim")
    kept_alone = Reporter("victim", "Scheduled", beyond, "beyond", DRAIN)
    assert drain_targets(row, [reporters[0], kept_alone]).drain == ("victim", "attacker")


def test_names_match_case_insensitively_and_once() -> None:
    row, reporters = forged()
    row.resources = ["VICTIM", "Attacker", "attacker"]
    assert drain_targets(row, reporters).drain == ("Attacker",)


def test_an_event_only_azure_reported_drains_every_vm_it_names() -> None:
    """No VM's view on the row: the decision rests on Event Grid's own report."""
    assert drain_targets(record(["web_0", "web_1"]), []).drain == ("web_0", "web_1")
    held = drain_targets(record(["web_0"], decision=HOLD), [])
    assert held.drain == () and "web_0" in held.not_drained


def test_no_event_row_drains_nothing() -> None:
    assert drain_targets(None, []).drain == ()


# --------------------------------------------------------------- the workflow uses them


@pytest.mark.azurite
def test_the_workflow_drains_and_asks_approval_only_of_its_targets(
    harness: Harness, relays: Callable[..., Relays]
) -> None:
    """web_1's own view did not decide drain: the HTTP hook does not list it, its relay
    hook is not called, and the approval may ask web_0's relay only."""
    fleet = relays(count=2)
    harness.callbacks.update(fleet.targets)
    event_id = fleet.sim.add_event("Terminate", resources=["web_0", "web_1"], notice=300)
    note = terminate_note(event_id, resources=("web_0", "web_1"), notice=300)
    own = DrainTargets(drain=("web_0",), not_drained={"web_1": "its own view decided approve"})
    ctx = harness.context(own_drains=lambda _event_id, _ended: own)
    with running(Answer(200)) as hook:
        result = run_drain(note, settings(http_url=hook.url, relay_hook="drain"), ctx)
        (request,) = hook.requests
    body = request.json()
    assert [i["name"] for i in body["instances"]] == ["web_0"] and body["Resources"] == ["web_0"]
    assert fleet.runs() == [f"web_0 {event_id}"]
    assert "hook:web_1" not in result.steps
    assert harness.approvals.relays == [("web_0",)]
    assert result.outcome == "approved" and result.not_drained == own.not_drained
    started = harness.published[0]
    assert "not drained: web_1: its own view decided approve" in started.detail


@pytest.mark.azurite
def test_with_no_vm_to_drain_nothing_is_drained_and_the_approver_chooses(
    harness: Harness,
) -> None:
    note = terminate_note(resources=("web_0",))
    nobody = DrainTargets(not_drained={"web_0": "its own view decided approve"})
    ctx = harness.context(own_drains=lambda _event_id, _ended: nobody)
    with running(Answer(200)) as hook:
        result = run_drain(note, settings(http_url=hook.url, relay_hook="drain"), ctx)
        assert hook.requests == []
    assert [s for s in result.steps if s == "http" or s.startswith("hook:")] == []
    assert harness.approvals.relays == [None]
    assert "no VM's own view decided drain" in harness.published[0].detail


@pytest.mark.azurite
@pytest.mark.parametrize("count", [2, 200])
def test_choosing_the_targets_costs_two_table_requests_whatever_the_vm_count(
    azurite: str, count: int
) -> None:
    """The event row (a point read) and its reporter rows (one query page): the same for
    2 VMs as for 200, all of whose own views decided drain."""
    from functions.clock import SystemClock
    from functions.pipeline.context import Pipeline
    from functions.pipeline.publish import LocalPublisher
    from functions.settings import Settings
    from functions.store.drains import DrainStore
    from functions.store.state import Store
    from functions.terminate.wiring import pipeline_context
    from tests.tablecount import TableCounter

    names = [f"web_{i}" for i in range(count)]
    with TableCounter(azurite) as counter:
        prefix = "c" + uuid.uuid4().hex[:10]
        store = Store.from_connection_string(counter.connection_string, prefix).ensure_tables()
        try:
            shared = view("web_0", "Terminate", *names)
            store.mutate_event("E1", lambda _r: record(names, entry("k", shared, DRAIN)))
            for name in names:
                own = shared.model_copy(update={"vm": name})
                store.set_reporter("E1", name, "Scheduled", NOW, view=own, key="k")
            pipeline = Pipeline(store, Settings(), LocalPublisher(), None, SystemClock())
            drains = DrainStore.from_service(store.service, prefix)
            ctx = pipeline_context(pipeline, drains)
            counter.reset()
            targets = ctx.own_drains("E1", False)
            assert targets.drain == tuple(names)
            assert counter.by_kind() == {"get": 1, "query": 1}, counter.by_kind()
        finally:
            for table in store.service.list_tables():
                if table.name.startswith(prefix):
                    store.service.delete_table(table.name)
