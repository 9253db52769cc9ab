"""The agentless path, held to Microsoft's published contract (tests/conformance/SOURCES.md).

- ARM acknowledge: the path template and api-version of `ScheduledEvents_Acknowledge` in
  Azure/azure-rest-api-specs' Microsoft.Maintenance stable 2025-11-01 specification, and its
  example's 200 answer served to the app's approver.
- Event Grid: the sample notification on the Learn page "Scheduled Events in Event Grid"
  (its placeholders filled with concrete ids), parsed by the app's Event Grid source.
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace

from functions.approvers.arm import acknowledge, acknowledge_url
from functions.model.arm import ArmResource
from functions.pipeline.sources.eventgrid import EVENT_TYPE, parse_message
from functions.settings import Settings
from tests.conformance.imds_server import serve

SAMPLES = Path(__file__).with_name("samples")
# paths."…/acknowledge".post of specification/maintenance/resource-manager/
# Microsoft.Maintenance/Maintenance/stable/2025-11-01/Maintenance.json (see SOURCES.md).
SPEC_PATH = (
    "/subscriptions/{subscriptionId}/resourcegroups/{resourceGroupName}/providers/"
    "Microsoft.Compute/{resourceType}/{resourceName}/providers/Microsoft.Maintenance/"
    "scheduledevents/{scheduledEventId}/acknowledge"
)
SPEC_API_VERSION = "2025-11-01"


def example() -> dict:
    return json.loads((SAMPLES / "ScheduledEvents_Acknowledge.2025-11-01.json").read_text())


class Token:
    def get_token(self, *scopes: str, **kwargs: object) -> object:
        return SimpleNamespace(token="t0k3n", expires_on=4102444800)


def test_the_app_posts_the_specs_path_with_its_api_version_and_reads_its_answer() -> None:
    params = example()["parameters"]
    owner = ArmResource(
        subscription_id=params["subscriptionId"],
        resource_group=params["resourceGroupName"],
        resource_type=params["resourceType"],
        name=params["resourceName"],
    )
    expected = SPEC_PATH
    for name in ("subscriptionId", "resourceGroupName", "resourceType", "resourceName"):
        expected = expected.replace("{" + name + "}", params[name])
    expected = expected.replace("{scheduledEventId}", params["scheduledEventId"])
    assert params["api-version"] == SPEC_API_VERSION == Settings().arm_api_version
    body = example()["responses"]["200"]["body"]
    with serve({expected: (200, body)}) as (url, answers):
        assert acknowledge_url(url, owner, params["scheduledEventId"]) == url + expected
        answer = acknowledge(
            owner,
            params["scheduledEventId"],
            credential=Token(),
            session=__import__("requests").Session(),
            endpoint=url,
            api_version=Settings().arm_api_version,
            remaining=5.0,
        )
    (seen,) = answers.seen
    assert (seen.method, seen.path) == ("POST", expected)
    assert seen.query == {"api-version": [SPEC_API_VERSION]}
    assert seen.headers["authorization"] == "Bearer t0k3n" and seen.body == b""
    assert (answer.verdict, answer.status, answer.text) == (
        "approved",
        200,
        "Successfully Approved",
    )


def test_the_spec_path_has_exactly_the_segments_the_app_fills() -> None:
    names = re.findall(r"\{(\w+)\}", SPEC_PATH)
    assert names == [
        "subscriptionId",
        "resourceGroupName",
        "resourceType",
        "resourceName",
        "scheduledEventId",
    ]


def test_the_learn_pages_event_grid_sample_is_read_as_azure_means_it() -> None:
    raw = (SAMPLES / "eventgrid-scheduledevent-learn.json").read_text()
    events, rejected = parse_message(raw)
    assert rejected == []
    (grid,) = events
    sample = json.loads(raw)
    assert sample["eventType"] == EVENT_TYPE
    assert grid.grid_id == sample["id"]
    assert grid.owner.resource_type == "virtualMachineScaleSets" and grid.owner.name == "myvmss"
    assert grid.owner.subscription_id == "11111111-2222-3333-4444-555555555555"
    event = grid.event
    assert (event.event_id, event.event_type, event.event_status) == (
        "3da1b9aa-5204-4335-8c33-c54e315dcffe",
        "Freeze",
        "Started",
    )
    assert tuple(event.resources) == ("myvmss_1", "myvmss_2")  # instance names
    assert event.not_before == datetime(2025, 9, 19, 18, 29, 47, tzinfo=UTC)
    assert grid.time is not None and grid.time.year == 2017
