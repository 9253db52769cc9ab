"""The simulator's Resource Manager `acknowledge`: every check ARM makes, over real HTTP,
in ARM's error shape, and the answers Azure was recorded giving (the texts, the 404 of an
unknown event, the list form's 207); the control API that sets grants and faults."""

from __future__ import annotations

import base64
import json
import time
from pathlib import Path

import pytest
import requests

from simulator import Simulator, SimulatorServer, instance

SUB, RG = instance.SUBSCRIPTION_ID, instance.RESOURCE_GROUP
V = {"api-version": "2025-11-01"}
# Azure's answers recorded by azure-powershell (tests/conformance/SOURCES.md).
RECORDED = Path(__file__).resolve().parents[1] / "conformance" / "samples"


def recorded(name: str) -> dict:
    return json.loads((RECORDED / name).read_text())


def recorded_body(name: str) -> object:
    return json.loads(recorded(name)["ResponseBody"])


@pytest.fixture
def server():
    sim = Simulator(time_scale=60.0)
    sim.add_vm("solo")
    sim.add_scale_set("web", 2)
    server = SimulatorServer(sim).start()
    try:
        yield server
    finally:
        server.stop()


def token(server, resource="https://management.azure.com/") -> str:
    answer = requests.get(
        f"{server.url}/metadata/identity/oauth2/token",
        params={"api-version": "2018-02-01", "resource": resource},
        headers={"Metadata": "true"},
        timeout=5,
    )
    return answer.json()["access_token"]


def ack_url(server, kind, name, event_id, rg=RG, sub=SUB) -> str:
    return (
        f"{server.arm_url}/subscriptions/{sub}/resourcegroups/{rg}/providers/Microsoft.Compute/"
        f"{kind}/{name}/providers/Microsoft.Maintenance/scheduledevents/{event_id}/acknowledge"
    )


def post(url, bearer=None, params=V, method="POST"):
    headers = {"Authorization": f"Bearer {bearer}"} if bearer else {}
    return requests.request(method, url, params=params, headers=headers, timeout=5)


def control_post(url: str, body: dict) -> requests.Response:
    return requests.post(url, json=body, timeout=5)


def error(response) -> tuple[int, str]:
    return response.status_code, response.json()["error"]["code"]


def test_acknowledge_starts_the_event_for_all_its_resources(server):
    event_id = server.sim.add_event("Reboot", resources=["web_0", "web_1"])
    answer = post(ack_url(server, "virtualMachineScaleSets", "web", event_id), token(server))
    assert answer.status_code == 200 and answer.json() == recorded_body(
        "ScheduledEvents_Acknowledge.recorded-200.json"
    )
    described = server.sim.describe_event(event_id)
    assert described["EventStatus"] == "Started"
    assert described["approved_by"] == ["web_0", "web_1"]
    again = post(ack_url(server, "virtualMachineScaleSets", "web", event_id), token(server))
    assert error(again) == (409, "Conflict")


def test_what_arm_checks_before_anything_else(server):
    event_id = server.sim.add_event("Reboot", resources=["solo"])
    url = ack_url(server, "virtualMachines", "solo", event_id)
    good = token(server)
    assert error(post(url, good, params={})) == (400, "MissingApiVersionParameter")
    assert error(post(url, good, params={"api-version": "2020-01-01"})) == (
        400,
        "NoRegisteredProviderFound",
    )
    assert error(post(url)) == (401, "AuthenticationFailed")
    assert error(post(url, "garbage")) == (401, "InvalidAuthenticationToken")
    assert error(post(url, token(server, "https://vault.azure.net"))) == (
        401,
        "InvalidAuthenticationTokenAudience",
    )
    assert error(post(url, good, method="GET")) == (405, "MethodNotAllowed")
    assert error(post(url.replace("/acknowledge", "/approve"), good)) == (
        404,
        "InvalidResourceType",
    )
    assert error(post(ack_url(server, "disks", "solo", event_id), good)) == (
        404,
        "InvalidResourceType",
    )
    assert error(post(ack_url(server, "virtualMachines", "solo", event_id, rg="x"), good)) == (
        404,
        "ResourceGroupNotFound",
    )
    assert error(post(ack_url(server, "virtualMachines", "nope", event_id), good)) == (
        404,
        "ResourceNotFound",
    )
    assert server.sim.describe_event(event_id)["EventStatus"] == "Scheduled"


