"""PagerDuty Events API v2 bodies against PagerDuty's own OpenAPI description.

The request schema below is transcribed (structure only: property names, types, enums and
required lists; no description text) from PagerDuty/api-schema,
`reference/events-v2/openapiv3.json` at commit 5cd58ff2b5eebc209eaf19e0ff6ca8f40bdd5a94
(`paths./enqueue.post.requestBody` and `components.schemas`; the repository states no
licence, so nothing else of it is copied). Every body the app sends, trigger and resolve,
must validate; jsonschema does the validating, not code written here.
"""

from __future__ import annotations

import jsonschema
import pytest

from functions.model.event import Transition
from functions.notify import pagerduty
from tests.notify.factory import decision, event, note

KEY = "R0UT1NGKEY0123456789012345678901"
URL = {"type": "string", "format": "url"}
REQUEST = {
    "type": "object",
    "properties": {
        "payload": {"$ref": "#/definitions/Payload"},
        "routing_key": {"type": "string"},
        "event_action": {"enum": ["trigger", "acknowledge", "resolve"]},
        "dedup_key": {"type": "string"},
        "client": {"type": "string"},
        "client_url": URL,
        "links": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"href": URL, "text": {"type": "string"}},
                "required": ["href"],
            },
        },
        "images": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"src": URL, "href": URL, "alt": {"type": "string"}},
                "required": ["src"],
            },
        },
    },
    "required": ["routing_key", "event_action"],
    "definitions": {
        "Payload": {
            "type": "object",
            "properties": {
                "summary": {"type": "string"},
                "timestamp": {"type": "string", "format": "date-time"},
                "severity": {"enum": ["critical", "warning", "error", "info"]},
                "source": {"type": "string"},
                "component": {"type": "string"},
                "group": {"type": "string"},
                "class": {"type": "string"},
                "custom_details": {"type": "object"},
            },
            "required": ["summary", "severity", "source"],
        }
    },
}


@pytest.mark.parametrize(
    "transition",
    [t for t in Transition if t not in (Transition.RELAY_SILENT, Transition.RELAY_RECOVERED)],
)
def test_every_body_the_app_sends_validates(transition: Transition) -> None:
    body = pagerduty.build_event(note(transition, event(), decision(severity="critical")), KEY)
    if body is None:
        return  # this transition does not page
    jsonschema.validate(body, REQUEST, format_checker=jsonschema.FormatChecker())
    if body["event_action"] == "trigger":
        assert "payload" in body  # the API needs one to create an alert
    else:
        assert body["dedup_key"]  # "Required unless the event_type is trigger"


def test_the_schema_refuses_what_pagerduty_refuses() -> None:
    body = pagerduty.build_event(note(Transition.DECIDED, event(), decision()), KEY)
    assert body is not None
    broken = {**body, "payload": {**body["payload"], "severity": "high"}}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, REQUEST)


def test_both_actions_are_exercised() -> None:
    actions = set()
    for transition in Transition:
        if transition in (Transition.RELAY_SILENT, Transition.RELAY_RECOVERED):
            continue
        body = pagerduty.build_event(note(transition, event(), decision(severity="critical")), KEY)
        if body is not None:
            actions.add(body["event_action"])
    assert actions == {"trigger", "resolve"}


@pytest.mark.parametrize("transition", [Transition.DECIDED, Transition.COMPLETED])
def test_a_vm_s_hostile_words_still_make_a_valid_body(transition: Transition) -> None:
    """Defanged text and a namespaced key (issue 38) within the schema and PagerDuty's
    documented limits (summary 1,024 characters, dedup_key 255), for the longest EventId
    and names the envelope admits."""
    hostile = ("microsoftonlin\u00e8.com/approve?x=" * 10)[:128]
    snap = event(hostile, event_type=hostile, resources=(hostile,), scale_sets=(hostile,))
    body = pagerduty.build_event(note(transition, snap, decision(reason=hostile * 8)), KEY)
    assert body is not None
    jsonschema.validate(body, REQUEST, format_checker=jsonschema.FormatChecker())
    assert len(body["dedup_key"]) <= 255 and body["dedup_key"] == f"event:{hostile}"
    if transition is Transition.DECIDED:
        assert len(body["payload"]["summary"]) <= 1024
        assert "onlin\u00e8[.]com" in body["payload"]["summary"]
