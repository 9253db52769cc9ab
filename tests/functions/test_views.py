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
    # The decision stands (hold was the stricter); that the views differ is announced once.
    assert publisher.transitions("EV-F") == ["scheduled", "decided", "decided"]
    last = publisher.published[-1]
    assert last.event.views_differ == ("DurationInSeconds",)
    assert last.decision.action == "hold" and "views differ" in last.decision.reason


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


def user_redeploy(resources: tuple[str, ...], duration: int = -1) -> dict:
    return event("EV-U", "Redeploy", resources=resources, source="User", duration=duration)


def test_the_relay_is_sent_its_own_vms_view_to_confirm(store, clock, relay):
    pipeline, _ = make_pipeline(store, clock)
    body = envelope("victim", 1, [user_redeploy(("victim",))], callback_url=relay.url)
    assert ingest_message(body, pipeline).outcome == "processed"
    (request,) = relay.requests
    assert request["EventIds"] == ["EV-U"]
    own = store.view_for("EV-U", "victim")
    assert request["Expect"]["EV-U"]["Resources"] == own.expect()["Resources"] == ["victim"]
    assert request["Expect"]["EV-U"]["EventSource"] == "User"
    assert store.get_event("EV-U").approval == "approved"


def test_a_vm_whose_own_view_is_stricter_than_the_event_is_not_asked(store, clock, relay):
    """Every view kept approves, but this VM's own view came beyond MAX_VIEWS and its
    reporter row keeps a hold decided for it alone (as after a race): the policy's
    approval does not ask its relay; a person's approval may."""
    from functions.model.event import Decision
    from functions.model.view import VmView
    from functions.pipeline.approve import approve_event
    from functions.store.records import MAX_VIEWS

    pipeline, _ = make_pipeline(store, clock)
    names = tuple(f"vm{i}" for i in range(MAX_VIEWS))
    for n, vm in enumerate(names):  # each its own approving view (durations differ)
        send(pipeline, vm, 1, [user_redeploy((*names, "victim"), duration=n)])
    body = envelope("victim", 1, [], callback_url=relay.url, availability_set=SET)
    ingest_message(body, pipeline)  # the victim's relay is known and fresh
    record = store.get_event("EV-U")
    assert record.decision.action == "approve" and len(record.views) == MAX_VIEWS
    held = Decision(action="hold", rule="default-hold")
    view = VmView(vm="victim", event_type="Redeploy", event_source="Platform")
    store.set_reporter(
        "EV-U", "victim", "Scheduled", clock.now(), view=view, key="k", decision=held
    )
    result = approve_event("EV-U", pipeline)
    assert relay.requests == [] and result.outcome in ("failed", "retry_later"), result
    manual = approve_event("EV-U", pipeline, by="manual:test")
    assert manual.outcome == "approved" and relay.starts() == ["EV-U"]
    assert relay.requests[0]["Expect"]["EV-U"]["EventSource"] == "Platform"
