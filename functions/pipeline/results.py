"""What ingesting one message did (shared by the relay and Event Grid sources), and what
one reconcile did (functions.pipeline.reconcile).

A module of its own so that neither source imports the other (they share only this and
the stages below them).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field

from functions.model.event import Transition
from functions.pipeline.approval_record import ApprovalResult


class IngestResult(BaseModel):
    outcome: Literal["processed", "stale", "rejected", "retry", "preflight"]
    vm: str | None = None
    reason: str = ""
    transitions: list[tuple[str, str]] = Field(default_factory=list)  # (EventId, transition)
    approvals: list[ApprovalResult] = Field(default_factory=list)
    # Events a VM listed that do not name it: it speaks only for itself, so they are left
    # out of its report (counted, not rejected: an old relay forwards its set's events).
    ignored_events: int = 0


@dataclass
class Reconciled:
    """What one reconcile did (for logs, results and tests)."""

    event_id: str
    published: list[Transition] = field(default_factory=list)
    approval: ApprovalResult | None = None
    waiting_for_capacity: bool = False
    ended: str = ""  # why it ended in this reconcile ("" if it did not)
    redecided: bool = False
    settled: str = ""  # the path of an approval recorded after its answer was lost
    closed: bool = False
    next_at: datetime | None = None
