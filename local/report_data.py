"""What the demo's HTML report shows besides the log: gathered from what each part observed.

The chart and the table come from the simulator's ground truth (documents, StartRequests),
the announcements the local host published, and what each channel was handed; the payloads
are what the local receivers actually got. Nothing here is what the plan expected.
"""

from __future__ import annotations

import json
import re
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from functions.ledger import table_rows
from functions.web.timeline import Lane, Mark
from local.demo_backtest import report_backtest
from local.report import Payload, ReportData, short_id
from local.report_events import event_row

if TYPE_CHECKING:
    from local.demo_state import DemoState

# The drain's steps on an event's lane: when it started and how it ended.
DRAIN_MARKS = {
    "drain_started": "drain started",
    "drain_failed": "drain failed",
    "undrained": "undrained",
    "undrain_failed": "undrain failed",
}


def collect(demo: DemoState) -> ReportData:
    data = ReportData()
    _policy(demo, data)
    if demo.watcher is None:
        return data
    published = list(demo.publisher.published) if demo.publisher is not None else []
    deliveries = demo.recorded_deliveries()
    for track in sorted(demo.watcher.snapshot().values(), key=lambda t: t.first_seen):
        notes = [n for n in published if n.event and n.event.event_id == track.event_id]
        approvals = [a for a in demo.watcher.approvals if a.event_id == track.event_id]
        marks = [
            Mark(
                track.first_seen_wall,
                "started" if track.first_status == "Started" else "scheduled",
                f"IMDS showed it {track.first_status}",
            )
        ]
        if track.not_before is not None:
            marks.append(Mark(track.not_before, "not_before", "NotBefore"))
        for note in notes:
            if note.transition.value == "decided" and note.decision is not None:
                d = note.decision
                marks.append(Mark(note.occurred_at, "decided", f"decided {d.action} ({d.rule})"))
            elif note.transition.value == "approval_failed":
                marks.append(Mark(note.occurred_at, "approval_failed", "approval failed"))
            elif note.transition.value in DRAIN_MARKS:
                marks.append(Mark(note.occurred_at, "drain", DRAIN_MARKS[note.transition.value]))
        for approval in approvals:
            marks.append(Mark(approval.at, "approved", f"StartRequests from {approval.vm}"))
        if track.started_wall is not None and track.first_status != "Started":
            marks.append(Mark(track.started_wall, "started", "Started"))
        if track.removed_at is not None:
            gone = track.first_seen_wall + timedelta(seconds=track.removed_at - track.first_seen)
            marks.append(Mark(gone, "removed", "removed from the documents"))
        label = f"{track.what} {', '.join(track.resources)}"
        data.lanes.append(Lane(key=track.event_id, label=label, marks=tuple(marks)))
        told = [d for d in deliveries if d.event_id == track.event_id and (d.posted or d.error)]
        data.events.append(event_row(track, notes, approvals, told))
    data.payloads = _payloads(demo)
    data.deliveries = len(deliveries)
    data.posted = sum(1 for d in deliveries if d.posted)
    data.failed = [
        (d.channel, short_id(d.event_id) if d.event_id else d.message_id, d.transition, d.error)
        for d in deliveries
        if d.error
    ]
    data.backtest = report_backtest(demo)
    # Each Freeze's impact ledger (local.demo_ledger), as the event page shows it.
    data.ledgers = [(label, table_rows(lines)) for label, lines in getattr(demo, "ledgers", [])]
    return data


def _policy(demo: DemoState, data: ReportData) -> None:
    settings = getattr(demo, "settings", None)
    data.policy_source = getattr(demo, "policy_source", "")
    if settings is None:
        data.policy = "the local functions host did not start"
        return
    load = settings.policy
    if load.policy is None:
        data.policy = f"INVALID, failing closed (nothing is approved): {load.error}"
        return
    data.policy = json.dumps(load.policy.model_dump(mode="json"), indent=2)


def _payloads(demo: DemoState) -> list[Payload]:
    out = []
    for channel, receiver in demo.receivers.items():
        for record in receiver.received:
            body = record.body
            if channel == "teams":
                summary = f"card: {_card_title(body)}"
            elif channel == "pagerduty" and isinstance(body, dict):
                summary = f"{body.get('event_action')} {body.get('dedup_key', '')}"
            elif channel == "slack" and isinstance(body, dict):
                summary = f"message: {str(body.get('text', ''))[:120]}"
            elif channel == "webhook" and isinstance(body, dict):
                summary = str(body.get("type", ""))
            else:
                summary = "drain request"
            subject = _subject(body)
            try:
                pretty = json.dumps(body, indent=2) if body is not None else record.raw.decode()
            except (TypeError, UnicodeDecodeError):
                pretty = repr(record.raw[:2000])
            out.append(
                Payload(
                    channel=channel,
                    subject=subject,
                    summary=summary,
                    at=datetime.fromtimestamp(record.at).astimezone(),
                    status=record.status,
                    body=pretty,
                )
            )
    return sorted(out, key=lambda p: p.at)


GUID = re.compile(r"[0-9A-Fa-f]{8}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{12}")


def _subject(body: Any) -> str:
    """The event a payload is about (its short id), or the key it names."""
    text = json.dumps(body) if body is not None else ""
    found = GUID.search(text)
    if found:
        return short_id(found[0])
    for key in ('"dedup_key": "', '"subject": "'):
        if key in text:
            return text.split(key, 1)[1].split('"', 1)[0]
    return ""


def _card_title(body: Any) -> str:
    try:
        return str(body["attachments"][0]["content"]["body"][0]["text"])[:120]
    except (KeyError, IndexError, TypeError):
        return "?"
