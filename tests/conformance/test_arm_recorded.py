"""The ARM approver against what Azure really answered: azure-powershell's recorded sessions.

Microsoft's azure-powershell records its Maintenance scenario tests against live Azure
(tests/conformance/SOURCES.md: repository, path, commit, recording date). Each sample here
is one recorded entry: the request, the status and the body exactly as recorded. A loopback
server answers that status with those bytes, and `functions.approvers.arm` must read it as
Azure means it: the 200 text, the Maintenance provider's 404 with capitalised keys, and
Resource Manager's own 404 for a missing VM. The app makes only the one-event call; the
list form's recorded answers (200, and 207 MultiStatus in both shapes Azure was seen to
answer) stay for the simulator's list endpoint (tests/simulator/test_arm.py), and a 207
served to the one-event call is never taken for an approval.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
import requests

from functions.approvers.arm import ArmAnswer, acknowledge
from functions.model.arm import ArmResource
from tests.conformance.imds_server import serve

SAMPLES = Path(__file__).with_name("samples")


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


def replay(entry: dict[str, Any]) -> tuple[ArmAnswer, str, Any]:
    """Serve the recorded answer (status, exact body, recorded headers but Content-Length)
    where it was recorded, make the app's one-event call there, and return its answer, the
    EventId it sent and what the server saw."""
    uri = urlsplit(entry["RequestUri"])
    headers = {k: v[0] for k, v in entry["ResponseHeaders"].items() if k != "Content-Length"}
    data = entry["ResponseBody"].encode()
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
        event_id = uri.path.split("/")[-2]
        answer = acknowledge(owner, event_id, **common)
    (seen,) = answers.seen
    assert (seen.method, seen.path) == (entry["RequestMethod"], uri.path)
    assert seen.query == {"api-version": [api_version]}
    return answer, event_id, seen


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
    answer, _event_id, seen = replay(recorded("ScheduledEvents_Acknowledge.recorded-200.json"))
    assert seen.body == b""
    assert (answer.verdict, answer.status, answer.text) == (
        "approved",
        200,
        "Successfully approved scheduled event",
    )


@pytest.mark.parametrize(
    "sample",
    [
        "ScheduledEvents_AcknowledgeList.recorded-207.json",  # error.details[].target
        "ScheduledEvents_AcknowledgeList.recorded-207-response-shape.json",  # Response/Details
    ],
)
def test_a_207_to_the_one_event_call_is_never_an_approval(sample) -> None:
    """The spec gives the one-event call 200 or an error, and Azure was recorded answering
    207 only to the list form; should a 207 come anyway, it is refused (its code kept when
    the body has one), not taken for a 2xx approval."""
    entry = recorded(sample)
    (event_id, _other) = json.loads(entry["RequestBody"])["value"]
    one = dict(
        entry,
        RequestUri=entry["RequestUri"].replace(
            "/scheduledevents?", f"/scheduledevents/{event_id}/acknowledge?"
        ),
        RequestBody="",
    )
    answer, sent, seen = replay(one)
    assert sent == event_id and seen.body == b""
    assert (answer.verdict, answer.status) == ("refused", 207)
    if "error" in json.loads(entry["ResponseBody"]):
        assert answer.code == "MultiStatusResponse"
    assert answer.text.startswith("ARM refused 207")


def test_the_recorded_404_of_an_unknown_event_keeps_azures_code_and_message() -> None:
    """Capitalised keys: the old code read only `error.code` and recorded an empty code."""
    answer, event_id, _seen = replay(recorded("ScheduledEvents_Acknowledge.recorded-404.json"))
    assert (answer.verdict, answer.status, answer.code) == (
        "refused",
        404,
        "InvalidScheduledEventId",
    )
    assert answer.text == (
        "ARM refused 404 InvalidScheduledEventId on virtualmachinescalesets/ps5611: "
        "Scheduled event not found"
    )
    assert event_id == "ba1f078c-0c66-483a-85f8-cef6401a3f33"


def test_the_recorded_404_of_a_missing_vm_is_resource_managers() -> None:
    entry = recorded("ScheduledEvents_Acknowledge.recorded-404-resource.json")
    answer, _event_id, _seen = replay(entry)
    assert (answer.verdict, answer.status, answer.code) == ("refused", 404, "ResourceNotFound")
    assert answer.text.startswith(
        "ARM refused 404 ResourceNotFound on virtualMachines/ps2532: The Resource "
        "'Microsoft.Compute/virtualMachines/ps2532' under resource group 'ps2110' was not found."
    )
