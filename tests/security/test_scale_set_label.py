"""The HTTP drain request names each instance's scale set from Azure's facts (issue 32).

The request's `instances[].scale_set` tells the customer's drain hook which pool to take a
VM out of. It used to be the first of the event's sets whose name prefixes the VM's: with
sets `app` and `app_x`, `app_x_5` (instance 5 of `app_x`) went to the hook as `app`'s, so
the hook drained the wrong pool's entry. Now the VM row's scale set (Resource Graph's,
through functions.terminate.wiring) decides; without a row, the longest matching set name.
The drain hook receiver is a real loopback HTTP server; the VM rows are on Azurite.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest
from azure.data.tables import TableServiceClient

from functions.clock import SystemClock
from functions.model.event import EventSnapshot
from functions.store.drains import DrainStore
from functions.store.records import VmRecord
from functions.store.state import Store
from functions.terminate.steps import drain_request, http_drain, instance_scale_set
from functions.terminate.wiring import pipeline_context
from tests.functions.conftest import make_pipeline
from tests.notify.receiver import Answer, running


def _event(resources: tuple[str, ...], sets: tuple[str, ...]) -> EventSnapshot:
    return EventSnapshot(
        event_id=str(uuid.uuid4()).upper(),
        event_type="Terminate",
        event_status="Scheduled",
        event_source="User",
        resources=resources,
        not_before=datetime.now(UTC) + timedelta(minutes=5),
        scale_sets=sets,
    )


def _labels(body: dict) -> dict[str, str | None]:
    return {item["name"]: item["scale_set"] for item in body["instances"]}


@pytest.mark.parametrize("sets", [("app", "app_x"), ("app_x", "app")])
def test_without_facts_the_longest_matching_set_name_wins(sets):
    event = _event(("app_x_5", "app_7"), sets)
    body = drain_request(event, datetime.now(UTC), 10.0)
    assert _labels(body) == {"app_x_5": "app_x", "app_7": "app"}


def test_azures_fact_decides_over_the_name():
    # A VM the app knows: its row's set, whatever its name looks like; "" = in no set.
    assert instance_scale_set("app_x_5", ("app", "app_x"), "app_x") == "app_x"
    assert instance_scale_set("app_x_5", ("app", "app_x"), "app") == "app"
    assert instance_scale_set("app_x_5", ("app", "app_x"), "") is None
    assert instance_scale_set("APP_X_5", ("app", "app_x"), None) == "app_x"
    assert instance_scale_set("db1", ("app",), None) is None


@pytest.mark.azurite
def test_the_drain_hook_gets_the_vm_rows_scale_set(azurite: str) -> None:
    store = Store.from_connection_string(azurite, "t" + uuid.uuid4().hex[:12]).ensure_tables()
    for name, scale_set in (("app_x_5", "app_x"), ("app_7", "app")):
        store.mutate_vm(name, lambda _r, n=name, s=scale_set: VmRecord(name=n, scale_set=s))
    pipeline, _ = make_pipeline(store, SystemClock())
    service = TableServiceClient.from_connection_string(azurite)
    drains = DrainStore.from_service(service, "d" + uuid.uuid4().hex[:12]).ensure_table()
    ctx = pipeline_context(pipeline, drains)
    assert ctx.scale_set_of is not None
    assert ctx.scale_set_of("app_x_5") == "app_x"
    assert ctx.scale_set_of("unknown_1") is None
    # `unknown_1` has no row: labelled by the longest matching name.
    event = _event(("app_x_5", "app_7", "app_x_y_1"), ("app", "app_x"))
    clock = SystemClock()
    with running(Answer(200)) as hook:
        ok, detail, _ = http_drain(
            ctx.session,
            hook.url,
            event,
            clock.now() + timedelta(seconds=10),
            clock.now,
            clock.sleep,
            scale_set_of=ctx.scale_set_of,
        )
        (request,) = hook.requests
    assert ok, detail
    assert _labels(request.json()) == {"app_x_5": "app_x", "app_7": "app", "app_x_y_1": "app_x"}