def test_an_expired_token_is_refused(server):
    event_id = server.sim.add_event("Reboot", resources=["solo"])
    header, claims, sig = token(server).split(".")
    data = json.loads(base64.urlsafe_b64decode(claims + "=="))
    data["exp"] = int(time.time()) - 1
    stale = base64.urlsafe_b64encode(json.dumps(data).encode()).rstrip(b"=").decode()
    answer = post(ack_url(server, "virtualMachines", "solo", event_id), f"{header}.{stale}.{sig}")
    assert error(answer) == (401, "ExpiredAuthenticationToken")


def test_the_resource_must_own_the_event(server):
    """An event the resource does not have is answered as Azure answered one it did not
    know: 404 with the Maintenance provider's capitalised keys, as recorded."""
    entry = recorded("ScheduledEvents_Acknowledge.recorded-404.json")
    on_set = server.sim.add_event("Reboot", resources=["web_1"])
    answer = post(ack_url(server, "virtualMachines", "solo", on_set), token(server))
    assert answer.status_code == 404 == entry["StatusCode"]
    assert answer.json() == json.loads(entry["ResponseBody"])
    unknown_id = entry["RequestUri"].split("/")[-2]  # the recorded GUID, unknown here too
    unknown = post(ack_url(server, "virtualMachines", "solo", unknown_id), token(server))
    assert unknown.status_code == 404 and unknown.json() == json.loads(entry["ResponseBody"])
    assert [c.code for c in server.arm.calls][-2:] == ["InvalidScheduledEventId"] * 2


def list_url(server, kind, name) -> str:
    return (
        f"{server.arm_url}/subscriptions/{SUB}/resourcegroups/{RG}/providers/Microsoft.Compute/"
        f"{kind}/{name}/providers/Microsoft.Maintenance/scheduledevents"
    )


def post_list(server, ids) -> requests.Response:
    return requests.post(
        list_url(server, "virtualMachineScaleSets", "web"),
        params=V,
        headers={"Authorization": f"Bearer {token(server)}"},
        json={"value": ids},
        timeout=5,
    )


def test_the_list_form_takes_the_specs_request_and_refuses_what_it_does_not_allow(server):
    """Held to the spec's ScheduledEvents_AcknowledgeList (azure-rest-api-specs
    Microsoft.Maintenance stable 2025-11-01 Maintenance.json and its example, both @
    bb074ee7, the example copied in tests/conformance/samples/): body ScheduledEventsIdList
    `{"value": [ids]}`, required. (The app does not make this call; the simulator plays
    Azure's surface.)"""
    example = json.loads((RECORDED / "ScheduledEvents_AcknowledgeList.2025-11-01.json").read_text())
    params = example["parameters"]
    ids = [server.sim.add_event("Reboot", resources=[f"web_{i}"]) for i in (0, 1)]
    assert len(ids) == len(params["scheduledEventsIdList"]["value"])
    url = list_url(server, "virtualMachineScaleSets", "web")
    headers = {"Authorization": f"Bearer {token(server)}"}
    version = {"api-version": params["api-version"]}
    for body in (None, {}, {"value": []}, {"value": "EV"}, {"value": [1]}):
        answer = requests.post(url, params=version, headers=headers, json=body, timeout=5)
        assert error(answer) == (400, "InvalidRequestContent"), body
    old = requests.post(
        url,
        params={"api-version": "2023-10-01-preview"},  # the list form came in 2025-10-01-preview
        headers=headers,
        json={"value": ids},
        timeout=5,
    )
    assert error(old) == (400, "NoRegisteredProviderFound")
    answer = requests.post(url, params=version, headers=headers, json={"value": ids}, timeout=5)
    assert answer.status_code == 200
    assert all(server.sim.describe_event(i)["EventStatus"] == "Started" for i in ids)


