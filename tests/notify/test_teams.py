"""The Teams card: valid Adaptive Card 1.5 structure, and what it says at a glance."""

from __future__ import annotations

import json
import re
from datetime import timedelta
from typing import Any

import pytest

from functions.model.event import Transition
from functions.notify import describe, teams
from tests.notify.factory import NOW, decision, event, note

# Element and action types of Adaptive Cards ≤ 1.5 (schema 1.5.0), and what each requires.
ELEMENTS = {
    "TextBlock": {"text"},
    "FactSet": {"facts"},
    "Container": {"items"},
    "ColumnSet": set(),
    "Image": {"url"},
    "RichTextBlock": {"inlines"},
    "ActionSet": {"actions"},
    "Table": set(),
}
ACTIONS = {"Action.OpenUrl": {"url"}, "Action.Submit": set(), "Action.ShowCard": {"card"}}
COLORS = {"Default", "Dark", "Light", "Accent", "Good", "Warning", "Attention"}
SIZES = {"Default", "Small", "Medium", "Large", "ExtraLarge"}


def assert_valid_card(message: dict[str, Any]) -> dict[str, Any]:
    assert message["type"] == "message"
    (attachment,) = message["attachments"]
    assert attachment["contentType"] == "application/vnd.microsoft.card.adaptive"
    assert attachment["contentUrl"] is None
    card = attachment["content"]
    assert card["type"] == "AdaptiveCard"
    assert card["$schema"] == "http://adaptivecards.io/schemas/adaptive-card.json"
    major, minor = (int(part) for part in card["version"].split("."))
    assert (major, minor) <= (1, 5)
    assert set(card) <= {"type", "$schema", "version", "body", "actions", "msteams"}
    assert card["body"], "an empty card renders as nothing"
    for element in card["body"]:
        assert element["type"] in ELEMENTS, element["type"]
        assert ELEMENTS[element["type"]] <= set(element)
        if element["type"] == "TextBlock":
            assert isinstance(element["text"], str) and element["text"]
            assert element.get("color", "Default") in COLORS
            assert element.get("size", "Default") in SIZES
        if element["type"] == "FactSet":
            assert element["facts"]
            for fact in element["facts"]:
                assert set(fact) == {"title", "value"}
                assert all(isinstance(fact[key], str) for key in fact)
    for action in card.get("actions", []):
        assert action["type"] in ACTIONS
        assert ACTIONS[action["type"]] <= set(action)
        assert action["title"]
        assert action["url"].startswith("https://")
    assert len(json.dumps(message)) < 28 * 1024, "Teams webhooks refuse posts over 28 KB"
    return card


def shown(text: str) -> str:
    """What Teams shows for a card text: escapes resolved, zero-width spaces invisible."""
    return re.sub(r"\\(.)", r"\1", text).replace(teams.ZWSP, "")


def facts(card: dict[str, Any]) -> dict[str, str]:
    found: dict[str, str] = {}
    for element in card["body"]:
        if element["type"] == "FactSet":
            found.update({shown(f["title"]): shown(f["value"]) for f in element["facts"]})
    return found


def test_decided_card_says_what_which_when_why_decision_and_links() -> None:
    message = teams.build_message(
        note(Transition.DECIDED, event(), decision()), now=NOW + timedelta(seconds=5)
    )
    card = assert_valid_card(message)
    table = facts(card)
    assert table["What"] == "Reboot"
    assert table["VMs"] == "Scale set web: web_0, web_1"
    assert table["When"] == "2026-11-21 10:12:00 UTC (in 12 min)"
    assert "restarted" in table["Why"]
    assert table["Source"] == "Platform"
    assert "Hold" in table["Decision"] and "reboot-window" in table["Decision"]
    assert "outside the maintenance window" in table["Decision"]
    assert table["Event"] == "EV-1"
    assert shown(card["body"][0]["text"]) == "Reboot scheduled: 2 VMs in scale set web"
    urls = {action["title"]: action["url"] for action in card["actions"]}
    assert urls == {
        "Approve manually": "https://bridge.example/api/approve?event=E",
        "Fleet status": "https://bridge.example/api/status",
    }


@pytest.mark.parametrize(
    ("transition", "words"),
    [
        (Transition.APPROVED, "approved"),
        (Transition.APPROVAL_FAILED, "approval failed"),
        (Transition.DRAIN_FAILED, "drain failed"),
        (Transition.STARTED, "started"),
        (Transition.COMPLETED, "completed"),
        (Transition.CANCELLED, "cancelled"),
        (Transition.OVERDUE, "overdue"),
    ],
)
def test_follow_ups_are_short_valid_cards(transition: Transition, words: str) -> None:
    card = assert_valid_card(
        teams.build_message(note(transition, event(), detail="relay said 200"), now=NOW)
    )
    assert words in shown(card["body"][0]["text"])
    assert "Why" not in facts(card) and "Decision" not in facts(card)
    assert facts(card)["Event"] == "EV-1"
    assert shown(card["body"][-1]["text"]) == "relay said 200"
    assert len(card["body"]) <= 3
    attention = transition in {
        Transition.APPROVAL_FAILED,
        Transition.DRAIN_FAILED,
        Transition.OVERDUE,
    }
    assert (card["body"][0]["color"] == "Attention") is attention


