"""Approving an event: through the relay of a VM it names (one signed POST /v1/start), or
through Azure Resource Manager (`acknowledge`, functions.approvers.arm), in APPROVERS order.

IMDS (and ARM) let any affected VM start the event for all of them, so one successful call
is enough fleet-wide. The event row's `approval` field is claimed under its ETag first, so
the policy, the terminate workflow, the watchdog and an operator never approve the same
event twice at the same moment.

Retry rules: network errors, 5xx and the 4xx whose cause may pass (401 signature, 403,
409, 429, a 404 from a relay whose VM has not reported the event yet; see
functions.approvers.relay) are retried with backoff (other relays are tried in between)
until APPROVAL_MARGIN_SECONDS before NotBefore. A final 4xx (400, a 404 for an event its
VM reported) means that relay refused: it is not asked again for this event, but another
named VM's relay may be. With APPROVERS="relay,arm" (the default) ARM takes over when no
relay can approve: none reported, all refused, or none approved within
ARM_FALLBACK_AFTER_SECONDS of the first relay attempt; an event no relay reports (Event
Grid only) goes to ARM at once. ARM's 429/5xx are retried honouring Retry-After, its 4xx
are final, unless they refuse a repeat of an acknowledge that landed (its answer lost:
functions.pipeline.approve_arm asks Azure). When nothing can approve, the event will
start at NotBefore anyway; that is announced as `approval_failed`. The audit and the
announcement say which path approved it (`relay:<vm>` or `arm`).

One VM's view never reaches another VM or Azure unchecked (issue 27): each relay is sent
the view the decision rests on (`view_for`, `Expect`) and approves only if its own IMDS
agrees; a relay answering that its view differs ends the approval of the whole event (no
other relay, no ARM: approval_failed, with the relay's reason). ARM acknowledges only an
event Azure itself reports as decided: Event Grid's own view (no relay reported it), or
Resource Graph's row for it (functions.approvers.azure_events) agreeing field by field.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from functions.model.arm import ArmResource, owners_of
from functions.model.event import Transition
from functions.pipeline.approval_record import ApprovalResult, Outcome, record_outcome
from functions.pipeline.approve_arm import Phase, arm_phase
from functions.pipeline.context import Pipeline
from functions.pipeline.due import unannounced_before
from functions.pipeline.lifecycle import approval_lease, note_sent
from functions.pipeline.relay_phase import RELAYS_PER_ATTEMPT, expect_for, relay_phase
from functions.pipeline.views import own_views
from functions.settings import Settings
from functions.store import claims
from functions.store.records import Attempt, EventRecord
from functions.store.reporters import Reporter
from functions.store.state import Store

# The detail of a `skipped` approval whose `decided` is not announced yet: `_claim` waits
# for the announcements before `approved` (terminate.wiring tries again on this one).
ANNOUNCING = "its decision is being announced"


def approve_event(
    event_id: str,
    pipeline: Pipeline,
    *,
    announce: bool = True,
    give_up_at: datetime | None = None,
    by: str = "policy",
    relays: tuple[str, ...] | None = None,
    tag: str = "",
) -> ApprovalResult:
    """Approve one event now, through the approvers of APPROVERS in order; record and
    (optionally) announce.

    - `give_up_at`: stop retrying at this time even if NotBefore is further away; the
      outcome is then `retry_later` and the row stays `pending` for the watchdog.
    - `announce`: publish `approved` / `approval_failed` (once, fleet-wide).
    - `by`: who asked ("policy", "terminate", "watchdog", "manual:<name>"), for the audit.
    - `relays`: only these named VMs' relays may be asked (the drain workflow: the VMs
      whose own view decided drain, functions.terminate.targets); None: any named VM's.
    A caller that already holds the approval claim (the reconcile by key, which takes it
    in its announcing write) calls `approve_claimed` instead.
    - `tag`: who claims (the drain of this event: "drain:<EventId>"); a claim with the same
      tag, left by a runner that died, is taken over at once instead of after its lease.
    Never raises for relay or ARM trouble; returns `skipped` when the event is gone,
    already started or approved, another caller is approving it right now, or its
    `decided` is not announced yet (ANNOUNCING).
    """
    store, settings, clock = pipeline.store, pipeline.settings, pipeline.clock
    now = clock.now()
    policy = settings.policy.policy
    if policy is not None and policy.dry_run:
        return ApprovalResult(event_id=event_id, outcome="skipped", detail="dry run")
    closed = _lanes_closed(pipeline, event_id, now)
    if closed:  # nothing claimed or written: the event is due again as it was
        return ApprovalResult(event_id=event_id, outcome="retry_later", detail=closed)
    record, won = _claim(store, event_id, now, settings, tag)
    if not won or record is None:
        return ApprovalResult(event_id=event_id, outcome="skipped", detail=why_not(record, now))
    # Its reporter rows, read once claimed: only the relays are asked with them.
    relay = "relay" in settings.approver_order
    reporters = store.reporter_rows(event_id) if relay else []
    return approve_claimed(
        pipeline,
        record,
        reporters,
        announce=announce,
        give_up_at=give_up_at,
        by=by,
        relays=relays,
    )


def approve_claimed(
    pipeline: Pipeline,
    record: EventRecord,
    reporters: list[Reporter],
    *,
    announce: bool = True,
    give_up_at: datetime | None = None,
    by: str = "policy",
    relays: tuple[str, ...] | None = None,
    settle: tuple[Transition, ...] = (),
    settle_rows: list[dict[str, Any]] | None = None,
) -> ApprovalResult:
    """Approve an event whose approval claim the caller holds (`record`, as written with
    it): the reconcile by key, which claims it in the write that announces what is due,
    and `approve_event` once it has claimed. `reporters`: the event's reporter rows as
    the caller read them (each named VM's own view, who reports it). `settle`:
    announcements the caller published and left pending, marked done in the write that
    records the outcome (one write for both; on `skipped` the caller marks them);
    `settle_rows`: the audit rows that go with that mark (the decision's), in the same
    transaction, and only with it. The other arguments are `approve_event`'s."""
    store, settings, clock = pipeline.store, pipeline.settings, pipeline.clock
    now = clock.now()
    policy = settings.policy.policy
    if policy is not None and policy.dry_run:
        return ApprovalResult(event_id=record.event_id, outcome="skipped", detail="dry run")
    # Relays and ARM get until NotBefore less the margin (no NotBefore: one attempt's budget).
    if record.not_before is None:
        deadline = now + timedelta(seconds=settings.approval_budget_seconds)
    else:
        deadline = record.not_before - timedelta(seconds=settings.approval_margin_seconds)
    stop = min(deadline, give_up_at) if give_up_at else deadline
    order = settings.approver_order
    # Each VM's own view (its reporter row) is what its relay must confirm (and what ARM's
    # Azure row is compared with); the same rows say who reports it, for the outcome's
    # announcement (no second query of the partition: issue 47).
    record.reporter_views, stricter_own = own_views(reporters, record)
    record.reporters = {r.vm: r.status for r in reporters if r.status}
    record.past_reporters = [r.vm for r in reporters]
    owners: list[ArmResource] = []
    if "arm" in order:
        # The named VMs of one event share few owners (their set): the first few VMs
        # known give them, without a read per VM of an event naming 1,000.
        named = record.resources[: RELAYS_PER_ATTEMPT * 2]
        owners = owners_of(record.arm_resource, [store.get_vm(name) for name in named])
    attempts: list[Attempt] = []
    details: list[str] = []
    later = False
    approved: Phase | None = None
    for index, approver in enumerate(order):
        arm_next = "arm" in order[index + 1 :] and bool(owners)
        if approver == "relay":
            phase = relay_phase(
                pipeline, record, by, now, stop, deadline, arm_next, reporters, stricter_own, relays
            )
        else:
            phase = arm_phase(pipeline, record, owners, by, stop, deadline, expect_for)
        attempts += phase.attempts
        if phase.outcome == "vetoed":
            details.append(f"{approver}: {phase.detail}")
            break  # a named VM's own view differs: nothing approves this event for it
        if phase.outcome == "approved":
            approved = phase
            break
        details.append(f"{approver}: {phase.detail}")
        if phase.outcome == "later":
            later = True
            if approver == "relay":
                break  # relays still have time before ARM's turn: do not hand over yet
            # ARM throttled or down for now: a relay after it may approve meanwhile.
    # The outcome, whichever approver settled it, is recorded in one place (`record_outcome`).
    outcome: Outcome = "retry_later" if later else "failed"
    via, detail, status = None, "; ".join(details), None
    if approved is not None:
        outcome, via, detail, status = "approved", approved.via, approved.detail, approved.status
    return record_outcome(
        pipeline,
        record,
        outcome,
        via,
        attempts,
        detail,
        by,
        imds_status=status,
        announce=announce,
        settle_marks=settle,
        settle_rows=settle_rows,
    )


def _lanes_closed(pipeline: Pipeline, event_id: str, now: datetime) -> str | None:
    """Why this approval would ask no relay now (functions.pipeline.lanes: every named
    VM's relay silent lately or busy with another approval), from the row as this host
    last read it, before anything is claimed. Never once the relays have been silent for
    ARM_FALLBACK_AFTER_SECONDS with ARM next: then ARM may approve whatever they do."""
    lanes = pipeline.relay_lanes
    settings = pipeline.settings
    if lanes is None or "relay" not in settings.approver_order:
        return None
    record = pipeline.store.recent_event(event_id)
    if record is None or not record.resources:
        return None
    handover = None
    if "arm" in settings.approver_order:
        handover = timedelta(seconds=settings.arm_fallback_after_seconds)
    return lanes.closed(list(record.resources[:RELAYS_PER_ATTEMPT]), now, handover)


def why_not(record: EventRecord | None, now: datetime | None = None) -> str:
    """Why an approval was not attempted, in words for the audit and the caller; with
    `now`, ANNOUNCING when `_claim` waited for the announcements before it."""
    if record is None:
        return "unknown event"
    if record.ended:
        return f"event {record.ended}"
    if record.started:
        return "event already started"
    if record.approval == "approved":
        return "already approved"
    if now is not None and unannounced_before(record, now, publishing=False):
        return ANNOUNCING
    return "another caller is approving it"


def _claim(
    store: Store, event_id: str, now: datetime, settings: Settings, tag: str = ""
) -> tuple[EventRecord | None, bool]:
    """Claim the approval for `tag` (functions.store.claims: held for one attempt's budget
    and a margin; its holder, delivered again after its host died, takes it over at once).
    Not while an announcement a person reads before `approved` is not done (the decider's
    rule, due.unannounced_before; this caller publishes none of them): a channel would
    read `approved` before `decided` (issue 46). The drain workflow waits then, and has the
    one decider publish what is due (functions.terminate.wiring)."""
    lease = approval_lease(settings.approval_budget_seconds)

    def change(rec: EventRecord | None) -> EventRecord | None:
        if rec is None or rec.ended or rec.started or rec.approval == "approved":
            return None
        if unannounced_before(rec, now, tag, publishing=False):
            return None
        busy = rec.approval == "in_progress"
        if busy and not claims.is_free(rec.approval_claim, now, tag):
            return None
        rec.approval = "in_progress"
        rec.approval_claim = claims.pending(now, lease, tag)
        if "relay" in settings.approver_order:
            note_sent(rec, now, "")
        return rec

    return store.mutate_event(event_id, change)