def test_the_list_form_answers_as_azure_was_recorded(server):
    ok = [server.sim.add_event("Reboot", resources=[f"web_{i}"]) for i in (0, 1)]
    answer = post_list(server, ok)
    assert answer.status_code == 200
    assert answer.json() == recorded_body("ScheduledEvents_AcknowledgeList.recorded-200.json")
    entry = recorded("ScheduledEvents_AcknowledgeList.recorded-207.json")
    unknown = json.loads(entry["RequestBody"])["value"]  # the recorded GUIDs, unknown here
    answer = post_list(server, unknown)
    assert answer.status_code == 207 == entry["StatusCode"]
    assert answer.json() == json.loads(entry["ResponseBody"])


def test_a_list_with_unknown_events_approves_the_scheduled_ones_in_a_207(server):
    good = server.sim.add_event("Reboot", resources=["web_0"])
    answer = post_list(server, ["NOPE", good])
    assert answer.status_code == 207
    error = answer.json()["error"]
    assert error["code"] == "MultiStatusResponse"
    assert error["details"] == [
        {"target": "NOPE", "code": "NotFound", "message": "Scheduled event not found"},
        {"target": good, "code": "OK", "message": "Successfully approved scheduled event"},
    ]
    assert server.sim.describe_event(good)["EventStatus"] == "Started"


def test_a_list_with_an_event_no_longer_scheduled_approves_none(server):
    good = server.sim.add_event("Reboot", resources=["web_0"])
    started = server.sim.add_event("Reboot", resources=["web_1"])
    server.sim.start_event(started)
    answer = post_list(server, [good, started, "NOPE"])
    assert error(answer) == (409, "Conflict")
    assert [(d["target"], d["code"]) for d in answer.json()["error"]["details"]] == [
        (started, "Conflict"),
        ("NOPE", "NotFound"),
    ]
    assert server.sim.describe_event(good)["EventStatus"] == "Scheduled"


def test_grants_and_faults_through_the_control_api(server):
    event_id = server.sim.add_event("Reboot", resources=["solo"])
    bearer = token(server)
    principal = json.loads(base64.urlsafe_b64decode(bearer.split(".")[1] + "=="))["appid"]
    group = f"/subscriptions/{SUB}/resourceGroups/{RG}"
    elsewhere = f"{group}/providers/Microsoft.Compute/virtualMachines/other"
    control = f"{server.url}/_sim/arm"
    grant = control_post(f"{control}/grants", {"principal": principal, "scope": elsewhere})
    assert grant.status_code == 200
    refused = post(ack_url(server, "virtualMachines", "solo", event_id), bearer)
    assert error(refused) == (403, "AuthorizationFailed")
    assert "scheduledevents/acknowledge/action" in refused.json()["error"]["message"]
    control_post(f"{control}/grants", {"principal": principal, "scope": group})
    fault = control_post(f"{control}/faults", {"status": 429, "count": 1, "retry_after": 7})
    assert fault.status_code == 200
    throttled = post(ack_url(server, "virtualMachines", "solo", event_id), bearer)
    assert error(throttled) == (429, "TooManyRequests")
    assert throttled.headers["Retry-After"] == "7"
    assert post(ack_url(server, "virtualMachines", "solo", event_id), bearer).status_code == 200
    calls = requests.get(control, timeout=5).json()["calls"]
    assert [c["status"] for c in calls] == [403, 429, 200]
    bad = control_post(f"{control}/faults", {"status": 404})
    assert bad.status_code == 400
