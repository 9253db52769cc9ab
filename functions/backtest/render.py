"""A backtest as a text table (people) or one JSON object (machines)."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from functions.backtest.history import span
from functions.backtest.replay import Backtest, Replayed

SOURCE_WORDS = {
    "table": "the events table",
    "graph": "a Resource Graph export",
    "documents": "the relays' recorded documents",
}


def _t(moment: datetime | None) -> str:
    return moment.strftime("%Y-%m-%d %H:%M:%S") if moment else "—"


def what(r: Replayed) -> str:
    event = r.past.event
    duration = event.duration_in_seconds
    text = event.event_type
    if duration is not None and duration > 0:
        text += f" {duration} s"
    if event.event_source:
        text += f" ({event.event_source})"
    return text


def vms(r: Replayed) -> str:
    return _names(r.past.event.resources)


def _names(names: tuple[str, ...], limit: int = 2) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" +{len(names) - limit}" if len(names) > limit else "") or "—"


def candidate(r: Replayed) -> str:
    if r.decision is None:
        return "— (no notice)"
    text = f"{r.decision.action} ({r.decision.rule})"
    if r.decision.approve_after is not None:
        text += f" at {_t(r.decision.approve_after)}"
    if r.effective != r.decision.action:
        text += f" = {r.effective}"
    return text


def mark(r: Replayed) -> str:
    changed = r.changed
    return "" if changed is None else ("≠" if changed else "=")


def _table(headers: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(headers)]
    line = "  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()
    out = [line]
    for row in rows:
        out.append("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    return out


def render_text(result: Backtest) -> str:
    """The table an operator reads: events, the worst moment of each set, the holds."""
    lines = [
        f"Backtest of {result.policy_source} against "
        f"{SOURCE_WORDS.get(result.source, result.source)}, {_t(result.since)} to "
        f"{_t(result.now)} UTC: {len(result.events)} event(s)",
    ]
    if result.events:
        rows = [
            [
                r.past.event_id[:8],
                what(r),
                vms(r),
                _t(r.decided_at or r.past.first_seen),
                _t(r.past.event.not_before),
                candidate(r),
                mark(r),
                r.past.actual or "—",
            ]
            for r in result.events
        ]
        lines += _table(
            ["EVENT", "WHAT", "VMS", "DECIDED AT", "NOTBEFORE", "CANDIDATE", "", "ACTUAL"],
            rows,
        )
        changed = result.changed
        known = [r for r in result.events if r.changed is not None]
        if known:
            lines.append(
                f"{len(changed)} of {len(known)} decision(s) differ from what the bridge decided "
                "(≠); = the same action and rule"
            )
    if result.source == "graph" and result.events:
        lines.append(
            "Resource Graph keeps no first-seen time: each event is decided as at its "
            "NotBefore, so no hold waits there (replay the events table or relay documents "
            "for that)"
        )
    notes = [r for r in result.events if r.note]
    for r in notes:
        lines.append(f"  {r.past.event_id[:8]}: {r.note}")
    lines.append("")
    lines.append(
        f"Worst concurrent impact per set (max_concurrent_per_set {result.limit}; "
        "impactful events only, before the capacity guard)"
    )
    if result.peaks:
        rows = [
            [
                f"{p.kind} {p.name}",
                str(p.peak),
                _t(p.at),
                ", ".join(i[:8] for i in p.event_ids),
                f"over by {p.over}: the guard would hold {p.over}" if p.over else "within",
            ]
            for p in result.peaks
        ]
        lines += _table(["SET", "PEAK", "AT (UTC)", "EVENTS", "LIMIT"], rows)
    else:
        lines.append("  no impactful event in a scale set or availability set")
    lines.append("")
    lines.append(f"Holds that would run to NotBefore ({len(result.holds)})")
    if result.holds:
        rows = [
            [
                h.event_id[:8],
                h.event_type,
                _names(h.resources),
                _t(h.held_from),
                _t(h.not_before),
                span(h.seconds),
                h.why,
            ]
            for h in result.holds
        ]
        lines += _table(["EVENT", "TYPE", "VMS", "HELD FROM", "NOTBEFORE", "WAIT", "WHY"], rows)
    else:
        lines.append("  none")
    if result.budgets is not None:
        lines += _budget_lines(result.budgets)
    if result.skipped:
        lines.append("")
        lines.append(f"Not replayed ({len(result.skipped)}):")
        lines += [f"  {s.where}: {s.reason}" for s in result.skipped]
    return "\n".join(lines)


def _budget_lines(replayed: Any) -> list[str]:
    """The budgets' groups at their worst, and the approvals that would have waited."""
    lines = ["", "Disruption budgets: the worst concurrent impact per group (VMs out at once)"]
    if replayed.peaks:
        rows = [
            [
                p.budget,
                p.group,
                str(p.peak),
                _t(p.at),
                _names(p.vms, 3),
                str(p.limit),
                f"over by {p.over}: {p.peak_enforced} with the budget" if p.over else "within",
            ]
            for p in replayed.peaks
        ]
        lines += _table(["BUDGET", "GROUP", "PEAK", "AT (UTC)", "VMS", "LIMIT", ""], rows)
    else:
        lines.append("  no disruptive event in any budget's group")
    lines.append("")
    lines.append(f"Approvals that would have waited for a budget ({len(replayed.waits)})")
    if replayed.waits:
        rows = [
            [
                w.event_id[:8],
                _names(w.vms),
                w.budget,
                w.group,
                _names(w.holders) if w.holders else "—",
                _t(w.waited_from),
                _t(w.until),
                span(w.seconds),
                ("reached NotBefore: " + ("over budget" if w.over else "started then"))
                if w.at_not_before
                else "",
            ]
            for w in replayed.waits
        ]
        headers = ["EVENT", "VMS", "BUDGET", "GROUP", "HELD BY", "FROM", "TO", "WAIT", ""]
        lines += _table(headers, rows)
    else:
        lines.append("  none")
    if replayed.unplaced:
        lines.append(
            f"  {len(replayed.unplaced)} VM(s) without Azure's placement (counted only in "
            f"their event's set): {_names(tuple(replayed.unplaced), 10)}"
        )
    return lines


