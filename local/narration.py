"""The demo timeline's words for what was announced, what a receiver got, what failed.

Kept apart from the orchestration so the wording is in one place; the channel code decides
whom a notification goes to (`routed`), never this module.
"""

from __future__ import annotations

from typing import Any

from local.channels import routed
from local.receivers import Received
from local.report import short_id


def subject(note: Any) -> str:
    """What a timeline line is about: the event's short id, else the VM, else the fleet."""
    return short_id(note.event.event_id) if note.event else (note.vm or "fleet")


def announcement(note: Any, channels: list[str], marks: Any = None) -> tuple[str, str, str]:
    """(kind, subject, text) for a published notification and the channels it goes to."""
    from functions.notify.describe import headline

    transition = note.transition.value
    decision = note.decision
    if transition == "decided" and decision is not None:
        kind = "decide"
        text = f"decided {decision.action.upper()} by rule {decision.rule}"
        generic = f"rule '{decision.rule}': {decision.action}"
        # A wait for a slot is said once, as the cards say it ("Waiting"), not in the reason.
        reason = decision.reason
        if note.waiting:
            reason = reason.replace(f"; {note.waiting}", "")
        if reason and reason != generic:
            text += f": {reason}"
        if note.waiting:
            text += f", {note.waiting}"
        if note.event is not None and note.event.event_status == "Started":
            text += " (already Started: nothing to approve)"
        if decision.dry_run:
            text += " [dry run]"
        if decision.policy_error:
            text += f" [policy invalid: {decision.policy_error}]"
    elif transition in ("approved", "approval_failed"):
        kind, text = "relay", headline(note)
    elif transition.startswith(("drain", "undrain")):
        kind, text = "drain", headline(note)
    else:
        kind, text = "decide", f"announced: {headline(note)}"
    if note.detail and transition != "decided":
        text += f" ({note.detail})"
    going = [name for channel in channels if (name := routed(channel, note, marks))]
    text += f" → {', '.join(going)}" if going else " → no channel sends this"
    return kind, subject(note), text


def receiver_news(record: Received) -> tuple[str, str, str, bool | None] | None:
    """(kind, subject, text, ok) for a request only a receiver saw; None: nothing new."""
    if record.channel == "drain":
        body = record.body if isinstance(record.body, dict) else {}
        vms = ", ".join(body.get("Resources") or []) or "?"
        action = "undrain" if body.get("action") == "undrain" else "drain"
        what = f"{body.get('EventType') or 'event'} {short_id(str(body.get('EventId') or '?'))}"
        text = f"customer's HTTP {action} hook called for {vms} ({what})"
        return "drain", f"{action}-hook", text, None
    if not record.accepted:
        detail = "; ".join(record.problems) or "injected failure"
        return "notify", record.channel, f"answered {record.status}: {detail}", False
    return None
