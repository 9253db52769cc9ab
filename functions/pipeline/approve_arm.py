"""The ARM phase of an approval (functions.pipeline.approve): acknowledge through Azure
Resource Manager, only for an event Azure itself reports as decided.

ARM approves for every VM the event names with the app's own identity and no relay asked,
so a relay's report is never enough (issue 27): the event must be Event Grid's own (no
relay reported it), or Resource Graph's row for it (functions.approvers.azure_events) must
agree with the decided view field by field; then Azure's owner of the event is the one
acknowledged. 429/5xx/network are retried honouring Retry-After until `stop`; a 404 tries
the next candidate owner; any other 4xx is final for this event, but one:

ARM's acknowledge takes no dedupe key, so a repeat of one that landed while its answer was
lost (the host died, or the connection dropped) is refused: the event is no longer
Scheduled. The approver therefore writes `arm_sent_at` before its first acknowledge, and
a 409 (or a 404, Azure's recorded answer for an EventId it does not hold) after a call
that may have landed (an unanswered one in this run, or any earlier run's:
`arm_sent_at` was set) is checked against Azure's own view (Resource Graph): an
event Azure reports Started or Completed was acknowledged by that earlier call, and the
approval is recorded as the approval it was; one still Scheduled there (Resource Graph
lags ARM) is asked again until `stop`. What ARM means by the 409 is never relied on.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Literal

from pydantic import BaseModel, Field

from functions.approvers import azure_events
from functions.approvers.arm import acknowledge, default_credential
from functions.clock import Clock
from functions.model.arm import ArmResource
from functions.pipeline.context import Pipeline
from functions.store.records import Attempt, EventRecord

ARM = "arm"  # `approved_by` and the attempts' `vm` when ARM acknowledged it
BACKOFF_START_SECONDS = 1.0
BACKOFF_MAX_SECONDS = 20.0
RELAYS_PER_ATTEMPT = 8
# How an attempt starts when ARM refused a repeat of an acknowledge that had landed (the
# crash explorer's rule 11 reads it): the outcome the dead or disconnected call never saw.
LANDED = "acknowledged by an earlier call whose answer was lost"
# What a repeat of an acknowledge that landed may get: the stand-in answers 409 Conflict
# (not Scheduled any more); Azure's answer to a repeat is not recorded anywhere public,
# and its recorded answer for an EventId it does not hold is 404 InvalidScheduledEventId
# "Scheduled event not found" (docs/conformance.md).
REPEAT = frozenset({404, 409})
# The decided view's `Expect` entry for a VM ("" for Azure): functions.pipeline.approve.
ExpectFor = Callable[[EventRecord, str], dict[str, object]]


class Phase(BaseModel):
    """What one approver achieved: approved (`via` says the path), exhausted (nothing it
    can do; the next approver's turn), later (it may still succeed: retry later) or vetoed
    (a named VM's relay sees the event otherwise than decided: no approver may act)."""

    outcome: Literal["approved", "exhausted", "later", "vetoed"]
    via: str | None = None
    detail: str = ""
    attempts: list[Attempt] = Field(default_factory=list)
    status: int | None = None


def arm_phase(
    pipeline: Pipeline,
    record: EventRecord,
    owners: list[ArmResource],
    by: str,
    stop: datetime,
    deadline: datetime,
    expect_for: ExpectFor,
) -> Phase:
    """Acknowledge through ARM: 429/5xx/network retried honouring Retry-After until `stop`;
    a 404 tries the next candidate owner; any other 4xx is final for this event."""
    if not owners:
        return Phase(
            outcome="exhausted",
            detail="no ARM id for the event's owner (no Event Grid notification, and no "
            "named VM's relay sent its compute metadata)",
        )
    if pipeline.credential is None:
        pipeline.credential = default_credential()
    confirmed = _azure_reports(pipeline, record, owners, by, stop, deadline, expect_for)
    if isinstance(confirmed, Phase):
        return confirmed
    return _acknowledge_each(pipeline, record, confirmed, by, stop, deadline)


def _acknowledge_each(
    pipeline: Pipeline,
    record: EventRecord,
    confirmed: list[ArmResource],
    by: str,
    stop: datetime,
    deadline: datetime,
) -> Phase:
    """The one-event call on each confirmed owner in turn (a 404 tries the next); a 404 or
    409 to a call that may repeat one that landed is settled by Azure's view (module doc)."""
    settings, clock = pipeline.settings, pipeline.clock
    attempts: list[Attempt] = []
    delay = BACKOFF_START_SECONDS
    queue = list(confirmed)
    may_have_landed = record.arm_sent_at is not None
    if not may_have_landed:
        _mark_sent(pipeline, record)
    while queue:
        owner = queue[0]
        remaining = (stop - clock.now()).total_seconds()
        if remaining <= 0:
            break
        answer = acknowledge(
            owner,
            record.event_id,
            credential=pipeline.credential,  # type: ignore[arg-type]
            session=pipeline.session,
            endpoint=settings.arm_endpoint,
            api_version=settings.arm_api_version,
            remaining=remaining,
        )
        attempts.append(Attempt(at=clock.now(), vm=ARM, outcome=answer.text[:500], by=by))
        if answer.verdict == "approved":
            return Phase(
                outcome="approved",
                via=ARM,
                detail=f"acknowledged through ARM on {owner.id}",
                attempts=attempts,
                status=answer.status,
            )
        waiting = False  # Azure reports the event still Scheduled
        if answer.verdict == "refused" and answer.status in REPEAT and may_have_landed:
            azure = _ask_azure(pipeline, record, stop, deadline)
            if isinstance(azure, Phase):
                azure.attempts = attempts
                return azure
            status = str(azure.properties.get("EventStatus") or "") if azure else ""
            if status.casefold() in azure_events.NOT_WAITING and _before_not_before(
                record, clock.now()
            ):
                attempts[-1].outcome = f"{LANDED} (Azure reports it {status}): {answer.text}"
                return Phase(
                    outcome="approved",
                    via=ARM,
                    detail=f"acknowledged through ARM on {owner.id}",
                    attempts=attempts,
                )
            waiting = azure is not None and status.casefold() == "scheduled"
        if answer.verdict == "refused" and answer.status == 409 and waiting:
            pass  # Resource Graph may lag ARM: acknowledge and ask again until `stop`
        elif answer.verdict == "refused":
            queue.pop(0)
            if answer.status == 404 and queue:
                continue  # another owner may hold it (e.g. the set, not the VM)
            return Phase(outcome="exhausted", detail=answer.text, attempts=attempts)
        elif answer.status != 429:
            may_have_landed = True  # unanswered, or a 5xx: ARM may have acted on it
        next_delay = _back_off(clock, answer.retry_after, delay, stop)
        if next_delay is None:
            break
        delay = next_delay
    text = attempts[-1].outcome if attempts else "no time left"
    if stop < deadline:
        return Phase(outcome="later", detail=f"ARM not answering yet: {text}", attempts=attempts)
    return Phase(
        outcome="exhausted",
        detail=f"ARM did not approve before the approval deadline: {text}",
        attempts=attempts,
    )


def _azure_reports(
    pipeline: Pipeline,
    record: EventRecord,
    owners: list[ArmResource],
    by: str,
    stop: datetime,
    deadline: datetime,
    expect_for: ExpectFor,
) -> list[ArmResource] | Phase:
    """Where ARM may acknowledge the event, if Azure itself reports it as decided: Event
    Grid's view when no relay reported it, else Resource Graph's row agreeing with the
    decided view (then its owner is the one acknowledged). A Phase says why not. What
    Azure's row allows is decided by one pure function (azure_events.read), after the
    asking: choosing the owner calls back into no module it left (issue 46)."""
    if record.arm_resource and not pipeline.store.load_reporters(record).past_reporters:
        return owners  # Event Grid's own view: no relay's word in the decision
    azure = _ask_azure(pipeline, record, stop, deadline)
    if isinstance(azure, Phase):
        return azure
    if azure is None:
        return Phase(
            outcome="exhausted",
            detail="Azure does not report this event (Resource Graph): ARM does not "
            "acknowledge on a relay's report alone",
        )
    now = pipeline.clock.now()
    reading = azure_events.read(
        azure,
        expect_for(record, ""),
        sent=record.arm_sent_at is not None,
        before_not_before=_before_not_before(record, now),
    )
    if reading.landed:  # an earlier run's acknowledge landed, its host died before recording
        return Phase(
            outcome="approved",
            via=ARM,
            detail=f"acknowledged through ARM on {reading.landed}",
            attempts=[
                Attempt(
                    at=now,
                    vm=ARM,
                    outcome=f"{LANDED} (Azure reports it {reading.status})",
                    by=by,
                )
            ],
        )
    if reading.owner is None:
        return Phase(outcome="exhausted", detail=reading.why_not)
    return [reading.owner]


def _ask_azure(
    pipeline: Pipeline, record: EventRecord, stop: datetime, deadline: datetime
) -> azure_events.AzureEvent | Phase | None:
    """Resource Graph's row for the event (None: Azure does not report it); throttled or
    down, asked again honouring Retry-After until `stop`, then a Phase saying why not."""
    clock = pipeline.clock
    delay = BACKOFF_START_SECONDS
    while True:
        try:
            return azure_events.lookup(
                record.event_id,
                credential=pipeline.credential,  # type: ignore[arg-type]
                session=pipeline.session,
                endpoint=pipeline.settings.arm_endpoint,
                remaining=max(0.1, (stop - clock.now()).total_seconds()),
            )
        except azure_events.AzureUnavailable as exc:
            next_delay = _back_off(clock, exc.retry_after, delay, stop)
            if next_delay is None:
                outcome = "later" if stop < deadline else "exhausted"
                return Phase(outcome=outcome, detail=f"cannot ask Azure about the event: {exc}")
            delay = next_delay


def _back_off(
    clock: Clock, retry_after: float | None, delay: float, stop: datetime
) -> float | None:
    """Wait as ARM or Resource Graph asked (Retry-After), else `delay`; the next delay
    (doubled, at most BACKOFF_MAX_SECONDS), or None when that wait would pass `stop`."""
    wait = retry_after if retry_after is not None else delay
    if clock.now() + timedelta(seconds=wait) >= stop:
        return None
    clock.sleep(wait)
    return min(delay * 2, BACKOFF_MAX_SECONDS)


def _before_not_before(record: EventRecord, now: datetime) -> bool:
    """Whether Azure cannot have started the event on its own yet: only then is an event
    it reports Started the work of an earlier acknowledge of ours."""
    return record.not_before is None or now < record.not_before


def _mark_sent(pipeline: Pipeline, record: EventRecord) -> None:
    """Write `arm_sent_at` before the first acknowledge (one write, only on the ARM path),
    so a takeover after a crash knows a 409 may answer a call that landed. The row's new
    ETag goes back into `record`, whose outcome write follows."""
    now = pipeline.clock.now()

    def change(rec: EventRecord | None) -> EventRecord | None:
        if rec is None or rec.arm_sent_at is not None:
            return None
        rec.arm_sent_at = now
        return rec

    written, won = pipeline.store.mutate_event(record.event_id, change, known=record)
    if written is not None:
        record.arm_sent_at = written.arm_sent_at
        if won:
            record.etag = written.etag
