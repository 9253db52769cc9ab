"""What the status API and the fleet page both show, computed once from the store."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from functions.identity.graph_state import graph_state
from functions.ledger import LedgerLine, ledger_lines
from functions.notify import describe
from functions.pipeline.admission_tally import read_report
from functions.pipeline.context import Pipeline
from functions.pipeline.coverage import coverage_state
from functions.store.liveness import Skipped
from functions.store.records import EventRecord
from functions.web.budgets import budget_state
from functions.web.timeline import Lane, Mark

MAX_UNREADABLE_LISTED = 20  # unreadable rows a page names (all are counted and logged)


def event_view(record: EventRecord) -> dict[str, Any]:
    """One event as the status API returns it."""
    decision = record.decision
    return {
        **record.snapshot().imds_fields(),
        "first_seen": record.first_seen.isoformat(),
        "reporters": record.reporters,
        "ended": record.ended or None,
        "decision": decision.model_dump(mode="json") if decision else None,
        "approval": record.approval or None,
        "approval_reason": record.approval_reason or None,
        "approved_by": record.approved_by,
        "approve_after": record.approve_after.isoformat() if record.approve_after else None,
        "approval_attempts": len(record.approval_attempts),
        "announced": sorted(k for k, v in record.announced.items() if v == "done"),
        # Reporters' views that differ (functions.pipeline.decide): the decision above is
        # then the strictest; each view's own decision is listed with who first showed it.
        "views_differ": record.views_differ,
        "views": [
            {"first_vm": e.first_vm, "action": e.decision.action, "rule": e.decision.rule}
            for e in record.views
        ],
        # The impact ledger (functions/ledger.py): per VM, advertised beside measured.
        "ledger": [
            line.model_dump(mode="json")
            for line in ledger_lines(
                record, record.ledger, record.past_reporters, record.ledger_unreadable
            )
        ],
    }


def views_text(record: EventRecord) -> str:
    """The views' differences in words, for the fleet and event pages ("" when agreed)."""
    if not record.views_differ:
        return ""
    each = "; ".join(f"{e.first_vm}: {e.decision.action}" for e in record.views)
    return f"views differ ({', '.join(record.views_differ)}): {each}; the stricter applies"


def fleet_events(
    pipeline: Pipeline, include_ended: bool, skipped: list[Skipped] | None = None
) -> list[EventRecord]:
    """Open events (or all), soonest NotBefore first: what needs attention next. Rows that
    cannot be read are skipped and added to `skipped` (`unreadable_state` shows them)."""
    events = pipeline.store.list_events(include_ended=include_ended, skipped=skipped)
    for record in events:
        # Reporters are rows of their own: one query per open event (per event with
        # `?all=true`, for the ended ones' impact ledger), their measurements included.
        pipeline.store.load_reporters(record, ledger=True, skipped=skipped)
    events.sort(key=lambda r: (r.not_before is None, r.not_before or r.first_seen))
    return events


def unreadable_state(skipped: list[Skipped]) -> dict[str, Any] | None:
    """Stored rows a page could not read and left out: how many, and the first ones named
    (table/partition/row: why), so one bad row is seen without costing the page (None
    when every row was read)."""
    if not skipped:
        return None
    return {"count": len(skipped), "rows": [str(s) for s in skipped[:MAX_UNREADABLE_LISTED]]}


def policy_state(pipeline: Pipeline) -> dict[str, Any]:
    load = pipeline.settings.policy
    return {
        "valid": load.policy is not None,
        "error": load.error,
        "dry_run": bool(load.policy and load.policy.dry_run),
    }


def attestation_state(pipeline: Pipeline) -> dict[str, Any] | None:
    """None while attestation is enforced; else the mode and what it let through (one Table
    read, only in report mode)."""
    if pipeline.settings.attestation_mode == "enforce":
        return None
    report = read_report(pipeline.store.events)
    return {
        "mode": pipeline.settings.attestation_mode,
        "unverified": report or {"total": 0, "by_check": {}, "since": None, "last": None},
    }


def fleet_status(pipeline: Pipeline, include_ended: bool) -> dict[str, Any]:
    """The status API's body."""
    skipped: list[Skipped] = []
    events = [event_view(r) for r in fleet_events(pipeline, include_ended, skipped)]
    return {
        "generated_at": pipeline.clock.now().isoformat(),
        "policy": policy_state(pipeline),
        "attestation": attestation_state(pipeline),
        # A Resource Graph configuration error in force (functions.identity.graph_state).
        "resource_graph": graph_state(pipeline.store.events),
        "events": events,
        # Disruption budgets: each one's groups with holders and waiting events.
        "budgets": budget_state(pipeline, skipped),
        # Coverage (functions.pipeline.coverage): VMs in scope with no relay heard, relays
        # silent, versions, contracts, the drain each VM has; None before the first pass.
        "coverage": coverage_state(pipeline),
        # Rows left out because they cannot be read (None: none).
        "unreadable_rows": unreadable_state(skipped),
    }


def lane_label(record: EventRecord) -> str:
    vms = ", ".join(record.resources[:3]) + (" …" if len(record.resources) > 3 else "")
    return f"{record.event_type} {vms or record.event_id[:8]}"


def event_lane(record: EventRecord, ledger: Sequence[LedgerLine] = ()) -> Lane:
    """The event's lane: what the store knows happened to it, and when; with its impact
    `ledger`, when each VM's relay saw it Started and saw it leave IMDS."""
    marks = [Mark(record.first_seen, "scheduled", f"first seen {record.event_status}")]
    for line in ledger:
        if line.started_seen is not None:
            marks.append(Mark(line.started_seen, "started", f"{line.vm}: its relay saw Started"))
        if line.left_at is not None:
            text = (
                f"{line.vm}: left IMDS (longest poll gap {line.max_poll_gap_s:g} s, "
                f"wall clock {line.wall_jump_s:+g} s)"
            )
            marks.append(Mark(line.left_at, "removed", text))
    if record.not_before is not None:
        marks.append(Mark(record.not_before, "not_before", "NotBefore"))
    if record.decision is not None and record.decided_at is not None:
        text = f"decided {record.decision.action.upper()} by rule {record.decision.rule}"
        marks.append(Mark(record.decided_at, "decided", text))
    attempts = record.approval_attempts
    if record.approval in ("approved", "failed") and attempts:
        kind = "approved" if record.approval == "approved" else "approval_failed"
        last = attempts[-1]
        marks.append(Mark(last.at, kind, f"{kind.replace('_', ' ')} ({last.by}, {last.vm})"))
    if record.ended and record.ended_at is not None:
        marks.append(Mark(record.ended_at, "removed", record.ended))
    return Lane(key=record.event_id, label=lane_label(record), marks=tuple(marks))


def countdown(moment: datetime | None, now: datetime) -> str:
    return describe.relative(moment, now) if moment else "not given"
