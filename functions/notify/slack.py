"""Slack: a Block Kit message posted to a Slack incoming webhook.

The same rules as Teams (functions.notify.teams): one post per transition (the deliveries
ledger claims each announcement once per channel), `scheduled` skipped because the
`decided` message that always follows it carries everything it knew, the full message on
`decided` and short follow-ups after, and the same buttons: "Approve manually" (the
signed-in approval page) on `decided` and `overdue`, "Fleet status" always when the app
has a public URL.

Most of the text comes from VMs (EventId, names, Description, relay answers), so none of
it is ever `mrkdwn`: every VM-sourced text is a `plain_text` object (no bold, no links, no
`<!channel>` mentions are parsed there), on one line (`describe.plain`), with anything a
linkifier would turn into a link broken by a zero-width space (as in Teams). The top-level
`text` (the notification's fallback, which Slack parses as mrkdwn unless told otherwise)
has `mrkdwn: false` and `&`, `<`, `>` written as Slack's entities, the three characters
Slack says must be escaped. Every limit Block Kit documents (header 150 characters, a
section field 2,000, ten fields, button text 75, URL 3,000, 50 blocks) is kept here, and
tests check each message with the official SDK's block models (slack_sdk).
"""

from __future__ import annotations

import logging
from dataclasses import replace
from datetime import datetime
from typing import Any

from functions.model.event import Notification, Transition
from functions.notify import describe
from functions.notify.delivery import Transport, dumps, post_json
from functions.notify.pacing import SLACK_PACER, PacedSession, WebhookPacer
from functions.notify.teams import ATTENTION, SKIPPED

log = logging.getLogger(__name__)

# Block Kit's documented limits (https://api.slack.com/reference/block-kit/blocks).
HEADER_MAX = 150  # header block: plain_text
FIELD_MAX = 2000  # section: each field
FIELDS_MAX = 10  # section: fields
CONTEXT_MAX = 3000  # context: a text element (the section text limit)
BUTTON_TEXT_MAX = 75
URL_MAX = 3000
FALLBACK_MAX = 3000  # the top-level text: a notification preview, kept short

APPROVE_ACTION_ID = "approve"  # Slack requires action_id to be unique within a message
STATUS_ACTION_ID = "fleet-status"


def wants(note: Notification) -> bool:
    """The same transitions as Teams: all but `scheduled` (the `decided` post covers it)."""
    return note.transition not in SKIPPED


def inert(text: str, limit: int) -> str:
    """`text` as a `plain_text` value shows it literally: one line, no link, within `limit`."""
    text = describe.unlinked(describe.plain(text))
    return text if len(text) <= limit else text[: limit - 1] + "…"


def escaped(text: str) -> str:
    """`text` for a field Slack parses for `<...>` links and mentions: its entities."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _plain(text: str, limit: int) -> dict[str, Any]:
    return {"type": "plain_text", "text": inert(text, limit), "emoji": False}


def _fields(pairs: list[tuple[str, str | None]]) -> dict[str, Any]:
    """A section of "Label: value" fields (plain text: the values come from VMs)."""
    fields = [_plain(f"{label}: {value}", FIELD_MAX) for label, value in pairs if value]
    return {"type": "section", "fields": fields[:FIELDS_MAX]}


def _buttons(note: Notification) -> list[dict[str, Any]]:
    buttons = []
    approve = note.links.approve_url
    if approve and note.transition in {Transition.DECIDED, Transition.OVERDUE}:
        buttons.append(_button("Approve manually", approve, APPROVE_ACTION_ID, primary=True))
    if note.links.status_url:
        buttons.append(_button("Fleet status", note.links.status_url, STATUS_ACTION_ID))
    return [b for b in buttons if b is not None]


def _button(title: str, url: str, action_id: str, primary: bool = False) -> dict[str, Any] | None:
    if len(url) > URL_MAX:
        log.warning(
            "slack: a %s link longer than Slack's %d characters is left out", title, URL_MAX
        )
        return None
    button: dict[str, Any] = {
        "type": "button",
        "text": {"type": "plain_text", "text": title[:BUTTON_TEXT_MAX], "emoji": False},
        "url": url,
        "action_id": action_id,
    }
    if primary:
        button["style"] = "primary"
    return button


def build_blocks(note: Notification, now: datetime) -> list[dict[str, Any]]:
    """The blocks of one notification: full on `decided`, short otherwise."""
    headline = describe.headline(note)
    if note.transition in ATTENTION:
        headline = "Attention: " + headline
    blocks: list[dict[str, Any]] = [{"type": "header", "text": _plain(headline, HEADER_MAX)}]
    if note.late:  # kept through the channel's outage: its age first, before any fact
        blocks.append({"type": "context", "elements": [_plain(f"Late: {note.late}", CONTEXT_MAX)]})
    event = note.event
    pairs: list[tuple[str, str | None]]
    if note.transition is Transition.DECIDED and event is not None:
        pairs = [
            ("What", describe.event_words(event)),
            ("VMs", describe.vms_text(event)),
            ("When", describe.when_text(event, now)),
            ("Why", event.description or "no description given"),
            ("Source", event.event_source),
            ("Decision", describe.decision_text(note.decision) if note.decision else "pending"),
            ("Waiting", note.waiting or None),
            ("Event", event.event_id),
        ]
    else:
        pairs = describe.other_facts(note, event, now)
    blocks.append(_fields(pairs))
    if note.detail:
        blocks.append({"type": "context", "elements": [_plain(note.detail, CONTEXT_MAX)]})
    buttons = _buttons(note)
    if buttons:
        blocks.append({"type": "actions", "elements": buttons})
    return blocks


def build_message(note: Notification, now: datetime) -> dict[str, Any]:
    """The incoming-webhook body: the blocks, and the plain fallback text notifications show."""
    fallback = escaped(inert(describe.headline(note), FALLBACK_MAX))
    return {"text": fallback, "mrkdwn": False, "blocks": build_blocks(note, now)}


def send(
    note: Notification, *, url: str, transport: Transport, pacer: WebhookPacer | None = None
) -> bool:
    """Post the message; False when Slack has nothing to say about this transition.

    Slack answers 200 "ok"; 400 `invalid_payload`, 403 `action_prohibited`, 404
    `no_service` / `channel_not_found` and 410 `channel_is_archived` cannot be fixed by a
    retry (recorded as rejected); 429 is retried after its Retry-After (delivery.post_json),
    and holds every other post to the webhook as long (functions.notify.pacing). Posts to
    one webhook go out about one a second, as Slack asks (`pacer`, else the transport's,
    else the process's).
    """
    if not wants(note):
        log.info("slack: %s is covered by the decided message", note.message_id())
        return False
    pacer = pacer or transport.pacer or SLACK_PACER
    paced = replace(transport, session=PacedSession(transport.session, pacer, transport.sleep))
    post_json(paced, "slack", url, dumps(build_message(note, transport.clock())))
    log.info("slack: posted %s", note.message_id())
    return True
