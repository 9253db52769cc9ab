"""Structured log lines the alerts and the workbook query (infra/modules/monitoring.bicep).

One line per published transition, one per watchdog run (what the sweep itself did) and
one per reconcile of a work item (what was done for that event), each written twice over: as
the message `sebridge {json}` (what Application Insights' `traces.message` always has,
whatever the worker does with extra fields) and as logging `extra` (customDimensions where
the worker forwards them). The field names below are a contract: the KQL in the Bicep
uses only these, and tests/infra/test_monitoring.py checks it.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from functions.model.event import Notification

log = logging.getLogger("sebridge.telemetry")

PREFIX = "sebridge "
KINDS = ("transition", "watchdog_run", "reconciled", "manual_approval", "admission")
# Every field any line carries; `kind` says which line it is.
FIELDS = (
    "kind",
    "transition",
    "message_id",
    "event_id",
    "event_type",
    "event_status",
    "vm",
    "vms",
    "scale_sets",
    "availability_sets",
    "rule",
    "action",
    "dry_run",
    "page",
    "severity",
    "detail",
    "occurred_at",
    "not_before",
    "by",
    "outcome",
    "silent",
    "due",
    "handed",
    "skipped_rows",
    "published",
    "approval",
    "ended",
    "redecided",
    "closed",
    "admitted",
    "rejected",
    "unverified",
    "checks",
)


def emit(kind: str, fields: dict[str, Any], level: int = logging.INFO) -> dict[str, Any]:
    """Write one line; returns what it wrote (for tests)."""
    if kind not in KINDS:
        raise ValueError(f"unknown telemetry kind {kind!r}")
    unknown = set(fields) - set(FIELDS)
    if unknown:
        raise ValueError(f"fields outside the contract: {sorted(unknown)}")
    line = {"kind": kind, **fields}
    log.log(
        level,
        PREFIX + json.dumps(line, default=str, separators=(",", ":")),
        extra={f"sebridge_{k}": v for k, v in line.items()},
    )
    return line


def transition(note: Notification) -> dict[str, Any]:
    """A transition that was published to the topic."""
    event, decision = note.event, note.decision
    return emit(
        "transition",
        {
            "transition": note.transition.value,
            "message_id": note.message_id(),
            "event_id": event.event_id if event else None,
            "event_type": event.event_type if event else None,
            "event_status": event.event_status if event else None,
            "vm": note.vm,
            "vms": list(event.resources) if event else [],
            "scale_sets": list(event.scale_sets) if event else [],
            "availability_sets": list(event.availability_sets) if event else [],
            "rule": decision.rule if decision else None,
            "action": decision.action if decision else None,
            "dry_run": decision.dry_run if decision else False,
            "page": getattr(note, "page", None),
            "severity": decision.severity if decision else None,
            "detail": note.detail[:500],
            "occurred_at": note.occurred_at.isoformat(),
            "not_before": event.not_before.isoformat() if event and event.not_before else None,
        },
        logging.WARNING if note.transition.value in ATTENTION else logging.INFO,
    )


ATTENTION = {
    "approval_failed",
    "drain_failed",
    "overdue",
    "relay_silent",
    "policy_invalid",
    "config_invalid",
}


def watchdog_run(report: Any) -> dict[str, Any]:
    """The watchdog ran (the alert "watchdog not running" looks for the absence of this):
    what the sweep itself did. In Azure it reconciles nothing itself: it hands the due
    events' keys to the work queue (`handed` of `due`), and each reconcile writes its own
    line (`reconciled`), so overdue events, approvals and ends are counted there, not here
    (issue 46: they read 0 here in Azure)."""
    return emit(
        "watchdog_run",
        {
            "silent": len(report.silent),
            "due": report.due,
            "handed": report.handed,
            "skipped_rows": report.skipped_rows,
        },
    )


def reconciled(done: Any) -> dict[str, Any]:
    """What one reconcile of a work item did for its event (functions.pipeline.results
    .Reconciled): the transitions it published, its approval's outcome, whether it ended,
    was decided again or closed."""
    approval = done.approval
    return emit(
        "reconciled",
        {
            "event_id": done.event_id,
            "published": [t.value for t in done.published],
            "approval": approval.outcome if approval is not None else None,
            "ended": done.ended or None,
            "redecided": done.redecided,
            "closed": done.closed,
        },
    )


def manual_approval(event_id: str, by: str, outcome: str, detail: str) -> dict[str, Any]:
    return emit(
        "manual_approval",
        {"event_id": event_id, "by": by, "outcome": outcome, "detail": detail[:500]},
    )


def admission(admitted: int, rejected: int, unverified: int, checks: dict[str, int]) -> dict:
    """What admission judged since this process's last line (at most one a minute,
    functions.pipeline.admission_tally): the rejection-rate alert sums these. `unverified`
    counts messages whose attestation failed in ATTESTATION_MODE=report (admitted by their
    VM's enrolled key, or rejected), `checks` those by the check that failed."""
    return emit(
        "admission",
        {
            "admitted": admitted,
            "rejected": rejected,
            "unverified": unverified,
            "checks": checks,
        },
        logging.WARNING if unverified else logging.INFO,
    )
