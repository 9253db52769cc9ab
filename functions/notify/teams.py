"""Teams: an Adaptive Card posted to a Teams Workflows webhook.

The full card goes out once per event, on `decided` (it carries everything `scheduled`
knew, plus what will happen and why); later transitions post short follow-ups. Only
elements Teams renders from a Workflows webhook are used (schema version 1.5).

Most of a card's text comes from VMs (EventId, VM and set names, EventType, Description,
relay answers in `detail`), and TextBlock and FactSet values render a subset of Markdown:
a VM could write `[click](https://evil)` or `**URGENT**` into an operator's channel. So
every text in the card goes through `inert`: one line (`describe.plain`); the characters
that start Markdown in a card backslash-escaped (emphasis `*` and a word-boundary `_`,
link and image brackets, code, strike-through, HTML and mentions `<` `>` `&`); a
line-start `#`, `-`, `+`, `=` or `1.` escaped; and anything a linkifier would turn into a
link (`scheme:`, `www.`, `a.b`, `@`) broken by a zero-width space. Nothing else is
escaped: a renderer that shows escapes literally (some Teams clients, Microsoft's
`adaptivecards` renderer without a Markdown engine) must not print a backslash before
each parenthesis of our own `UTC (in 5 min)`; and parentheses, `!`, `|`, braces or an
underscore inside a name (`workers_0`) make no Markdown on their own.
"""

from __future__ import annotations

import logging
import re
from datetime import datetime
from typing import Any

from functions.model.event import Notification, Transition
from functions.notify import describe
from functions.notify.delivery import Transport, dumps, post_json

log = logging.getLogger(__name__)

CARD_SCHEMA = "http://adaptivecards.io/schemas/adaptive-card.json"
CARD_VERSION = "1.5"
CARD_CONTENT_TYPE = "application/vnd.microsoft.card.adaptive"
MAX_TEXT = 2000  # a long Description stays readable and the post stays far below 28 KB

# `scheduled` is covered by the `decided` card that always follows it.
SKIPPED = frozenset({Transition.SCHEDULED})

ATTENTION = {
    Transition.APPROVAL_FAILED,
    Transition.DRAIN_FAILED,
    Transition.OVERDUE,
    Transition.RELAY_SILENT,
    Transition.POLICY_INVALID,
    Transition.UNDRAIN_FAILED,
    Transition.CONFIG_INVALID,
}


# The characters that can start Markdown in a card (emphasis, links and images, code,
# strike-through, HTML and <at> mentions, entities); `_` only where it can open or close
# emphasis, at a word's edge.
_MARKDOWN = re.compile(r"([\\`*\[\]<>~&])|(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])")
_BLOCK_START = re.compile(r"^([#>+=-])|^(\d+)\.")  # a heading, quote, list or rule
ZWSP = describe.ZWSP


def inert(text: str) -> str:
    """`text` as Teams shows it literally: no formatting, no link, no mention, one line
    (so the only line start is the text's own)."""
    text = _MARKDOWN.sub(lambda m: "\\" + m[0], describe.plain(text))
    text = _BLOCK_START.sub(lambda m: "\\" + m[1] if m[1] else m[2] + "\\.", text)
    text = text.replace("](", "]" + ZWSP + "(")  # no inline link, whatever the escapes
    return describe.unlinked(text)  # in any script (describe.LINKY)


def wants(note: Notification) -> bool:
    return note.transition not in SKIPPED


def _text(text: str, **style: Any) -> dict[str, Any]:
    return {"type": "TextBlock", "text": inert(text[:MAX_TEXT]), "wrap": True, **style}


def _facts(pairs: list[tuple[str, str | None]]) -> dict[str, Any]:
    return {
        "type": "FactSet",
        "facts": [
            {"title": inert(title), "value": inert(value[:MAX_TEXT])}
            for title, value in pairs
            if value
        ],
    }


def _actions(note: Notification) -> list[dict[str, Any]]:
    actions = []
    if note.links.approve_url and note.transition in {Transition.DECIDED, Transition.OVERDUE}:
        actions.append(
            {"type": "Action.OpenUrl", "title": "Approve manually", "url": note.links.approve_url}
        )
    if note.links.status_url:
        actions.append(
            {"type": "Action.OpenUrl", "title": "Fleet status", "url": note.links.status_url}
        )
    return actions


def build_card(note: Notification, now: datetime) -> dict[str, Any]:
    """The Adaptive Card for one notification: full on `decided`, short otherwise."""
    title_color = "Attention" if note.transition in ATTENTION else "Default"
    body: list[dict[str, Any]] = [
        _text(describe.headline(note), size="Medium", weight="Bolder", color=title_color)
    ]
    if note.late:  # kept through the channel's outage: its age first, before any fact
        body.append(_text(f"Late: {note.late}", color="Warning", weight="Bolder"))
    event = note.event
    if note.transition is Transition.DECIDED and event is not None:
        body.append(
            _facts(
                [
                    ("What", describe.event_words(event)),
                    ("VMs", describe.vms_text(event)),
                    ("When", describe.when_text(event, now)),
                    ("Why", event.description or "no description given"),
                    ("Source", event.event_source),
                    (
                        "Decision",
                        describe.decision_text(note.decision) if note.decision else "pending",
                    ),
                    ("Waiting", note.waiting or None),
                    ("Event", event.event_id),
                ]
            )
        )
    else:
        pairs = describe.other_facts(note, event, now)
        body.append(_facts(pairs))
    if note.detail:
        body.append(_text(note.detail, isSubtle=True))
    card: dict[str, Any] = {
        "$schema": CARD_SCHEMA,
        "type": "AdaptiveCard",
        "version": CARD_VERSION,
        "body": body,
    }
    actions = _actions(note)
    if actions:
        card["actions"] = actions
    return card


def build_message(note: Notification, now: datetime) -> dict[str, Any]:
    """The envelope a Workflows 'When a Teams webhook request is received' flow expects."""
    return {
        "type": "message",
        "attachments": [
            {"contentType": CARD_CONTENT_TYPE, "contentUrl": None, "content": build_card(note, now)}
        ],
    }


def send(
    note: Notification,
    *,
    url: str,
    transport: Transport,
) -> bool:
    """Post the card; False when Teams has nothing to say about this transition."""
    if not wants(note):
        log.info("teams: %s is covered by the decided card", note.message_id())
        return False
    post_json(transport, "teams", url, dumps(build_message(note, transport.clock())))
    log.info("teams: posted %s", note.message_id())
    return True
