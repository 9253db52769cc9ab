"""`Expect` carries the whole view the app decided on; the relay compares it with its IMDS.

Over real HTTP against the simulator's IMDS, with the wire form the app really sends
(functions/model/view.py `VmView.expect()`): NotBefore in ISO 8601 UTC while IMDS writes
RFC 1123, Resources sorted and casefolded while IMDS keeps Azure's casing.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from functions.model.envelope import parse_not_before
from functions.model.view import VmView, normalise_resources
from relay.callback import CallbackApp, CallbackServer
from relay.imds import ImdsClient
from tests.relay.conftest import VM0_ID, FixedKeys
from tests.relay.test_callback import freeze, post, refused


@pytest.fixture
def relay(simulator: Any) -> Iterator[Any]:
    """vm0's relay; vm1 is its set-mate."""
    simulator.sim.add_vm("vm0", availability_set="as1")
    simulator.sim.add_vm("vm1", availability_set="as1")
    app = CallbackApp(FixedKeys(), VM0_ID, "vm0", ImdsClient(simulator.vm_url("vm0"), timeout=1.0))
    server = CallbackServer("127.0.0.1:0", app, poll_interval=0.05).start()
    try:
        yield server
    finally:
        server.stop()


def imds(sim: Any, event_id: str, vm: str = "vm0") -> dict[str, Any]:
    return next(e for e in sim.document(vm)["Events"] if e["EventId"] == event_id)


def view_of(entry: dict[str, Any], vm: str = "vm0", **changes: Any) -> dict[str, Any]:
    """The app's `Expect` entry for what IMDS shows (then `changes`), as the app builds it."""
    view = VmView(
        vm=vm,
        event_type=entry["EventType"],
        event_source=entry.get("EventSource"),
        duration_s=entry.get("DurationInSeconds"),
        not_before=parse_not_before(entry.get("NotBefore")),
        resources=normalise_resources(entry["Resources"]),
    )
    return {**view.expect(), **changes}


def test_the_full_view_as_imds_shows_it_is_approved(simulator: Any, relay: Any) -> None:
    sim = simulator.sim
    event_id = sim.add_event("Freeze", resources=["VM0", "vm1"], duration=5, notice=3600)
    entry = imds(sim, event_id)
    assert "GMT" in entry["NotBefore"]  # IMDS writes RFC 1123; the app sends ISO 8601
    expect = view_of(entry)
    assert expect["NotBefore"].endswith("Z") and expect["Resources"] == ["vm0", "vm1"]
    response = post(relay, {"EventIds": [event_id], "Expect": {event_id: expect}})
    assert response.status_code == 200, response.text
    assert [a.event_id for a in sim.approvals] == [event_id]


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"DurationInSeconds": 5}, "DurationInSeconds 5 expected, IMDS says 30"),
        ({"DurationInSeconds": None}, "DurationInSeconds none expected, IMDS says 30"),
        ({"Resources": ["vm0", "vm1"]}, "Resources differ (not named here: vm1)"),
        ({"Resources": []}, "Resources differ (also named here: vm0)"),
        ({"EventType": "Reboot"}, "EventType 'Reboot' expected, IMDS says 'Freeze'"),
        ({"EventSource": "User"}, "EventSource 'User' expected, IMDS says 'Platform'"),
        ({"NotBefore": ""}, "NotBefore '' expected, IMDS says '"),
    ],
)
def test_each_field_that_differs_refuses_with_409_naming_it(
    simulator: Any, relay: Any, change: dict[str, Any], named: str
) -> None:
    sim = simulator.sim
    event_id = sim.add_event("Freeze", resources=["vm0"], duration=30, notice=3600)
    expect = view_of(imds(sim, event_id), **change)
    response = post(relay, {"EventIds": [event_id], "Expect": {event_id: expect}})
    assert response.status_code == 409, response.text
    assert response.json()["results"] == {event_id: "differs"}
    assert named in response.json()["error"], response.json()
    assert sim.approvals == []
    assert imds(sim, event_id)["EventStatus"] == "Scheduled"


def test_not_before_is_compared_as_an_instant(simulator: Any, relay: Any) -> None:
    sim = simulator.sim
    event_id = freeze(sim)
    entry = imds(sim, event_id)
    moment = parse_not_before(entry["NotBefore"])
    moved = (moment + timedelta(minutes=5)).strftime("%Y-%m-%dT%H:%M:%SZ")
    response = post(
        relay, {"EventIds": [event_id], "Expect": {event_id: view_of(entry, NotBefore=moved)}}
    )
    assert response.status_code == 409 and f"NotBefore '{moved}' expected" in response.text
    # The same instant in another spelling (an offset) agrees.
    same = moment.astimezone(datetime.now(UTC).astimezone().tzinfo).isoformat()
    again = post(
        relay, {"EventIds": [event_id], "Expect": {event_id: view_of(entry, NotBefore=same)}}
    )
    assert again.status_code == 200, again.text


def test_an_old_apps_two_field_expect_is_still_served(simulator: Any, relay: Any) -> None:
    sim = simulator.sim
    event_id = freeze(sim)
    expect = {event_id: {"EventType": "Freeze", "EventSource": "Platform"}}
    response = post(relay, {"EventIds": [event_id], "Expect": expect})
    assert response.status_code == 200, response.text


@pytest.mark.parametrize(
    "entry",
    [
        {"DurationInSeconds": "5"},
        {"DurationInSeconds": True},
        {"NotBefore": 5},
        {"NotBefore": "next tuesday"},
        {"Resources": "vm0"},
        {"Resources": [1]},
        {"Resources": ["x" * 129]},
    ],
)
def test_a_malformed_view_is_a_400(simulator: Any, relay: Any, entry: dict[str, Any]) -> None:
    event_id = freeze(simulator.sim)
    response = post(relay, {"EventIds": [event_id], "Expect": {event_id: entry}})
    refused(simulator.sim, response, 400, "Expect")
