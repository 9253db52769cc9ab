"""ARM's list acknowledge (issue 32 §2): one call approves several events of one owner.

Held to Azure/azure-rest-api-specs Microsoft.Maintenance stable 2025-11-01 @ bb074ee7a569:
`Maintenance.json` (ScheduledEvents_AcknowledgeList: POST `/subscriptions/{sub}/
resourcegroups/{rg}/providers/Microsoft.Compute/{resourceType}/{resourceName}/providers/
Microsoft.Maintenance/scheduledevents`, body ScheduledEventsIdList `{"value": [ids]}`
(required), 200 ScheduledEventsApproveResponse, default ScheduledEventsListAcknowledgeError
`{"error": {code, message, details: [{target, code, message}]}}`) and its example
`examples/2025-11-01/ScheduledEvents_AcknowledgeList.json` (copied in
tests/conformance/samples/, SOURCES.md there). The simulator (simulator/arm.py) checks the
request as the spec shapes it; the app's approver (functions.approvers.arm.acknowledge_list,
functions.pipeline.approve_arm.arm_phase_many) is tested against it over real HTTP.
"""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import requests
from azure.identity import ManagedIdentityCredential

from functions.approvers.arm import acknowledge_list, list_acknowledge_url
from functions.model.arm import ArmResource
from functions.model.policy import Policy
from functions.pipeline.approve import expect_for
from functions.pipeline.approve_arm import arm_phase_many
from simulator import instance
from tests.agentless.grid import event
from tests.agentless.test_arm_approver import acknowledges, arm, grid, user_event
from tests.functions.conftest import make_pipeline

__all__ = ["arm"]  # the fixture, shared with test_arm_approver

EXAMPLE = json.loads(
    (
        Path(__file__).resolve().parents[1]
        / "conformance"
        / "samples"
        / "ScheduledEvents_AcknowledgeList.2025-11-01.json"
    ).read_text()
)
API_VERSION = EXAMPLE["parameters"]["api-version"]
RECORDED_200 = json.loads(
    (
        Path(__file__).resolve().parents[1]
        / "conformance"
        / "samples"
        / "ScheduledEvents_AcknowledgeList.recorded-200.json"
    ).read_text()
)


def web() -> ArmResource:
    return ArmResource(
        subscription_id=instance.SUBSCRIPTION_ID,
        resource_group=instance.RESOURCE_GROUP,
        resource_type="virtualMachineScaleSets",
        name="web",
    )


def lists(arm_server) -> list:
    return [c for c in arm_server.arm.calls if c.path.endswith("/scheduledevents")]


def test_the_request_is_the_specs_and_approves_every_listed_event(arm) -> None:
    user_event(arm.sim, "EV-L1", ["web_0"])
    user_event(arm.sim, "EV-L2", ["web_1"])
    url = list_acknowledge_url(arm.arm_url, web())
    # The example's parameters fill the path template; its body is the list.
    params = EXAMPLE["parameters"]
    template = list_acknowledge_url(
        "",
        ArmResource(
            subscription_id=params["subscriptionId"],
            resource_group=params["resourceGroupName"],
            resource_type=params["resourceType"],
            name=params["resourceName"],
        ),
    )
    assert template == (
        "/subscriptions/00000000-0000-0000-0000-000000000000/resourcegroups/resource-group1"
        "/providers/Microsoft.Compute/resource-type1/resource-name1/providers/"
        "Microsoft.Maintenance/scheduledevents"
    )
    answer = acknowledge_list(
        web(),
        ["EV-L1", "EV-L2"],
        credential=ManagedIdentityCredential(),
        session=requests.Session(),
        endpoint=arm.arm_url,
        api_version=API_VERSION,
        remaining=10,
    )
    assert answer.verdict == "approved" and answer.status == 200
    # Azure's own text (recorded by azure-powershell), not the spec example's "Successfully
    # Approved": the simulator answers as Azure did.
    assert answer.text == json.loads(RECORDED_200["ResponseBody"])["value"]
    assert answer.approved == ["EV-L1", "EV-L2"]
    for event_id in ("EV-L1", "EV-L2"):
        assert arm.sim.describe_event(event_id)["EventStatus"] == "Started"
    (call,) = lists(arm)
    assert call.path == url.removeprefix(arm.arm_url)


def test_the_simulator_refuses_a_body_the_spec_does_not_allow(arm) -> None:
    token = ManagedIdentityCredential().get_token(arm.arm_url + "/.default").token
    url = list_acknowledge_url(arm.arm_url, web())
    headers = {"Authorization": f"Bearer {token}"}
    for body in (None, {}, {"value": []}, {"value": "EV"}, {"value": [1]}):
        answer = requests.post(
            url, params={"api-version": API_VERSION}, headers=headers, json=body, timeout=5
        )
        assert answer.status_code == 400, body
        assert answer.json()["error"]["code"] == "InvalidRequestContent"
    old = requests.post(
        url,
        params={"api-version": "2023-10-01-preview"},  # the list form came in 2025-10-01-preview
        headers=headers,
        json={"value": ["EV"]},
        timeout=5,
    )
    assert old.status_code == 400 and old.json()["error"]["code"] == "NoRegisteredProviderFound"


def list_call(arm, ids: list[str]):
    return acknowledge_list(
        web(),
        ids,
        credential=ManagedIdentityCredential(),
        session=requests.Session(),
        endpoint=arm.arm_url,
        api_version=API_VERSION,
        remaining=10,
    )


