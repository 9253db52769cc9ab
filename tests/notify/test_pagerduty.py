"""PagerDuty Events v2 bodies: when to trigger or resolve, and the API's own rules."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import pytest

from functions.model.event import Transition
from functions.notify import pagerduty
from tests.notify.factory import decision, event, note

KEY = "R0UT1NGKEY0123456789012345678901"


def assert_valid_trigger(body: dict[str, Any]) -> dict[str, Any]:
    """What PagerDuty validates (its OpenAPI description plus the documented limits)."""
    assert set(body) <= {
        "routing_key", "event_action", "dedup_key", "payload", "client", "client_url",
        "links", "images",
    }  # fmt: skip
    assert body["routing_key"] == KEY
    assert body["event_action"] == "trigger"
    assert 0 < len(body["dedup_key"]) <= 255
    payload = body["payload"]
    assert {"summary", "source", "severity"} <= set(payload)
    assert set(payload) <= {
        "summary", "source", "severity", "timestamp", "component", "group", "class",
        "custom_details",
    }  # fmt: skip
    assert 0 < len(payload["summary"]) <= 1024
    assert payload["source"]
    assert payload["severity"] in {"critical", "error", "warning", "info"}
    assert datetime.fromisoformat(payload["timestamp"]).tzinfo is not None
    for name in ("component", "group", "class"):
        assert isinstance(payload.get(name, ""), str)
    assert isinstance(payload["custom_details"], dict)
    for link in body.get("links", []):
        assert set(link) == {"href", "text"} and link["href"].startswith("https://")
    return payload


def test_a_paging_decision_triggers_with_the_event_details() -> None:
    body = pagerduty.build_event(
        note(Transition.DECIDED, event(), decision(severity="critical")), KEY
    )
    assert body is not None
    payload = assert_valid_trigger(body)
    assert body["dedup_key"] == "event:EV-1"
    assert payload["severity"] == "critical"
    assert payload["source"] == "web"
    assert payload["component"] == "web_0"
    assert payload["group"] == "web"
    assert payload["class"] == "Reboot"
    assert payload["timestamp"] == "2026-11-21T10:00:00+00:00"
    assert payload["summary"].startswith("Reboot scheduled: 2 VMs in scale set web")
    details = payload["custom_details"]
    assert details["EventId"] == "EV-1"
    assert details["NotBefore"] == "Sat, 21 Nov 2026 10:12:00 GMT"
    assert details["Resources"] == ["web_0", "web_1"]
    assert details["decision"]["rule"] == "reboot-window"
    assert body["links"] == [
        {"href": "https://bridge.example/api/status", "text": "Fleet status"},
        {"href": "https://bridge.example/api/approve?event=E", "text": "Approve manually"},
    ]


def test_a_host_failure_page_says_it_already_started() -> None:
    """First seen Started (no NotBefore): the page must not call it scheduled."""
    started = event(event_status="Started", not_before=None)
    body = pagerduty.build_event(note(Transition.DECIDED, started, decision()), KEY)
    assert body is not None
    summary = assert_valid_trigger(body)["summary"]
    assert summary.startswith("Reboot already started (no notice): 2 VMs in scale set web")
    assert "scheduled" not in summary.lower()


def test_a_quiet_decision_does_not_page() -> None:
    assert (
        pagerduty.build_event(note(Transition.DECIDED, event(), decision(page=False)), KEY) is None
    )


@pytest.mark.parametrize(
    ("transition", "action"),
    [
        (Transition.SCHEDULED, None),
        (Transition.APPROVED, None),
        (Transition.DRAIN_STARTED, None),
        (Transition.STARTED, None),
        (Transition.OVERDUE, None),
        (Transition.APPROVAL_FAILED, "trigger"),
        (Transition.DRAIN_FAILED, "trigger"),
        (Transition.COMPLETED, "resolve"),
        (Transition.CANCELLED, "resolve"),
    ],
)
def test_which_transitions_page(transition: Transition, action: str | None) -> None:
    quiet = decision(page=False, severity="info")
    assert pagerduty.action_for(note(transition, event(), quiet)) == action


def test_failures_page_at_least_as_errors() -> None:
    quiet = decision(page=False, severity="info")
    body = pagerduty.build_event(note(Transition.APPROVAL_FAILED, event(), quiet), KEY)
    assert body is not None and assert_valid_trigger(body)["severity"] == "error"
    loud = decision(severity="critical")
    body = pagerduty.build_event(note(Transition.DRAIN_FAILED, event(), loud), KEY)
    assert body is not None and assert_valid_trigger(body)["severity"] == "critical"


def test_resolve_is_minimal_and_keyed_by_event() -> None:
    body = pagerduty.build_event(note(Transition.COMPLETED, event("EV-9"), decision()), KEY)
    assert body == {"routing_key": KEY, "event_action": "resolve", "dedup_key": "event:EV-9"}


def test_relay_silent_and_policy_invalid_page_without_an_event() -> None:
    body = pagerduty.build_event(note(Transition.RELAY_SILENT, None, vm="web_3"), KEY)
    assert body is not None
    payload = assert_valid_trigger(body)
    assert body["dedup_key"] == "relay-silent:web_3"
    assert payload["source"] == "web_3" and payload["class"] == "relay_silent"
    body = pagerduty.build_event(
        note(Transition.POLICY_INVALID, None, decision(policy_error="bad rule")), KEY
    )
    assert body is not None
    assert assert_valid_trigger(body)["severity"] == "error"
    assert body["dedup_key"] == "policy_invalid:fleet"


def test_relay_recovered_resolves_the_relay_silent_incident() -> None:
    recovered = note(Transition.RELAY_RECOVERED, None, vm="web_3", page=False)
    body = pagerduty.build_event(recovered, KEY)
    assert body == {
        "routing_key": KEY,
        "event_action": "resolve",
        "dedup_key": "relay-silent:web_3",
    }
    silent = pagerduty.build_event(note(Transition.RELAY_SILENT, None, vm="web_3"), KEY)
    assert silent is not None and silent["dedup_key"] == body["dedup_key"]


def test_limits_hold_for_huge_inputs() -> None:
    long_id = "E" * 400
    body = pagerduty.build_event(
        note(
            Transition.DRAIN_FAILED,
            event(long_id, description="d" * 5000, resources=tuple(f"web_{i}" for i in range(300))),
            decision(reason="r" * 3000),
            detail="x" * 3000,
        ),
        KEY,
    )
    assert body is not None
    payload = assert_valid_trigger(body)
    assert len(body["dedup_key"]) == 255
    assert len(payload["summary"]) == 1024 and payload["summary"].endswith("…")


@pytest.mark.parametrize(
    ("transition", "page", "action"),
    [
        (Transition.APPROVAL_FAILED, False, None),  # the operator took it off POLICY__PAGE__*
        (Transition.DECIDED, True, "trigger"),
        (Transition.DECIDED, False, None),
        (Transition.OVERDUE, True, "trigger"),  # the operator added it
        (Transition.STARTED, True, None),  # progress of a paged event is not a new alarm
        (Transition.APPROVED, True, None),
        (Transition.COMPLETED, False, "resolve"),
    ],
)
def test_the_announcers_page_flag_is_the_authority(
    transition: Transition, page: bool, action: str | None
) -> None:
    item = note(transition, event(), decision(page=not page), page=page)
    assert pagerduty.action_for(item) == action


def test_vm_text_never_brings_control_characters_into_a_summary():
    from functions.model.event import Transition
    from functions.notify import pagerduty
    from tests.notify.factory import event, note

    hostile = "web_0\n\rINJECTED\x00\x1b[2J\u202eevil\u200b\t"
    snap = event(event_id=hostile, description=hostile, resources=(hostile,), scale_sets=(hostile,))
    body = pagerduty.build_event(
        note(Transition.APPROVAL_FAILED, snap, None, detail=f"relay: {hostile}"), "r" * 32
    )
    payload = body["payload"]
    for key in ("summary", "source", "component", "group", "class"):
        value = payload.get(key)
        if value is None:
            continue
        assert value.isprintable(), (key, value)
        assert "\u202e" not in value and "\u200b" not in value
    assert "INJECTED" in payload["summary"]  # still said, on one line
    assert payload["custom_details"]["detail"] == f"relay: {hostile}"  # raw data, JSON-escaped
