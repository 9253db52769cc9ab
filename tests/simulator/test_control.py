"""The /_sim control API that the demo and other tests drive the simulator with."""

from __future__ import annotations

import pytest
import requests

from simulator import SimulatorServer

HEADERS = {"Metadata": "true"}
V = {"api-version": "2020-07-01"}


def call(method: str, url: str, **kwargs: object) -> requests.Response:
    return requests.request(method, url, timeout=5, **kwargs)  # type: ignore[arg-type]


def control(server: SimulatorServer, method: str, path: str, **kwargs: object) -> dict:
    response = call(method, f"{server.url}/_sim{path}", **kwargs)
    assert response.status_code == 200, response.text
    return response.json()


def document(url: str) -> dict:
    response = call("GET", f"{url}/metadata/scheduledevents", headers=HEADERS, params=V)
    assert response.status_code == 200
    return response.json()


def test_state_lists_vms_urls_and_settings(simulator: SimulatorServer) -> None:
    simulator.sim.add_vm("vm0")
    state = control(simulator, "GET", "/state")
    assert state["time_scale"] == 60.0 and state["approval_mode"] == "any"
    assert state["url"] == simulator.url and state["root_vm"] == "vm0"
    assert state["vm_urls"] == {"vm0": f"{simulator.url}/vm/vm0"}
    assert state["vms"]["vm0"]["document"] == {"DocumentIncarnation": 1, "Events": []}
    again = control(simulator, "GET", "")
    assert {**again, "now": None} == {**state, "now": None}


def test_add_event_with_imds_names(simulator: SimulatorServer) -> None:
    simulator.sim.add_vm("vm0")
    created = control(
        simulator,
        "POST",
        "/events",
        json={
            "EventType": "Freeze",
            "Resources": ["vm0"],
            "EventSource": "Platform",
            "DurationInSeconds": 7,
            "Description": "rehearsal",
            "notice": 600,
            "impact": 60,
        },
    )
    (event,) = document(simulator.vm_url("vm0"))["Events"]
    assert event["EventId"] == created["EventId"] == created["EventIds"][0]
    assert (event["DurationInSeconds"], event["Description"]) == (7, "rehearsal")
    described = control(simulator, "GET", f"/events/{created['EventId']}")
    assert described["EventStatus"] == "Scheduled" and described["seen_by"] == ["vm0"]


def test_add_event_with_python_names_and_target(simulator: SimulatorServer) -> None:
    simulator.sim.add_availability_set("as1", ["a", "b"])
    created = control(
        simulator,
        "POST",
        "/events",
        json={"event_type": "Reboot", "target": "as1", "source": "User", "status": "Started"},
    )
    (event,) = document(simulator.vm_url("b"))["Events"]
    assert event["EventId"] == created["EventId"]
    assert event["Resources"] == ["a", "b"] and event["EventStatus"] == "Started"


@pytest.mark.parametrize(
    ("body", "status"),
    [
        ({"EventType": "Freeze", "Resources": ["ghost"]}, 404),
        ({"EventType": "Freeze", "Resourcs": ["myVM"]}, 400),
        ({"EventType": "Freeze", "EventStatus": "Done"}, 400),
        ({"Resources": ["myVM"]}, 400),
        ({"EventType": "Freeze", "notice": -5}, 400),
        ({"scenario": "live-migration", "EventType": "Reboot"}, 400),
        ({"EventType": "Freeze", "Resources": ["myVM"], "target": "myVM"}, 400),
    ],
)
def test_bad_events_are_refused_with_a_reason(
    simulator: SimulatorServer, body: dict, status: int
) -> None:
    response = call("POST", f"{simulator.url}/_sim/events", json=body)
    assert response.status_code == status
    assert response.json()["error"]
    assert document(simulator.url)["Events"] == []


def test_start_cancel_delete(simulator: SimulatorServer) -> None:
    first = control(simulator, "POST", "/events", json={"EventType": "Reboot"})["EventId"]
    started = control(simulator, "POST", f"/events/{first}/start")
    assert started["EventStatus"] == "Started"
    assert document(simulator.url)["Events"][0]["NotBefore"] == ""
    response = call("POST", f"{simulator.url}/_sim/events/{first}/cancel")
    assert response.status_code == 400 and "Scheduled" in response.json()["error"]
    removed = control(simulator, "DELETE", f"/events/{first}")
    assert removed["active"] is False and removed["end_reason"] == "removed"
    second = control(simulator, "POST", "/events", json={"EventType": "Freeze"})["EventId"]
    cancelled = control(simulator, "POST", f"/events/{second}/cancel")
    assert cancelled["end_reason"] == "cancelled"
    assert document(simulator.url)["Events"] == []
    for method, path in (
        ("POST", f"/events/{second}/start"),
        ("DELETE", f"/events/{second}"),
        ("POST", "/events/NOPE/start"),
        ("GET", "/events/NOPE"),
    ):
        response = call(method, f"{simulator.url}/_sim{path}")
        assert response.status_code == 404, path
    assert len(control(simulator, "GET", "/events")["events"]) == 2