def test_relay_silent_and_policy_invalid_cards_have_no_event() -> None:
    silent = assert_valid_card(
        teams.build_message(note(Transition.RELAY_SILENT, None, vm="web_3"), now=NOW)
    )
    assert shown(silent["body"][0]["text"]) == "Relay on web_3 stopped reporting"
    assert facts(silent)["VM"] == "web_3"
    broken = assert_valid_card(
        teams.build_message(
            note(
                Transition.POLICY_INVALID,
                None,
                decision(action="hold", rule="fail-closed", policy_error="POLICY__RULES: bad"),
            ),
            now=NOW,
        )
    )
    assert facts(broken)["Policy error"] == "POLICY__RULES: bad"


def test_relay_recovered_is_a_short_follow_up() -> None:
    card = assert_valid_card(
        teams.build_message(
            note(Transition.RELAY_RECOVERED, None, vm="web_3", detail="after 12 min"), now=NOW
        )
    )
    assert shown(card["body"][0]["text"]) == "Relay on web_3 is reporting again"
    assert card["body"][0]["color"] == "Default"
    assert facts(card)["VM"] == "web_3"
    assert shown(card["body"][-1]["text"]) == "after 12 min"
    assert [a["title"] for a in card.get("actions", [])] == ["Fleet status"]


def test_scheduled_is_left_to_the_decided_card() -> None:
    assert not teams.wants(note(Transition.SCHEDULED, event()))
    assert teams.wants(note(Transition.DECIDED, event(), decision()))


@pytest.mark.parametrize(
    ("kind", "seconds", "words"),
    [
        ("Freeze", 5, "Live migration pause 5 s"),
        ("Freeze", 0, "Freeze (no impact expected)"),
        ("Reboot", -1, "Reboot"),
        ("Redeploy", -1, "Redeploy (moves to another host, temporary disk lost)"),
        ("Preempt", -1, "Spot eviction"),
        ("Terminate", -1, "Scale-in: instance deleted"),
        ("Hibernate", -1, "Hibernate"),  # a type Azure adds later is still announced
    ],
)
def test_event_types_in_words(kind: str, seconds: int, words: str) -> None:
    assert describe.event_words(event(event_type=kind, duration_in_seconds=seconds)) == words


def test_vms_are_grouped_by_scale_set_then_availability_set() -> None:
    snapshot = event(
        resources=("web_0", "api_3", "db1", "web_2"),
        scale_sets=("web", "api"),
        availability_sets=("as-db",),
    )
    assert describe.vms_text(snapshot) == (
        "Scale set web: web_0, web_2; Scale set api: api_3; Availability set as-db: db1"
    )


def test_a_large_fleet_still_fits_in_one_card() -> None:
    names = tuple(f"web_{index}" for index in range(500))
    message = teams.build_message(
        note(
            Transition.DECIDED,
            event(resources=names, description="x" * 5000),
            decision(),
        ),
        now=NOW,
    )
    card = assert_valid_card(message)
    assert facts(card)["VMs"].endswith("and 480 more")


@pytest.mark.parametrize(
    ("offset", "text"),
    [
        (timedelta(minutes=12), "in 12 min"),
        (timedelta(seconds=10), "now"),
        (timedelta(minutes=-3), "3 min ago"),
        (timedelta(hours=5, minutes=30), "in 5 h 30 min"),
        (timedelta(days=6), "in 6 days"),
    ],
)
def test_relative_time(offset: timedelta, text: str) -> None:
    assert describe.relative(NOW + offset, NOW) == text


def test_an_event_that_never_was_scheduled_says_so() -> None:
    started = event(event_status="Started", not_before=None)
    card = assert_valid_card(
        teams.build_message(note(Transition.DECIDED, started, decision()), now=NOW)
    )
    assert (
        shown(card["body"][0]["text"])
        == "Reboot already started (no notice): 2 VMs in scale set web"
    )
    assert facts(card)["When"] == "now (already started)"


@pytest.mark.parametrize("transition", [Transition.SCHEDULED, Transition.DECIDED])
def test_only_a_started_event_is_called_already_started(transition: Transition) -> None:
    """The headline follows the event's status, not the transition's name."""
    scheduled = note(transition, event(), decision())
    started = note(transition, event(event_status="Started", not_before=None), decision())
    assert describe.headline(scheduled) == "Reboot scheduled: 2 VMs in scale set web"
    assert describe.headline(started) == (
        "Reboot already started (no notice): 2 VMs in scale set web"
    )


