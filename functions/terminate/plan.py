"""What a drain may take and what an undrain must undo, as pure functions of the event and
the drain's step rows (`functions.store.drains`): the drain deadlines a step is retried
until, and the steps an undrain undoes. No I/O, so the lifecycle can ask them of a row.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import NamedTuple

from functions.store.drains import StepRecord
from functions.terminate.settings import DrainSettings

HTTP_STEP = "http"
HOOK_STEP = "hook:"  # + VM name: the operator's relay hook (DRAIN__RELAY_HOOK)
# Details of rows written before StepRecord.reached existed that mean the step never
# reached its receiver.
NEVER_STARTED = ("no time left before the deadline", "no relay known")


class DrainDeadlines(NamedTuple):
    """`approve_by`: NotBefore less the safety margin, when the approval must be over.
    `drain_until`: that less the approval reserve; every drain step, and every retry of a
    target that cannot be reached, ends by then."""

    approve_by: datetime
    drain_until: datetime


def drain_deadlines(
    not_before: datetime, event_type: str, settings: DrainSettings
) -> DrainDeadlines:
    """The deadlines of a drain of an event with this NotBefore and type (a Preempt's
    margins are its own: DrainSettings.margins)."""
    margin, reserve = settings.margins(event_type)
    approve_by = not_before - timedelta(seconds=margin)
    return DrainDeadlines(approve_by, approve_by - timedelta(seconds=reserve))


def reached(record: StepRecord | None) -> bool:
    """Whether a drain step may have had an effect, so an undrain has it to undo: its row
    says so (`reached`), or, for a row without that field, it got further than the two
    failures that never call anything. A step still running (its runner lost) may have."""
    if record is None:
        return False
    if record.reached is not None:
        return record.reached
    return not record.detail.startswith(NEVER_STARTED)


@dataclass(frozen=True)
class UndoPlan:
    """The drain steps an undrain undoes: the HTTP drain hook, and the VMs whose relay
    drain hook may have run."""

    http: bool = False
    hooks: tuple[str, ...] = ()

    @property
    def empty(self) -> bool:
        return not (self.http or self.hooks)


def steps_to_undo(rows: Mapping[str, StepRecord]) -> UndoPlan:
    """Exactly the drain steps that may have acted, from the event's step rows (the
    drains table's partition: `http`, `hook:<vm>`, and the rest, which undo nothing). A
    step that never reached its receiver (no relay known, no time left, no connection, a
    relay's refusal) is nothing to undo, so no undrain and no `undrain_failed` for it. The
    HTTP hook counts as reached once it had the request, whatever it answered."""
    return UndoPlan(
        http=reached(rows.get(HTTP_STEP)),
        hooks=tuple(
            sorted(
                name.removeprefix(HOOK_STEP)
                for name, record in rows.items()
                if name.startswith(HOOK_STEP) and reached(record)
            )
        ),
    )