def budgets_json(replayed: Any) -> dict[str, Any] | None:
    if replayed is None:
        return None

    def iso(moment: datetime | None) -> str | None:
        return moment.isoformat() if moment else None

    return {
        "budgets": [b.model_dump(mode="json") for b in replayed.budgets],
        "peaks": [
            {
                "budget": p.budget,
                "group": p.group,
                "limit": p.limit,
                "peak": p.peak,
                "at": iso(p.at),
                "vms": list(p.vms),
                "over": p.over,
                "peak_with_budgets": p.peak_enforced,
            }
            for p in replayed.peaks
        ],
        "waits": [
            {
                "EventId": w.event_id,
                "Resources": list(w.vms),
                "budget": w.budget,
                "group": w.group,
                "held_by": list(w.holders),
                "from": iso(w.waited_from),
                "until": iso(w.until),
                "seconds": w.seconds,
                "at_not_before": w.at_not_before,
                "over": w.over,
            }
            for w in replayed.waits
        ],
        "unplaced": list(replayed.unplaced),
    }


def to_json(result: Backtest) -> dict[str, Any]:
    """The same as one JSON object (times ISO 8601 UTC)."""

    def iso(moment: datetime | None) -> str | None:
        return moment.isoformat() if moment else None

    return {
        "source": result.source,
        "policy": result.policy_source,
        "since": iso(result.since),
        "now": iso(result.now),
        "max_concurrent_per_set": result.limit,
        "events": [
            {
                "EventId": r.past.event_id,
                "EventType": r.past.event.event_type,
                "EventSource": r.past.event.event_source,
                "DurationInSeconds": r.past.event.duration_in_seconds,
                "Resources": list(r.past.event.resources),
                "NotBefore": iso(r.past.event.not_before),
                "scale_sets": list(r.past.scale_sets),
                "availability_sets": list(r.past.availability_sets),
                "first_seen": iso(r.past.first_seen),
                "decided_at": iso(r.decided_at),
                "candidate": None
                if r.decision is None
                else {
                    "action": r.decision.action,
                    "rule": r.decision.rule,
                    "reason": r.decision.reason,
                    "approve_after": iso(r.decision.approve_after),
                    "page": r.decision.page,
                    "dry_run": r.decision.dry_run,
                },
                "effective": r.effective or None,
                "note": r.note or None,
                "actual": {
                    "action": r.past.actual_action,
                    "rule": r.past.actual_rule,
                    "text": r.past.actual,
                    "started_at": iso(r.past.started_at),
                    "ended_at": iso(r.past.ended_at),
                    "end": r.past.end or None,
                },
                "changed": r.changed,
                "impactful": r.impactful,
                "impact": {"start": iso(r.impact_start), "end": iso(r.impact_end)},
            }
            for r in result.events
        ],
        "sets": [
            {
                "kind": p.kind,
                "name": p.name,
                "peak": p.peak,
                "at": iso(p.at),
                "EventIds": list(p.event_ids),
                "over": p.over,
            }
            for p in result.peaks
        ],
        "holds": [
            {
                "EventId": h.event_id,
                "EventType": h.event_type,
                "Resources": list(h.resources),
                "held_from": iso(h.held_from),
                "NotBefore": iso(h.not_before),
                "seconds": h.seconds,
                "rule": h.rule,
                "why": h.why,
            }
            for h in result.holds
        ],
        "budgets": budgets_json(result.budgets),
        "skipped": [{"where": s.where, "reason": s.reason} for s in result.skipped],
        "summary": {
            "events": len(result.events),
            "changed": len(result.changed),
            "compared": len([r for r in result.events if r.changed is not None]),
            "holds": len(result.holds),
            "sets_over_limit": len([p for p in result.peaks if p.over]),
            **(
                {
                    "budget_groups_over_limit": len([p for p in result.budgets.peaks if p.over]),
                    "budget_waits": len(result.budgets.waits),
                }
                if result.budgets
                else {}
            ),
        },
    }


def dumps(result: Backtest) -> str:
    return json.dumps(to_json(result), indent=2)