HOSTILE = [
    "[click](http://evil.example/x)",
    "**bold** _it_ ~~gone~~ `code`",
    "<at>everyone</at> &lt;b&gt;",
    "line one\n\n# heading\n- item\n> quote",
    "see www.evil.example or mail me@evil.example, <https://evil.example>",
    "![img](https://evil.example/i.png) \x1b[31mred\u202eevil",
]


def _texts(card: dict[str, Any]) -> list[str]:
    out = []
    for element in card["body"]:
        if element["type"] == "TextBlock":
            out.append(element["text"])
        for fact in element.get("facts", []):
            out += [fact["title"], fact["value"]]
    return out


def _inert(text: str) -> None:
    """No Markdown, link, mention or control character survives in a card text."""
    assert "\n" not in text and "\r" not in text and "\x1b" not in text and "\u202e" not in text
    unescaped = re.sub(r"\\.", "", text)  # what is left once every escape is taken out
    for token in ("*", "[", "]", "`", "~", "<", ">", "&"):
        assert token not in unescaped, (token, text)
    # an underscore opens or closes emphasis only at a word's edge
    assert not re.search(r"(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])", unescaped), text
    assert not re.match(r"[#>+=-]|\d+\.", text), text
    for linky in ("http://", "https://", "www.evil", "evil.example", "@evil", "mailto:"):
        assert linky not in text, (linky, text)


@pytest.mark.parametrize("hostile", HOSTILE)
def test_vm_text_is_inert_in_every_card(hostile):
    """Everything a VM or a relay said (EventId, names, type, Description, source, relay
    answers in `detail`) reaches Teams as plain text: escaped, one line, no link."""
    snap = event(
        event_id=hostile,
        event_type=hostile,
        event_source=hostile,
        description=hostile,
        resources=(hostile, f"web_{hostile}"),
        reported_by=(hostile,),
        scale_sets=(hostile,),
        availability_sets=(hostile,),
    )
    notes = [
        note(Transition.DECIDED, snap, decision(reason=hostile)),
        note(Transition.APPROVAL_FAILED, snap, decision(), detail=f"relay said: {hostile}"),
        note(Transition.RELAY_SILENT, None, None, vm=hostile, detail=hostile),
    ]
    for n in notes:
        card = assert_valid_card(teams.build_message(n, now=NOW))
        texts = _texts(card)
        assert texts
        for text in texts:
            _inert(text)
        # ...and an operator still reads what the VM said, literally.
        words = " ".join(shown(t) for t in texts)
        assert describe.plain(hostile) in words
        raw = json.dumps(card)
        assert "<at>" not in raw and "](http" not in raw and "**bold**" not in raw


def test_inert_keeps_ordinary_text_readable():
    assert teams.inert("Reboot scheduled: 2 VMs in scale set web") == (
        "Reboot scheduled: 2 VMs in scale set web"
    )
    # our own words reach the card untouched: no escape a renderer could show
    assert teams.inert("workers_0 at 2026-11-21 10:12 UTC (in 12 min)") == (
        "workers_0 at 2026-11-21 10:12 UTC (in 12 min)"
    )
    assert teams.inert("Hold: let NotBefore arrive (rule default-hold)!") == (
        "Hold: let NotBefore arrive (rule default-hold)!"
    )
    assert teams.inert("_it_ a_b") == "\\_it\\_ a_b"
    assert teams.inert("1. first") == "1\\. first"
    assert teams.inert("#1") == "\\#1"
    assert teams.inert("a\r\n\tb") == "a b"


def test_the_decided_card_says_the_decision_once_without_escapes():
    """The policy's reason repeats the rule and the action ("rule 'default-hold': hold"): the
    card says them once, and none of our own words carries a backslash."""
    generic = decision(action="hold", rule="default-hold", reason="rule 'default-hold': hold")
    card = teams.build_card(note(Transition.DECIDED, event(), generic), now=NOW)
    words = " ".join(_texts(card))
    assert facts(card)["Decision"] == "Hold: let NotBefore arrive (rule default-hold)"
    assert words.count("default-hold") == 1
    assert "\\" not in words
    assert "(in 12 min)" in facts(card)["When"]
    # a reason that says more than the rule is kept, once
    window = decision(reason="rule 'reboot-window': approve when the maintenance window opens")
    text = facts(teams.build_card(note(Transition.DECIDED, event(), window), now=NOW))["Decision"]
    assert text.endswith("(rule reboot-window): approve when the maintenance window opens")
    assert text.count("reboot-window") == 1
