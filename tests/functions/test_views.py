"""Each VM's view of a shared event is stored beside the event (its reporter row, the
write it makes anyway) and decides for that VM; differing views are recorded on the event
row and in the announcement, against Azurite."""

from __future__ import annotations

from functions.pipeline.ingest import ingest_message
from functions.pipeline.views import own_decision
from functions.store.events import REPORTER
from functions.store.keys import row_key
from tests.functions.conftest import envelope, event, make_pipeline

SET = "as-1"


def freeze(duration: int, resources: tuple[str, ...] = ("victim", "mate")) -> dict:
    return event("EV-F", "Freeze", resources=resources, duration=duration)


def send(pipeline, vm: str, sequence: int, events: list[dict]) -> str:
    return ingest_message(envelope(vm, sequence, events, availability_set=SET), pipeline).outcome


def test_each_vm_is_decided_on_its_own_view_whoever_reported_first(store, clock):
    """The low finding: a set-mate reports the shared Freeze first with a duration the
    policy holds; the victim's genuine report (5 s: approve) is decided on its own view.
    The event records that the views differ and follows the stricter decision."""
    pipeline, publisher = make_pipeline(store, clock)
    assert send(pipeline, "mate", 1, [freeze(60)]) == "processed"
    assert send(pipeline, "victim", 1, [freeze(5)]) == "processed"

    record = store.get_event("EV-F")
    assert record.views_differ == ["DurationInSeconds"]
    assert record.decision.action == "hold"
    reporters = {r.vm: r for r in store.reporter_rows("EV-F")}
    victim, mate = reporters["victim"], reporters["mate"]
    assert own_decision(record, victim.key, victim.decision).action == "approve"
    assert own_decision(record, mate.key, mate.decision).action == "hold"
    assert store.view_for("EV-F", "victim").duration_s == 5
    assert store.view_for("EV-F", "mate").duration_s == 60
    assert store.view_for("EV-F", "victim").expect()["Resources"] == ["mate", "victim"]
    # The decision did not change (hold stays hold): announced once.
    assert publisher.transitions("EV-F") == ["scheduled", "decided"]


def test_a_stricter_view_is_announced_with_the_fields_that_differ(store, clock):
    pipeline, publisher = make_pipeline(store, clock)
    send(pipeline, "mate", 1, [freeze(5)])  # forged short: approve
    send(pipeline, "victim", 1, [freeze(60)])  # genuine: hold

    record = store.get_event("EV-F")
    assert record.decision.action == "hold" and record.approval != "approved"
    decided = [n for n in publisher.published if n.transition.value == "decided"]
    assert [n.decision.action for n in decided] == ["approve", "hold"]
    assert decided[-1].event.views_differ == ("DurationInSeconds",)
    assert "views differ (DurationInSeconds)" in decided[-1].decision.reason
    assert decided[0].message_id() != decided[-1].message_id()


def test_a_set_that_agrees_keeps_one_view_and_rewrites_no_reporter_row(store, clock):
    pipeline, publisher = make_pipeline(store, clock)
    names = ("a", "b", "c")
    for vm in names:
        send(pipeline, vm, 1, [freeze(5, names)])
    record = store.get_event("EV-F")
    assert len(record.views) == 1 and record.views_differ == []
    assert publisher.transitions("EV-F") == ["scheduled", "decided"]
    stamps = {
        vm: store.events.get_entity(row_key("EV-F"), REPORTER + row_key(vm))["at"] for vm in names
    }
    clock.advance(5)
    for vm in names:  # the same document again: the view and status are unchanged
        send(pipeline, vm, 2, [freeze(5, names)])
    again = {
        vm: store.events.get_entity(row_key("EV-F"), REPORTER + row_key(vm))["at"] for vm in names
    }
    assert again == stamps


def test_a_vm_that_stops_reporting_keeps_no_view_to_approve_with(store, clock):
    pipeline, _ = make_pipeline(store, clock)
    send(pipeline, "victim", 1, [freeze(5)])
    send(pipeline, "mate", 1, [freeze(5)])
    send(pipeline, "mate", 2, [])
    assert store.view_for("EV-F", "mate") is None
    assert store.view_for("EV-F", "victim") is not None
    assert store.view_for("EV-F", "stranger") is None


def test_the_fleet_page_and_the_status_api_show_the_differing_views(store, clock):
    from functions.web.views import fleet_status
    from tests.web.server import serve
    from tests.web.test_pages import PAGES_ON, get, principal

    pipeline, _ = make_pipeline(store, clock, **PAGES_ON)
    send(pipeline, "mate", 1, [freeze(60)])
    send(pipeline, "victim", 1, [freeze(5)])
    (shown,) = fleet_status(pipeline, include_ended=False)["events"]
    assert shown["views_differ"] == ["DurationInSeconds"]
    assert {v["first_vm"]: v["action"] for v in shown["views"]} == {
        "mate": "hold",
        "victim": "approve",
    }
    with serve(pipeline) as url:
        fleet = get(f"{url}/api/pages/fleet", headers=principal())
        page = get(f"{url}/api/pages/events/EV-F", headers=principal())
    expected = "views differ (DurationInSeconds): mate: hold; victim: approve"
    assert fleet.status_code == 200 and expected in fleet.text
    assert page.status_code == 200 and expected in page.text
