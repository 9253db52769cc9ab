"""The ARM approver against what Azure really answered: azure-powershell's recorded sessions.

Microsoft's azure-powershell records its Maintenance scenario tests against live Azure
(tests/conformance/SOURCES.md: repository, path, commit, recording date). Each sample here
is one recorded entry: the request, the status and the body exactly as recorded. A loopback
server answers that status with those bytes, and `functions.approvers.arm` must read it as
Azure means it: the 200 texts, the list form's 207 MultiStatus (per event, in both shapes
Azure was seen to answer, nothing approved that Azure did not approve), the Maintenance
provider's 404 with capitalised keys, and Resource Manager's own 404 for a missing VM.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
import requests

from functions.approvers.arm import ArmAnswer, acknowledge, acknowledge_list
from functions.model.arm import ArmResource
from tests.conformance.imds_server import serve

SAMPLES = Path(__file__).with_name("samples")
NOT_FOUND = "NotFound: Scheduled event not found"


def recorded(name: str) -> dict[str, Any]:
    return json.loads((SAMPLES / name).read_text())


class Token:
    def get_token(self, *scopes: str, **kwargs: object) -> object:
        return SimpleNamespace(token="t0k3n", expires_on=4102444800)


def owner_of(path: str) -> ArmResource:
    """The owner a recorded request names, spelled as recorded."""
    parts = path.split("/")
    return ArmResource(
        subscription_id=parts[2],
        resource_group=parts[4],
        resource_type=parts[7],
        name=parts[8],
    )


def replay(entry: dict[str, Any], *, body: bytes | None = None) -> tuple[ArmAnswer, list[str], Any]:
    """Serve the recorded answer (status, exact body, recorded headers but Content-Length)
    where it was recorded, make the app's call there, and return its answer, the ids it
    sent and what the server saw."""
    uri = urlsplit(entry["RequestUri"])
    headers = {k: v[0] for k, v in entry["ResponseHeaders"].items() if k != "Content-Length"}
    data = entry["ResponseBody"].encode() if body is None else body
    api_version = parse_qs(uri.query)["api-version"][0]
    owner = owner_of(uri.path)
    with serve({uri.path: (entry["StatusCode"], data, headers)}) as (url, answers):
        common = dict(
            credential=Token(),
            session=requests.Session(),
            endpoint=url,
            api_version=api_version,
            remaining=5.0,
        )
        if entry["RequestBody"]:
            ids = json.loads(entry["RequestBody"])["value"]
            answer = acknowledge_list(owner, ids, **common)
        else:
            ids = [uri.path.split("/")[-2]]
            answer = acknowledge(owner, ids[0], **common)
    (seen,) = answers.seen
    assert (seen.method, seen.path) == (entry["RequestMethod"], uri.path)
    assert seen.query == {"api-version": [api_version]}
    if entry["RequestBody"]:
        assert json.loads(seen.body) == json.loads(entry["RequestBody"])
    return answer, ids, seen


def test_every_sample_is_a_whole_recorded_entry() -> None:
    names = sorted(p.name for p in SAMPLES.glob("ScheduledEvents_*.recorded-*.json"))
    assert len(names) == 6
    for name in names:
        entry = recorded(name)
        assert entry["RequestMethod"] == "POST"
        assert "/providers/Microsoft.Maintenance/scheduledevents" in entry["RequestUri"]
        json.loads(entry["ResponseBody"])  # the body is JSON, as Azure sent it
        # The recorder re-indents JSON; Content-Length is what Azure sent, so it equals the
        # recorded body's length or its compact form's (the two 404s came compact).
        compact = json.dumps(json.loads(entry["ResponseBody"]), separators=(",", ":"))
        assert int(entry["ResponseHeaders"]["Content-Length"][0]) in (
            len(entry["ResponseBody"].encode()),
            len(compact.encode()),
        ), name


def test_the_recorded_200_of_one_acknowledge_is_approved() -> None:
    answer, ids, seen = replay(recorded("ScheduledEvents_Acknowledge.recorded-200.json"))
    assert seen.body == b""
    assert (answer.verdict, answer.status, answer.text) == (
        "approved",
        200,
        "Successfully approved scheduled event",
    )
    assert answer.approved == ids and answer.refused == {}


def test_the_recorded_200_of_a_list_approves_every_listed_event() -> None:
    answer, ids, _seen = replay(recorded("ScheduledEvents_AcknowledgeList.recorded-200.json"))
    assert (answer.verdict, answer.status, answer.text) == (
        "approved",
        200,
        "Successfully approved all Scheduled Events in the list",
    )
    assert (
        answer.approved
        == ids
        == [
            "81eda1cf-a905-49c5-9f53-0bc3c3654cfe",
            "ab959d03-ceda-4330-860a-d7f0a3657774",
        ]
    )


@pytest.mark.parametrize(
    "sample",
    [
        "ScheduledEvents_AcknowledgeList.recorded-207.json",  # error.details[].target
        "ScheduledEvents_AcknowledgeList.recorded-207-response-shape.json",  # by index
    ],
)
def test_a_recorded_207_approves_nothing_and_refuses_each_event_azure_named(sample) -> None:
    """Azure approved neither event; the old code took any 2xx as all approved."""
    answer, ids, _seen = replay(recorded(sample))
    assert answer.verdict == "refused" and answer.status == 207
    assert answer.code == "MultiStatusResponse"
    assert answer.approved == []
    assert answer.refused == {ids[0]: NOT_FOUND, ids[1]: NOT_FOUND}
    assert "0 of 2 approved, 2 refused" in answer.text
    assert "The operation returned different statuses for the Scheduled Events." in answer.text


@pytest.mark.parametrize(
    "sample",
    [
        "ScheduledEvents_AcknowledgeList.recorded-207.json",
        "ScheduledEvents_AcknowledgeList.recorded-207-response-shape.json",
    ],
)
def test_a_207_result_coded_ok_approves_that_event_only(sample) -> None:
    """The recorded 207 with its first result as azure-powershell's unit test
    ApproveAzureRmScheduledEventListTests shows an approved one (Code "OK", "Successfully
    approved scheduled event"): derived, not recorded. The other event stays refused."""
    entry = recorded(sample)
    body = json.loads(entry["ResponseBody"])
    details = body["error"]["details"] if "error" in body else body["Details"]
    key = "code" if "error" in body else "Code"
    details[0][key] = "OK"
    details[0]["message" if key == "code" else "Message"] = "Successfully approved scheduled event"
    answer, ids, _seen = replay(entry, body=json.dumps(body).encode())
    assert answer.verdict == "refused" and answer.status == 207
    assert answer.approved == [ids[0]]
    assert answer.refused == {ids[1]: NOT_FOUND}
    # Every result OK: the whole list approved.
    details[1][key] = "ok"
    answer, ids, _seen = replay(entry, body=json.dumps(body).encode())
    assert answer.verdict == "approved" and answer.approved == ids and answer.refused == {}
    # A result for one event only: the other is neither approved nor refused.
    del details[1]
    answer, ids, _seen = replay(entry, body=json.dumps(body).encode())
    assert answer.verdict == "refused"
    assert (answer.approved, answer.refused) == ([ids[0]], {})
    assert "1 not accounted for" in answer.text


def test_the_recorded_404_of_an_unknown_event_keeps_azures_code_and_message() -> None:
    """Capitalised keys: the old code read only `error.code` and recorded an empty code."""
    answer, ids, _seen = replay(recorded("ScheduledEvents_Acknowledge.recorded-404.json"))
    assert (answer.verdict, answer.status, answer.code) == (
        "refused",
        404,
        "InvalidScheduledEventId",
    )
    assert answer.text == (
        "ARM refused 404 InvalidScheduledEventId on virtualmachinescalesets/ps5611: "
        "Scheduled event not found"
    )
    assert answer.approved == [] and ids == ["ba1f078c-0c66-483a-85f8-cef6401a3f33"]


def test_the_recorded_404_of_a_missing_vm_is_resource_managers() -> None:
    entry = recorded("ScheduledEvents_Acknowledge.recorded-404-resource.json")
    answer, _ids, _seen = replay(entry)
    assert (answer.verdict, answer.status, answer.code) == ("refused", 404, "ResourceNotFound")
    assert answer.text.startswith(
        "ARM refused 404 ResourceNotFound on virtualMachines/ps2532: The Resource "
        "'Microsoft.Compute/virtualMachines/ps2532' under resource group 'ps2110' was not found."
    )
