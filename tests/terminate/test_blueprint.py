"""The Azure handler end to end: the core's pipeline on Azurite, a real relay, real IMDS
(simulated), approval through functions.pipeline.approve.approve_event."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta

import azure.functions as func
import pytest
import requests

from functions.clock import SystemClock
from functions.model.event import Notification, Transition
from functions.pipeline.context import Pipeline
from functions.pipeline.publish import LocalPublisher
from functions.settings import Settings
from functions.store.deliveries import DeliveryLedger
from functions.store.drains import DrainStore
from functions.store.records import EventRecord, VmRecord
from functions.store.state import Store
from functions.triggers import core as handlers
from functions.triggers import notify as notify_trigger
from functions.triggers.terminate import bp, drain_settings, terminate_drain, undrain_settings
from tests import identity_harness
from tests.terminate.conftest import Relays, imds_not_before, terminate_note

pytestmark = pytest.mark.azurite


@pytest.fixture
def core(azurite: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Pipeline]:
    prefix = f"b{uuid.uuid4().hex[:10]}"
    settings = Settings(
        state_storage=azurite,
        app_secret=identity_harness.APP_SECRET.decode(),
        state_table_prefix=prefix,
    )
    store = Store.from_connection_string(azurite, prefix).ensure_tables()
    pipeline = Pipeline(
        store,
        settings,
        LocalPublisher(),
        requests.Session(),
        SystemClock(),
        admission=identity_harness.admission(store),
    )
    monkeypatch.setenv("DRAIN__RELAY_HOOK", "drain")
    monkeypatch.setenv("DRAIN__SAFETY_MARGIN_SECONDS", "5")
    monkeypatch.setenv("UNDRAIN__RELAY_HOOK", "undrain")
    monkeypatch.delenv("WEBHOOK_SECRET", raising=False)
    drain_settings.cache_clear()
    undrain_settings.cache_clear()
    handlers.use_pipeline(pipeline)
    try:
        yield pipeline
    finally:
        handlers.use_pipeline(None)
        drain_settings.cache_clear()
        undrain_settings.cache_clear()
        for name in ("vms", "events", "audit", "rejected", "drains", "deliveries", "identities"):
            store.service.delete_table(f"{prefix}{name}")


# The row's announcements as ingest leaves them once the `decided` this handler reads is
# out: the drain's approval waits for it otherwise (issue 46).
ANNOUNCED = {"scheduled": "done", "decided": "done"}


def test_the_handler_drains_through_the_relay_then_approves_through_it(
    core: Pipeline, relays: Callable[..., Relays]
) -> None:
    fleet = relays(count=1)
    event_id = fleet.sim.add_event("Terminate", resources=["web_0"], notice=300)
    note = terminate_note(event_id, not_before=imds_not_before(fleet.sim, event_id))
    assert note.event is not None
    now = datetime.now(UTC)
    vm_id = identity_harness.enroll(core, "web_0", fleet.targets["web_0"], scale_set="web")
    core.store.mutate_vm(
        "web_0",
        lambda _r: VmRecord(name="web_0", vm_id=vm_id, last_seen=now, scale_set="web"),
    )
    core.store.mutate_event(
        event_id,
        lambda _r: EventRecord(
            event_id=event_id,
            event_type="Terminate",
            event_status="Scheduled",
            event_source="Platform",  # as the simulator's IMDS says: the relay checks
            duration_in_seconds=-1,
            resources=["web_0"],
            not_before=note.event.not_before,
            scale_sets=["web"],
            first_seen=now,
            reporters={"web_0": "Scheduled"},
            decision=note.decision,
            decided_at=now,
            announced=ANNOUNCED,  # its `decided` is out: this handler runs on it
        ),
    )
    publisher = core.publisher
    assert isinstance(publisher, LocalPublisher)

    terminate_drain(func.ServiceBusMessage(body=note.to_json().encode()))

    assert fleet.runs() == [f"web_0 {event_id}"]
    assert [a.event_id.casefold() for a in fleet.sim.approvals] == [event_id.casefold()]
    assert publisher.transitions(event_id) == [
        Transition.DRAIN_STARTED.value,
        Transition.APPROVED.value,
    ]
    assert publisher.published[0].page is False  # type: ignore[attr-defined]
    record = core.store.get_event(event_id)
    assert record is not None and record.approval == "approved"
    drains = DrainStore.from_service(core.store.service, core.settings.state_table_prefix)
    steps = drains.steps(event_id)
    assert {name: s.status for name, s in steps.items()} == {
        "capacity": "succeeded",  # a Terminate needs no slot: the guard lets it through
        "announce:drain_started": "succeeded",
        "hook:web_0": "succeeded",
        "approve": "succeeded",
    }
    assert steps["approve"].finished_at is not None
    assert steps["approve"].finished_at < note.event.not_before - timedelta(seconds=5)


def test_the_handler_undrains_a_drained_terminate_azure_cancelled(
    core: Pipeline, relays: Callable[..., Relays]
) -> None:
    fleet = relays(count=1)
    event_id = fleet.sim.add_event("Terminate", resources=["web_0"], notice=300)
    note = terminate_note(event_id, notice=300)
    now = datetime.now(UTC)
    vm_id = identity_harness.enroll(core, "web_0", fleet.targets["web_0"])
    core.store.mutate_vm("web_0", lambda _r: VmRecord(name="web_0", vm_id=vm_id, last_seen=now))
    # The event row as decided (no view kept: Azure's own report) and already approved
    # elsewhere: the approval has nothing to do, the instance stays drained.
    assert note.event is not None and note.decision is not None
    core.store.mutate_event(
        event_id,
        lambda _r: EventRecord(
            event_id=event_id,
            event_type="Terminate",
            event_status="Scheduled",
            resources=["web_0"],
            not_before=note.event.not_before,
            first_seen=now,
            decision=note.decision,
            decided_at=now,
            approval="approved",
        ),
    )
    terminate_drain(func.ServiceBusMessage(body=note.to_json().encode()))
    assert fleet.runs() == [f"web_0 {event_id}"] and fleet.sim.approvals == []
    fleet.sim.cancel_event(event_id)
    gone = note.model_copy(update={"transition": Transition.CANCELLED})
    for _delivery in range(2):  # a redelivery undoes nothing twice
        terminate_drain(func.ServiceBusMessage(body=gone.to_json().encode()))
    assert fleet.undrains() == [f"web_0 {event_id} Cancelled"]
    assert core.publisher.transitions(event_id)[-1] == "undrained"  # type: ignore[attr-defined]
    rows = [(r["action"], r["outcome"], r["by"]) for r in core.store.audit_rows(event_id)]
    assert rows == [("undrain", "undrained", "drain")]


def test_other_messages_return_and_junk_is_refused(core: Pipeline) -> None:
    quiet = terminate_note(action="approve")
    terminate_drain(func.ServiceBusMessage(body=quiet.to_json().encode()))
    assert core.publisher.published == []  # type: ignore[attr-defined]
    ledger = DeliveryLedger.from_service(core.store.service, core.settings.state_table_prefix)
    ledger.ensure_table()
    notify_trigger.ledger.cache_clear()
    try:
        # The test constructor has no MessageId (Azure always sets one): recorded as "unnamed".
        terminate_drain(func.ServiceBusMessage(body=b'{"transition": "nope"}'))
    finally:
        notify_trigger.ledger.cache_clear()
    row = ledger.get("unnamed", "terminate")  # completed, not retried until the DLQ
    assert row.status == "rejected" and "not a notification" in row.detail


def test_invalid_drain_settings_fail_closed_and_are_announced(
    core: Pipeline, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DRAIN__ON_FAILURE", "shrug")
    drain_settings.cache_clear()
    note = terminate_note()
    terminate_drain(func.ServiceBusMessage(body=note.to_json().encode()))
    (failed,) = core.publisher.published  # type: ignore[attr-defined]
    assert failed.transition is Transition.DRAIN_FAILED
    assert "DRAIN__ON_FAILURE" in failed.detail and "holding" in failed.detail


def test_the_trigger_is_the_terminate_subscription() -> None:
    app = func.FunctionApp()
    app.register_functions(bp)
    (function,) = app.get_functions()
    trigger = function.get_trigger()
    assert function.get_function_name() == "terminate_drain"
    assert trigger.topic_name == "%NOTIFICATIONS_TOPIC%"
    assert trigger.subscription_name == "terminate"
    assert trigger.connection == "ServiceBusConnection"


def test_the_handler_drains_a_reboot_approves_it_and_undrains_when_it_is_over(
    core: Pipeline, relays: Callable[..., Relays]
) -> None:
    """A policy rule drains a Reboot: the same subscription drains it through the relay,
    approves it through the relay (IMDS starts it), and undrains once it has completed."""
    fleet = relays(count=1)
    event_id = fleet.sim.add_event("Reboot", resources=["web_0"], notice=300)
    note = terminate_note(
        event_id,
        not_before=imds_not_before(fleet.sim, event_id),
        event_type="Reboot",
        rule="drain-reboots",
    )
    assert note.event is not None
    now = datetime.now(UTC)
    vm_id = identity_harness.enroll(core, "web_0", fleet.targets["web_0"])
    core.store.mutate_vm("web_0", lambda _r: VmRecord(name="web_0", vm_id=vm_id, last_seen=now))
    core.store.mutate_event(
        event_id,
        lambda _r: EventRecord(
            event_id=event_id,
            event_type="Reboot",
            event_status="Scheduled",
            event_source="Platform",  # as the simulator's IMDS says: the relay checks
            duration_in_seconds=-1,
            resources=["web_0"],
            not_before=note.event.not_before,
            first_seen=now,
            reporters={"web_0": "Scheduled"},
            decision=note.decision,
            decided_at=now,
            announced=ANNOUNCED,  # its `decided` is out: this handler runs on it
        ),
    )
    terminate_drain(func.ServiceBusMessage(body=note.to_json().encode()))
    assert fleet.runs() == [f"web_0 {event_id}"]
    assert [a.event_id.casefold() for a in fleet.sim.approvals] == [event_id.casefold()]
    assert fleet.sim.event(event_id).status == "Started"  # approved: the reboot begins
    fleet.sim.remove_event(event_id)  # ... and is over
    done = note.model_copy(update={"transition": Transition.COMPLETED})
    terminate_drain(func.ServiceBusMessage(body=done.to_json().encode()))
    # The relay's undrain hook is told the Reboot completed (not that it was cancelled).
    assert fleet.undrains() == [f"web_0 {event_id} Completed"]
    assert core.publisher.transitions(event_id) == [  # type: ignore[attr-defined]
        Transition.DRAIN_STARTED.value,
        Transition.APPROVED.value,
        Transition.UNDRAINED.value,
    ]
    rows = [(r["action"], r["outcome"], r["by"]) for r in core.store.audit_rows(event_id)]
    assert ("undrain", "undrained", "drain") in rows


def _drained_reboot(core: Pipeline, fleet: Relays, vm: str, notice: float) -> Notification:
    """A Reboot of `vm` (scale set web) the policy drains, as ingest leaves it: its row
    decided, the VM enrolled."""
    event_id = fleet.sim.add_event("Reboot", resources=[vm], notice=notice)
    note = terminate_note(
        event_id,
        resources=(vm,),
        not_before=imds_not_before(fleet.sim, event_id),
        event_type="Reboot",
        rule="drain-reboots",
    )
    assert note.event is not None
    now = datetime.now(UTC)
    vm_id = identity_harness.enroll(core, vm, fleet.targets[vm], scale_set="web")
    core.store.mutate_vm(
        vm, lambda _r: VmRecord(name=vm, vm_id=vm_id, last_seen=now, scale_set="web")
    )
    core.store.mutate_event(
        event_id,
        lambda _r: EventRecord(
            event_id=event_id,
            event_type="Reboot",
            event_status="Scheduled",
            event_source="Platform",
            duration_in_seconds=-1,
            resources=[vm],
            not_before=note.event.not_before,
            scale_sets=["web"],
            first_seen=now,
            reporters={vm: "Scheduled"},
            decision=note.decision,
            decided_at=now,
            announced=ANNOUNCED,
        ),
    )
    return note


def test_a_drained_reboot_waits_for_capacity_in_its_scale_set(
    core: Pipeline, relays: Callable[..., Relays]
) -> None:
    """The capacity guard holds for drains as for approvals (1 per set by default): while
    web_0's drained reboot holds the slot, web_1's is neither drained nor approved."""
    fleet = relays(count=2)
    first = _drained_reboot(core, fleet, "web_0", notice=300)
    terminate_drain(func.ServiceBusMessage(body=first.to_json().encode()))
    assert first.event is not None
    assert fleet.runs() == [f"web_0 {first.event.event_id}"]
    # NotBefore 17 s away: 5 s margin and 10 s reserve leave about 2 s to wait for a slot.
    second = _drained_reboot(core, fleet, "web_1", notice=17)
    assert second.event is not None
    terminate_drain(func.ServiceBusMessage(body=second.to_json().encode()))
    assert fleet.runs() == [f"web_0 {first.event.event_id}"]  # web_1 not drained
    approved = {a.event_id.casefold() for a in fleet.sim.approvals}
    assert approved == {first.event.event_id.casefold()}
    transitions = core.publisher.transitions(second.event.event_id)  # type: ignore[attr-defined]
    assert transitions == [Transition.DRAIN_FAILED.value]
    failed = core.publisher.published[-1]  # type: ignore[attr-defined]
    assert "no capacity" in failed.detail
