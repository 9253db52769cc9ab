"""Disruption budgets on the fleet page and in the status API: each budget's holders and
the events waiting for it, read from the budget slot rows the lifecycle writes
(functions.store.budget_slots): one query over their partitions a page."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from functions.model.budgets import DEFAULT_BUDGET
from functions.notify import describe
from functions.pipeline.context import Pipeline
from functions.store.budget_slots import BudgetSlot, BudgetSlots
from functions.store.liveness import Skipped
from functions.web import render

esc = render.esc
MAX_SHOWN = 20  # holders and waiters named per group on the page


def budget_state(pipeline: Pipeline, skipped: list[Skipped]) -> list[dict[str, Any]]:
    """Each configured budget with the groups that hold or wait for a slot (the status
    API's `budgets`); slot rows of budgets no longer in the policy too, marked so."""
    policy = pipeline.policy
    configured = {
        b.name: {"group_by": list(b.group_by), "max_unavailable": b.max_unavailable}
        for b in (policy.budgets if policy else ())
    }
    if policy is not None:
        per_set = policy.max_concurrent_per_set
        configured[DEFAULT_BUDGET] = {"group_by": ["set"], "max_unavailable": per_set}
    slots = BudgetSlots(pipeline.store.events)
    rows = [r for r in slots.budget_slots(skipped) if r.holders or r.waiting]
    out = []
    for name in [*configured, *sorted({r.budget for r in rows} - set(configured))]:
        groups = sorted((r for r in rows if r.budget == name), key=lambda r: r.group)
        out.append(
            {
                "budget": name,
                **configured.get(name, {"in_policy": False}),
                "groups": [_group(r) for r in groups],
            }
        )
    return out


def _group(row: BudgetSlot) -> dict[str, Any]:
    return {
        "group": row.group,
        "limit": row.limit,
        "out": len(row.holders),
        "over": row.over,
        "holders": [
            {
                "vm": h.vm,
                "EventId": h.event_id,
                "since": h.since.isoformat(),
                "over_budget": h.over,
            }
            for h in row.holders
        ],
        "waiting": [
            {
                "vm": w.vm,
                "EventId": w.event_id,
                "NotBefore": w.not_before.isoformat() if w.not_before else None,
                "since": w.since.isoformat(),
            }
            for w in row.waiting
        ],
        "waiting_not_listed": row.waiting_dropped,
        "text": row.text(),
    }


def budgets_section(state: list[dict[str, Any]], now: datetime, event_path: Any) -> str:
    """The fleet page's "Disruption budgets" section ("" when the policy has none and no
    slot is held)."""
    names = [b["budget"] for b in state]
    if not any(b["groups"] for b in state) and names in ([], [DEFAULT_BUDGET]):
        return ""
    rows = []
    for budget in state:
        limit = budget.get("max_unavailable", "?")
        by = ", ".join(budget.get("group_by", []))
        label = (
            f"<b>{esc(budget['budget'])}</b><br>"
            f"<small>by {esc(by)}, at most {esc(str(limit))}</small>"
        )
        if budget.get("in_policy") is False:
            label += '<br><small class="warn">no longer in the policy</small>'
        if not budget["groups"]:
            rows.append([label, "—", "nobody out", "none"])
            continue
        for group in budget["groups"]:
            rows.append(
                [
                    label,
                    f"<code>{esc(group['group'])}</code>",
                    _holders(group, event_path),
                    _waiting(group, now, event_path),
                ]
            )
            label = ""
    return "<h2>Disruption budgets</h2>" + render.table(
        ["budget", "group", "out (holders)", "waiting"], rows
    )


def _link(event_id: str, event_path: Any) -> str:
    return f'<a href="{esc(event_path(event_id))}"><code>{esc(event_id[:8])}</code></a>'


def _holders(group: dict[str, Any], event_path: Any) -> str:
    head = f"{group['out']} of {group['limit']}"
    if group["over"]:
        head = (
            f'<span class="warn">{head}: over budget by {group["over"]} (Azure started '
            "them at NotBefore)</span>"
        )
    items = [
        f"{esc(h['vm'])} {_link(h['EventId'], event_path)}"
        + (' <span class="warn">over</span>' if h["over_budget"] else "")
        for h in group["holders"][:MAX_SHOWN]
    ]
    more = len(group["holders"]) - MAX_SHOWN
    return (
        head
        + ("<br>" + "<br>".join(items) if items else "")
        + (f"<br><small>… and {more} more</small>" if more > 0 else "")
    )


def _waiting(group: dict[str, Any], now: datetime, event_path: Any) -> str:
    if not group["waiting"]:
        return "none"
    items = []
    for w in group["waiting"][:MAX_SHOWN]:
        moment = datetime.fromisoformat(w["NotBefore"]) if w["NotBefore"] else None
        when = (
            render.countdown(w["NotBefore"], describe.relative(moment, now))
            if moment
            else "no NotBefore"
        )
        items.append(f"{esc(w['vm'])} {_link(w['EventId'], event_path)} NotBefore {when}")
    more = len(group["waiting"]) - MAX_SHOWN + group["waiting_not_listed"]
    return "<br>".join(items) + (f"<br><small>… and {more} more</small>" if more > 0 else "")