def test_scenarios(simulator: SimulatorServer) -> None:
    listed = control(simulator, "GET", "/scenarios")["scenarios"]
    assert "live-migration" in listed and "hardware-failure" in listed
    simulator.sim.add_scale_set("web", 2)
    ids = control(simulator, "POST", "/scenarios", json={"name": "terminate", "target": "web"})
    (event,) = document(simulator.vm_url("web_0"))["Events"]
    assert ids["EventIds"] == [event["EventId"]] and event["Resources"] == ["web_1"]
    assert call("POST", f"{simulator.url}/_sim/scenarios", json={}).status_code == 400
    bad = call("POST", f"{simulator.url}/_sim/scenarios", json={"name": "meteor"})
    assert bad.status_code == 400 and "unknown scenario" in bad.json()["error"]
    nowhere = call(
        "POST", f"{simulator.url}/_sim/scenarios", json={"name": "preempt", "target": "web_0"}
    )
    assert nowhere.status_code == 400 and "Spot" in nowhere.json()["error"]
    extra = call("POST", f"{simulator.url}/_sim/scenarios", json={"name": "x", "when": 1})
    assert extra.status_code == 400


def test_scenario_with_an_offset_is_scheduled(simulator: SimulatorServer) -> None:
    answer = control(simulator, "POST", "/scenarios", json={"name": "live-migration", "at": 600})
    assert answer == {"EventIds": [], "scheduled_in": 600.0}
    state = control(simulator, "GET", "/state")
    assert len(state["pending"]) == 1 and state["pending"][0]["scenario"] == "live-migration"
    assert document(simulator.url)["Events"] == []


def test_faults_over_the_control_api(simulator: SimulatorServer) -> None:
    simulator.sim.add_vm("a")
    fault = control(
        simulator, "POST", "/faults", json={"kind": "status", "vm": "a", "status": 503, "count": 2}
    )
    assert fault["FaultId"] >= 1
    assert control(simulator, "GET", "/faults")["faults"][0]["status"] == 503
    url = f"{simulator.vm_url('a')}/metadata/scheduledevents"
    assert call("GET", url, headers=HEADERS, params=V).status_code == 503
    control(simulator, "POST", "/faults", json={"kind": "status", "count": None})
    assert control(simulator, "DELETE", "/faults") == {"cleared": 2}
    assert call("GET", url, headers=HEADERS, params=V).status_code == 200


@pytest.mark.parametrize(
    ("body", "status"),
    [
        ({}, 400),
        ({"kind": "explode"}, 400),
        ({"kind": "status", "status": 200}, 400),
        ({"kind": "slow", "seconds": -1}, 400),
        ({"kind": "status", "count": 0}, 400),
        ({"kind": "status", "colour": "red"}, 400),
        ({"kind": "status", "vm": "ghost"}, 404),
    ],
)
def test_bad_faults_are_refused(simulator: SimulatorServer, body: dict, status: int) -> None:
    response = call("POST", f"{simulator.url}/_sim/faults", json=body)
    assert response.status_code == status, response.text
    assert response.json()["error"]
    assert simulator.sim.faults == []


def test_approvals_are_listed(simulator: SimulatorServer) -> None:
    eid = simulator.sim.add_event("Freeze", ["myVM"])
    response = call(
        "POST",
        f"{simulator.url}/metadata/scheduledevents",
        headers=HEADERS,
        params=V,
        json={"StartRequests": [{"EventId": eid}]},
    )
    assert response.status_code == 200
    (approval,) = control(simulator, "GET", "/approvals")["approvals"]
    assert approval["vm"] == "myVM" and approval["event_id"] == eid and approval["counted"]
    assert approval["at"].endswith("Z")


def test_vms_can_be_added_at_runtime(simulator: SimulatorServer) -> None:
    added = control(simulator, "POST", "/vms", json={"name": "late", "availability_set": "as9"})
    assert added == {"name": "late", "url": f"{simulator.url}/vm/late"}
    assert document(added["url"]) == {"DocumentIncarnation": 1, "Events": []}
    assert "late" in control(simulator, "GET", "/vms")["vms"]
    dup = call("POST", f"{simulator.url}/_sim/vms", json={"name": "late"})
    assert dup.status_code == 400
    assert call("POST", f"{simulator.url}/_sim/vms", json={"nom": "x"}).status_code == 400


def test_bad_control_calls(simulator: SimulatorServer) -> None:
    base = f"{simulator.url}/_sim"
    assert call("GET", f"{base}/nothing").status_code == 404
    assert call("PUT", f"{base}/state").status_code == 405
    assert call("DELETE", f"{base}/approvals").status_code == 405
    not_json = call("POST", f"{base}/events", data=b"{nope")
    assert not_json.status_code == 400 and "JSON" in not_json.json()["error"]
    assert call("POST", f"{base}/events", json=[1, 2]).status_code == 400
