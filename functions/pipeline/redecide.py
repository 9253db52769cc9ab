"""Re-deciding, once, the events that failed closed, as soon as this host's policy is valid.

While the policy is invalid every new event gets a fail-closed `hold` (it carries
`policy_error`). When the operator fixes the policy the host restarts with the valid one;
without this, those events would stay held until someone approved them by hand. Ingest
(on the event's next document) and the watchdog (every minute) both call these pure
helpers inside an ETag-guarded write of the event row: the writer that replaces the
fail-closed decision wins, and every other sees a decision without `policy_error` and
does nothing, so an event is re-decided once however many hosts race.
"""

from __future__ import annotations

from datetime import datetime

from functions.model.envelope import SCHEDULED, ScheduledEvent
from functions.model.event import Decision, Transition
from functions.model.policy import PolicyLoad, decide
from functions.pipeline.views import redecide_views, strictest
from functions.store.records import EventRecord

ERROR_QUOTED = 200  # how much of the old policy error the new decision's reason repeats


def should_redecide(record: EventRecord, load: PolicyLoad, now: datetime) -> bool:
    """A fail-closed decision, a valid policy here, and the event still waiting to start.

    Not when an operator already asked for an approval (`approval` set: theirs stands),
    nor once NotBefore has passed (Azure starts it whatever we decide)."""
    decision = record.decision
    return (
        decision is not None
        and decision.policy_error is not None
        and load.policy is not None
        and not record.ended
        and not record.started
        and record.event_status == SCHEDULED
        and not record.approval
        and (record.not_before is None or now < record.not_before)
    )


def as_event(record: EventRecord) -> ScheduledEvent:
    """The event as IMDS last described it, for the policy's rules (the watchdog has no
    document at hand)."""
    return ScheduledEvent(
        event_id=record.event_id,
        event_status=record.event_status,
        event_type=record.event_type,
        resource_type=record.resource_type,
        resources=tuple(record.resources),
        not_before=record.not_before,
        description=record.description,
        event_source=record.event_source,
        duration_in_seconds=record.duration_in_seconds,
    )


def redecide(
    record: EventRecord, load: PolicyLoad, now: datetime, event: ScheduledEvent | None = None
) -> None:
    """Replace the fail-closed decision on `record` (in place; the caller writes it).
    A row without views is decided on `event` (Event Grid's report), else on the event
    as the row describes it (`as_event`).

    The `decided` claim is dropped so the caller claims it afresh: the new decision is
    announced as `decided` with its own MessageId (functions.pipeline.announce.occurrence)."""
    old = record.decision
    assert old is not None and old.policy_error is not None
    if record.views:
        # Each reporter's view is decided afresh; the event follows the strictest.
        record.views = redecide_views(record, load, now)
        new = strictest([entry.decision for entry in record.views])
    else:
        seen = event if event is not None else as_event(record)
        new = decide(load, seen, now, tuple(record.scale_sets))
    error = old.policy_error
    if len(error) > ERROR_QUOTED:
        error = error[: ERROR_QUOTED - 1] + "…"
    record.decision = _noted(new, f"re-decided: the policy is valid again (it was: {error})")
    record.decided_at = now
    record.redecided_at = now
    record.announced.pop(Transition.DECIDED.value, None)


def _noted(decision: Decision, note: str) -> Decision:
    reason = f"{decision.reason}; {note}" if decision.reason else note
    return decision.model_copy(update={"reason": reason})
