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
from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field

from functions.approvers import azure_events
from functions.approvers.arm import (
    LANDED,
    AzureUnavailable,
    TokenCredential,
    acknowledge_each,
    ask_azure,
    default_credential,
)
from functions.model.arm import ArmResource
from functions.pipeline.context import Pipeline
from functions.store.records import Attempt, EventRecord

ARM = "arm"  # `approved_by` and the attempts' `vm` when ARM acknowledged it
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
    """Acknowledge through ARM, for an event Azure itself reports as decided (module doc),
    in three steps, each leaving to the next (issue 46): read Azure's row for it (Resource
    Graph, unless it is Event Grid's own view: no relay reported it), have it decide where
    to acknowledge (functions.approvers.azure_events.read: pure), then acknowledge there
    (functions.approvers.arm.acknowledge_each: retries, and a repeat's 404 or 409 settled
    inside the exchange). What each outcome means for the event is said here."""
    if not owners:
        return Phase(
            outcome="exhausted",
            detail="no ARM id for the event's owner (no Event Grid notification, and no "
            "named VM's relay sent its compute metadata)",
        )
    if pipeline.credential is None:
        pipeline.credential = default_credential()
    credential: TokenCredential = pipeline.credential
    settings, clock, store = pipeline.settings, pipeline.clock, pipeline.store
    not_yet: Literal["later", "exhausted"] = "later" if stop < deadline else "exhausted"
    confirmed = owners  # Event Grid's own view: no relay's word in the decision
    if not record.arm_resource or store.load_reporters(record).past_reporters:
        try:
            azure = ask_azure(
                record.event_id,
                credential=credential,
                session=pipeline.session,
                endpoint=settings.arm_endpoint,
                clock=clock,
                stop=stop,
            )
        except AzureUnavailable as exc:
            return Phase(outcome=not_yet, detail=f"cannot ask Azure about the event: {exc}")
        if azure is None:
            return Phase(
                outcome="exhausted",
                detail="Azure does not report this event (Resource Graph): ARM does not "
                "acknowledge on a relay's report alone",
            )
        now = clock.now()
        reading = azure_events.read(
            azure,
            expect_for(record, ""),
            sent=record.arm_sent_at is not None,
            # Azure cannot have started it on its own yet: only then is an event it
            # reports Started the work of an earlier acknowledge of ours.
            before_not_before=record.not_before is None or now < record.not_before,
        )
        if reading.landed:  # an earlier run's acknowledge landed, its host died first
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
        confirmed = [reading.owner]
    may_have_landed = record.arm_sent_at is not None
    if not may_have_landed:
        store.note_arm_sent(record, clock.now())
    acked = acknowledge_each(
        confirmed,
        record.event_id,
        credential=credential,
        session=pipeline.session,
        endpoint=settings.arm_endpoint,
        api_version=settings.arm_api_version,
        clock=clock,
        stop=stop,
        may_have_landed=may_have_landed,
        not_before=record.not_before,
    )
    attempts = [Attempt(at=t.at, vm=ARM, outcome=t.outcome, by=by) for t in acked.tries]
    if acked.outcome == "landed":
        attempts[-1].outcome = acked.detail  # the refusal answered a call that had landed
    if acked.owner is not None:  # approved, or landed earlier
        return Phase(
            outcome="approved",
            via=ARM,
            detail=f"acknowledged through ARM on {acked.owner.id}",
            attempts=attempts,
            status=acked.status,
        )
    if acked.outcome == "refused":
        return Phase(outcome="exhausted", detail=acked.detail, attempts=attempts)
    if acked.outcome == "unavailable":
        detail = f"cannot ask Azure about the event: {acked.detail}"
        return Phase(outcome=not_yet, detail=detail, attempts=attempts)
    text = attempts[-1].outcome if attempts else "no time left"
    if stop < deadline:
        return Phase(outcome="later", detail=f"ARM not answering yet: {text}", attempts=attempts)
    return Phase(
        outcome="exhausted",
        detail=f"ARM did not approve before the approval deadline: {text}",
        attempts=attempts,
    )
