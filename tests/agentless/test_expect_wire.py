"""The `Expect` entry as the relay approver sends it (functions.approvers.relay.wire_expect),
checked by the relay's own parser (relay.expect.parse_expect) and body limit."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from functions.approvers.relay import MAX_EXPECT_RESOURCES, wire_expect
from functions.model.view import VmView, normalise_resources
from relay.callback_http import MAX_BODY
from relay.expect import parse_expect


def view(names: int, source: str | None = "Platform", duration: int | None = 30) -> dict:
    resources = normalise_resources([f"vm-{i:04d}-" + "x" * 55 for i in range(names)])
    return VmView(
        vm="vm-0000",
        event_type="Reboot",
        event_source=source,
        duration_s=duration,
        not_before=datetime(2026, 11, 25, 10, 0, tzinfo=UTC),
        resources=resources,
    ).expect()


def test_the_whole_view_goes_to_the_relay_and_parses_there():
    wire = wire_expect(view(3))
    assert set(wire) == {"EventType", "EventSource", "DurationInSeconds", "NotBefore", "Resources"}
    assert parse_expect({"E1": wire})["e1"] == wire


def test_an_unknown_source_is_empty_and_an_unknown_duration_is_null():
    wire = wire_expect(view(1, source=None, duration=None))
    assert wire["EventSource"] == "" and wire["DurationInSeconds"] is None
    assert parse_expect({"E1": wire})["e1"]["EventSource"] == ""


def test_an_event_naming_many_vms_fits_the_relays_body_limit():
    at_limit = wire_expect(view(MAX_EXPECT_RESOURCES))
    body = json.dumps({"EventIds": ["E1"], "Nonce": "n" * 32, "Expect": {"E1": at_limit}})
    assert len(body.encode()) <= MAX_BODY and len(at_limit["Resources"]) == MAX_EXPECT_RESOURCES
    beyond = wire_expect(view(MAX_EXPECT_RESOURCES + 1))
    assert "Resources" not in beyond and beyond["DurationInSeconds"] == 30