def test_a_list_with_an_event_no_longer_scheduled_approves_none_and_names_it(arm) -> None:
    user_event(arm.sim, "EV-OK", ["web_0"])
    user_event(arm.sim, "EV-RUN", ["web_1"])
    arm.sim.start_event("EV-RUN")
    answer = list_call(arm, ["EV-OK", "EV-RUN", "EV-NONE"])
    assert answer.verdict == "refused" and answer.status == 409
    assert set(answer.refused) == {"EV-RUN", "EV-NONE"} and answer.approved == []
    assert answer.refused["EV-RUN"].startswith("Conflict:")
    assert arm.sim.describe_event("EV-OK")["EventStatus"] == "Scheduled"  # all or none


def test_a_207_approves_the_scheduled_events_and_refuses_the_unknown_ones(arm) -> None:
    """Azure answers a list with events it does not know with 207 MultiStatus (recorded,
    tests/conformance/samples/ScheduledEvents_AcknowledgeList.recorded-207.json): the
    approver reports per event and never takes the unknown ones for approved."""
    user_event(arm.sim, "EV-OK", ["web_0"])
    answer = list_call(arm, ["EV-OK", "EV-NONE"])
    assert answer.verdict == "refused" and answer.status == 207
    assert answer.code == "MultiStatusResponse"
    assert answer.approved == ["EV-OK"]
    assert answer.refused == {"EV-NONE": "NotFound: Scheduled event not found"}
    assert arm.sim.describe_event("EV-OK")["EventStatus"] == "Started"


def test_one_decision_over_several_events_of_a_set_is_one_call(store, clock, arm) -> None:
    pipeline, _pub = make_pipeline(
        store, clock, Policy(dry_run=True), approvers="arm", arm_endpoint=arm.arm_url
    )
    pipeline.credential = ManagedIdentityCredential()
    for event_id, vm in (("EV-B1", "web_0"), ("EV-B2", "web_1"), ("EV-S", "solo")):
        if vm == "solo":
            grid(pipeline, user_event(arm.sim, event_id, [vm]), "virtualMachines", "solo")
        else:
            grid(pipeline, user_event(arm.sim, event_id, [vm]))
    records = [store.get_event(i) for i in ("EV-B1", "EV-B2", "EV-S")]
    assert all(r is not None and r.approval != "approved" for r in records)  # dry run
    stop = clock.now() + timedelta(minutes=5)
    phases = arm_phase_many(pipeline, records, "policy", stop, stop, expect_for)
    assert {i: p.outcome for i, p in phases.items()} == {
        "EV-B1": "approved",
        "EV-B2": "approved",
        "EV-S": "approved",
    }
    assert "2 events in one call" in phases["EV-B1"].detail
    (listed,) = lists(arm)  # the set's two events: one list call
    assert "/virtualMachineScaleSets/web/" in listed.path
    (single,) = acknowledges(arm)  # the lone VM's event: the one-event call
    assert "/virtualMachines/solo/" in single.path
    for event_id in ("EV-B1", "EV-B2", "EV-S"):
        assert arm.sim.describe_event(event_id)["EventStatus"] == "Started"


def test_events_a_list_refuses_by_name_are_final_and_the_others_go_one_by_one(
    store, clock, arm
) -> None:
    pipeline, _pub = make_pipeline(
        store, clock, Policy(dry_run=True), approvers="arm", arm_endpoint=arm.arm_url
    )
    pipeline.credential = ManagedIdentityCredential()
    for event_id, vm in (("EV-C1", "web_0"), ("EV-C2", "web_1")):
        grid(pipeline, user_event(arm.sim, event_id, [vm]))
    arm.sim.start_event("EV-C2")  # Azure started it meanwhile
    records = [store.get_event("EV-C1"), store.get_event("EV-C2")]
    stop = clock.now() + timedelta(minutes=5)
    phases = arm_phase_many(pipeline, records, "policy", stop, stop, expect_for)
    assert phases["EV-C2"].outcome == "exhausted" and "Conflict" in phases["EV-C2"].detail
    assert phases["EV-C1"].outcome == "approved"
    assert [c.status for c in lists(arm)] == [409]
    assert [c.status for c in acknowledges(arm)] == [200]


def test_events_a_207_approved_are_approved_and_not_acknowledged_again(store, clock, arm) -> None:
    pipeline, _pub = make_pipeline(
        store, clock, Policy(dry_run=True), approvers="arm", arm_endpoint=arm.arm_url
    )
    pipeline.credential = ManagedIdentityCredential()
    grid(pipeline, user_event(arm.sim, "EV-P1", ["web_0"]))
    # Known to the app (Event Grid told it) but not to Azure's scheduled events: a 207.
    grid(pipeline, event("EV-GHOST", "Redeploy", resources=("web_1",), source="User"))
    records = [store.get_event("EV-P1"), store.get_event("EV-GHOST")]
    stop = clock.now() + timedelta(minutes=5)
    phases = arm_phase_many(pipeline, records, "policy", stop, stop, expect_for)
    assert [c.status for c in lists(arm)] == [207]
    assert arm.sim.describe_event("EV-P1")["EventStatus"] == "Started"
    assert phases["EV-GHOST"].outcome == "exhausted"
    assert phases["EV-GHOST"].detail == "NotFound: Scheduled event not found"
    assert phases["EV-P1"].outcome == "approved" and phases["EV-P1"].via == "arm"
    assert acknowledges(arm) == []  # not acknowledged again one by one
