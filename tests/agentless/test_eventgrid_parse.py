"""Parsing Event Grid notifications: both schemas, arrays, and what is rejected and why."""

from __future__ import annotations

import json

import pytest

from functions.model.envelope import DocumentError, looks_like_event_grid
from functions.pipeline.sources.eventgrid import parse_message
from tests.agentless.grid import SUB, event, grid_event, owner_id
from tests.functions.conftest import envelope


@pytest.mark.parametrize("schema", ["eventgrid", "cloudevents"])
@pytest.mark.parametrize("status", ["Scheduled", "Started", "Completed", "Canceled"])
def test_every_status_in_both_schemas(schema, status):
    props = event("EV-1", "Reboot", status=status, resources=("web_1",))
    body = json.dumps(
        grid_event(props, owner=owner_id("virtualMachineScaleSets", "web"), schema=schema)
    )
    events, rejected = parse_message(body)
    assert rejected == []
    (grid,) = events
    assert grid.status == status and grid.ends == (status in ("Completed", "Canceled"))
    assert grid.event.event_id == "EV-1" and grid.event.resources == ("web_1",)
    assert grid.schema_name == ("CloudEvents" if schema == "cloudevents" else "EventGridSchema")
    assert grid.owner.resource_type == "virtualMachineScaleSets" and grid.owner.name == "web"
    assert grid.owner.subscription_id == SUB and grid.owner.resource_group == "rg1"


def test_an_array_mixing_both_schemas_and_a_bad_element():
    good = grid_event(event("EV-1"), owner=owner_id("availabilitySets", "as1"))
    cloud = grid_event(event("EV-2"), schema="cloudevents")
    wrong_type = {**grid_event(event("EV-3")), "eventType": "Microsoft.Storage.BlobCreated"}
    events, rejected = parse_message(json.dumps([good, cloud, wrong_type]))
    assert [g.event.event_id for g in events] == ["EV-1", "EV-2"]
    assert events[0].owner.resource_type == "availabilitySets"
    assert len(rejected) == 1 and "Microsoft.Storage.BlobCreated" in rejected[0].reason


@pytest.mark.parametrize(
    ("mutate", "reason"),
    [
        (lambda e: e.pop("id"), "without an id"),
        (lambda e: e["data"].pop("resourceInfo"), "resourceInfo is missing"),
        (lambda e: e["data"]["resourceInfo"].pop("properties"), "properties is missing"),
        (lambda e: e.update(subject="/subscriptions/x/resourceGroups/r"), "not an ARM id"),
        (
            lambda e: e.update(subject=e["subject"].replace("virtualMachines", "disks")),
            "cannot own Scheduled Events",
        ),
        (
            lambda e: e["data"]["resourceInfo"]["properties"].update(EventId="OTHER"),
            "is not the one in its ARM id",
        ),
        (
            lambda e: e["data"]["resourceInfo"]["properties"].update(EventStatus="Exploded"),
            "EventStatus 'Exploded'",
        ),
        (
            lambda e: e["data"]["resourceInfo"]["properties"].update(NotBefore="tomorrow"),
            "NotBefore",
        ),
        (
            lambda e: e["data"]["resourceInfo"].update(id="/subscriptions/x/elsewhere"),
            "differ",
        ),
    ],
)
def test_malformed_events_are_rejected_with_a_reason(mutate, reason):
    item = grid_event(event("EV-1"))
    mutate(item)
    events, rejected = parse_message(json.dumps(item))
    assert events == [] and reason in rejected[0].reason


@pytest.mark.parametrize("body", [b"{not json", b"[]", b"[1, 2]", b'"text"'])
def test_unusable_messages_raise_one_document_error(body):
    with pytest.raises(DocumentError):
        parse_message(body)


def test_routing_tells_envelopes_from_event_grid():
    assert looks_like_event_grid(json.dumps(grid_event(event())).encode())
    assert looks_like_event_grid(json.dumps(grid_event(event(), schema="cloudevents")))
    assert looks_like_event_grid(b"  [ ]")
    relay = envelope("vm1", 1, [{**event(), "Description": 'says "eventType": in text'}])
    assert not looks_like_event_grid(relay.encode())
