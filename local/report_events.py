"""One row per event for the demo report, in the words a reader needs first: how it ended,
who or which rule decided, the drain's start and end, the approval, who was told.

Pure functions of what the parts observed (the simulator's track of the event, the
announcements the host published, the StartRequests IMDS received, what each channel
posted), so a test can give them any history. Three things the raw facts would say wrong:
an event IMDS showed already `Started` (a host failure) is decided and announced like any
other (the reference policy holds it, and a held Reboot pages) but has nothing to approve;
an event Azure withdrew is *cancelled*, not held;
and PagerDuty's resolve of an event that never paged is a no-op, not news.
"""

from __future__ import annotations

from collections import Counter
from datetime import datetime
from typing import Any

from local.report import EventRow


def final_state(track: Any, transitions: dict[str, datetime]) -> str:
    """How the event ended, from the announcements first and the simulator's view second."""
    started = track.first_status == "Started" or track.started_wall is not None
    if "cancelled" in transitions or (track.removed_at is not None and not started):
        return "cancelled: Azure withdrew it before it started"
    if "completed" in transitions or (track.removed_at is not None and started):
        return "completed"
    if started:
        return "started, still running when the demo ended"
    return "still scheduled when the demo ended"


STARTED = "already Started when IMDS first showed it (host failure): nothing to approve"


def decision_text(track: Any, notes: list[Any]) -> str:
    decided = [n for n in notes if _transition(n) == "decided" and n.decision is not None]
    if track.first_status == "Started":
        if not decided:
            return f"no decision announced: {STARTED}"
        d = decided[-1].decision
        return f"{d.action} by rule {d.rule}: {STARTED}"
    if not decided:
        failed = [n for n in notes if _transition(n) == "policy_invalid"]
        return "policy invalid: failing closed" if failed else "no decision announced"
    d = decided[-1].decision
    generic = f"rule {d.rule!r}: {d.action}"
    text = f"{d.action} by rule {d.rule}"
    if d.reason and d.reason != generic:
        text += f": {d.reason}"
    return text + (" [dry run: nothing approved]" if d.dry_run else "")


def drain_text(notes: list[Any]) -> str:
    """When the drain started and how it ended (approved after it, or failed)."""
    starts = [n for n in notes if _transition(n) == "drain_started"]
    if not starts:
        return ""
    begun = starts[0].occurred_at
    text = f"started {begun:%H:%M:%S}"
    for note in notes:
        if note.occurred_at < begun:
            continue
        kind = _transition(note)
        if kind == "drain_failed":
            return f"{text}, FAILED {note.occurred_at:%H:%M:%S}: {note.detail or 'no detail'}"
        if kind == "approved":
            seconds = (note.occurred_at - begun).total_seconds()
            text = f"{text}, done {note.occurred_at:%H:%M:%S} ({seconds:.1f} s)"
            break
    else:
        text += ", not finished"
    undone = [n for n in notes if _transition(n) in ("undrained", "undrain_failed")]
    if undone:
        last = undone[-1]
        word = "undrained" if _transition(last) == "undrained" else "undrain FAILED"
        text += f"; {word} {last.occurred_at:%H:%M:%S}"
    return text


def approval_text(track: Any, notes: list[Any], approvals: list[Any]) -> str:
    if track.first_status == "Started":
        return "none needed"
    if not approvals:
        failed = [n for n in notes if _transition(n) == "approval_failed"]
        if failed:
            return f"FAILED: {failed[-1].detail or 'no relay could approve'}; started at NotBefore"
        return "not approved" + (": started at NotBefore" if track.started_wall else "")
    first = approvals[0]
    if first.vm.startswith("arm:"):  # the simulator's record of Resource Manager's acknowledge
        vm = first.vm.rsplit("/", 1)[-1]
        who = f"Resource Manager acknowledged it for {vm} (no relay could)"
    else:
        who = f"StartRequests from {first.vm}'s relay"
    if track.not_before is None:
        return who
    lead = (track.not_before - first.at).total_seconds()
    return f"{who}, {lead:.1f} s before NotBefore"


def told_text(deliveries: list[Any]) -> str:
    """Who was told: a channel that failed first (it did not tell anyone, and says why),
    then the channels that posted, counted; PagerDuty's resolves only where it had paged.
    A delivery neither posted nor failed is a transition its channel does not send."""
    failed = Counter(
        (d.channel, _first_line(d.error)) for d in deliveries if getattr(d, "error", None)
    )
    posted = [d for d in deliveries if d.posted and not getattr(d, "error", None)]
    paged = any(d.channel == "pagerduty" and d.action == "trigger" for d in posted)
    counts = Counter(
        f"PagerDuty {d.action}" if d.channel == "pagerduty" and d.action else d.channel
        for d in posted
        if paged or not (d.channel == "pagerduty" and d.action == "resolve")
    )
    text = ", ".join(f"{name} x{n}" if n > 1 else name for name, n in sorted(counts.items()))
    text += "" if paged else ("; never paged" if text else "never paged")
    if failed:
        named = "; ".join(
            f"{channel}{f' x{n}' if n > 1 else ''} ({why})"
            for (channel, why), n in sorted(failed.items())
        )
        text = f"FAILED: {named}; {text}"
    return text


def _first_line(error: str) -> str:
    return (error.splitlines() or [""])[0][:160]


def event_row(
    track: Any, notes: list[Any], approvals: list[Any], deliveries: list[Any]
) -> EventRow:
    notes = sorted(notes, key=lambda n: n.occurred_at)
    transitions = {_transition(n): n.occurred_at for n in notes}
    return EventRow(
        event_id=track.event_id,
        what=f"{track.what} ({track.source or '?'})",
        vms=", ".join(track.resources) or "none named",
        story=track.step.story if track.step else "",
        decision=decision_text(track, notes),
        approval=approval_text(track, notes, approvals),
        channels=told_text(deliveries),
        final_state=final_state(track, transitions),
        drain=drain_text(notes),
    )


def _transition(note: Any) -> str:
    return getattr(note.transition, "value", str(note.transition))
