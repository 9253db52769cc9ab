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
are final. When nothing can approve, the event will start at NotBefore anyway; that is
announced as `approval_failed`. The audit and the announcement say which path approved
it (`relay:<vm>` or `arm`).
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Literal

import requests
from pydantic import BaseModel, Field

from functions.approvers.arm import acknowledge, default_credential
from functions.approvers.relay import RelayTarget, final_refusal, post_start
from functions.clock import Clock
from functions.model.arm import ArmResource, owner_of_vm
from functions.model.event import Transition
from functions.pipeline.announce import claim, publish_claimed
from functions.pipeline.context import Pipeline
from functions.settings import Settings
from functions.store import claims
from functions.store.records import MAX_ATTEMPTS_KEPT, Attempt, EventRecord, VmRecord
from functions.store.state import Store

log = logging.getLogger(__name__)

Outcome = Literal["approved", "failed", "retry_later", "skipped"]
BACKOFF_START_SECONDS = 1.0
BACKOFF_MAX_SECONDS = 20.0
ARM = "arm"  # `approved_by` and the attempts' `vm` when ARM acknowledged it
RELAYS_PER_ATTEMPT = 8


class ApprovalResult(BaseModel):
    event_id: str
    outcome: Outcome
    vm: str | None = None  # whose relay approved
    detail: str = ""
    attempts: list[Attempt] = Field(default_factory=list)
    imds_status: int | None = None


def approve_event(
    event_id: str,
    pipeline: Pipeline,
    *,
    announce: bool = True,
    give_up_at: datetime | None = None,
    by: str = "policy",
    force: bool = False,
) -> ApprovalResult:
    """Approve one event now, through the approvers of APPROVERS in order; record and
    (optionally) announce.

    - `give_up_at`: stop retrying at this time even if NotBefore is further away; the
      outcome is then `retry_later` and the row stays `pending` for the watchdog.
    - `announce`: publish `approved` / `approval_failed` (once, fleet-wide).
    - `by`: who asked ("policy", "terminate", "watchdog", "manual:<name>"), for the audit.
    - `force`: approve even if the policy is in dry run (a manual override is audited).
    Never raises for relay or ARM trouble; returns `skipped` when the event is gone,
    already started or approved, or another caller is approving it right now.
    """
    store, settings, clock = pipeline.store, pipeline.settings, pipeline.clock
    now = clock.now()
    policy = settings.policy.policy
    if not force and policy is not None and policy.dry_run:
        return ApprovalResult(event_id=event_id, outcome="skipped", detail="dry run")
    record, claimed = _claim(store, event_id, now, settings)
    if not claimed:
        return ApprovalResult(event_id=event_id, outcome="skipped", detail=_why_not(record))
    assert record is not None
    deadline = _deadline(record, settings, now)
    stop = min(deadline, give_up_at) if give_up_at else deadline
    order = settings.approver_order
    owners = arm_owners(store, record) if "arm" in order else []
    attempts: list[Attempt] = []
    details: list[str] = []
    later = False
    result: ApprovalResult | None = None
    for index, approver in enumerate(order):
        arm_next = "arm" in order[index + 1 :] and bool(owners)
        if approver == "relay":
            phase = _relay_phase(pipeline, record, by, now, stop, deadline, arm_next)
        else:
            phase = _arm_phase(pipeline, record, owners, by, stop, deadline)
        attempts += phase.attempts
        if phase.outcome == "approved":
            result = _finish(
                store,
                record,
                "approved",
                phase.via,
                attempts,
                phase.detail,
                clock,
                by,
                imds_status=phase.status,
            )
            break
        details.append(f"{approver}: {phase.detail}")
        if phase.outcome == "later":
            later = True
            if approver == "relay":
                break  # relays still have time before ARM's turn: do not hand over yet
            # ARM throttled or down for now: a relay after it may approve meanwhile.
    if result is None:
        result = _finish(
            store,
            record,
            "retry_later" if later else "failed",
            None,
            attempts,
            "; ".join(details),
            clock,
            by,
        )
    if announce and result.outcome in ("approved", "failed"):
        transition = (
            Transition.APPROVED if result.outcome == "approved" else Transition.APPROVAL_FAILED
        )
        won = claim(store, event_id, transition, clock.now())
        if won is not None:
            # A person's approval names them in the announcement too, not only in the audit.
            details = {transition: _manual_detail(by, result)} if by.startswith("manual:") else None
            publish_claimed(pipeline, won, [transition], clock.now(), details)
    return result


class _Phase(BaseModel):
    """What one approver achieved: approved (`via` says the path), exhausted (nothing it
    can do; the next approver's turn) or later (it may still succeed: retry later)."""

    outcome: Literal["approved", "exhausted", "later"]
    via: str | None = None
    detail: str = ""
    attempts: list[Attempt] = Field(default_factory=list)
    status: int | None = None


def _relay_phase(
    pipeline: Pipeline,
    record: EventRecord,
    by: str,
    now: datetime,
    stop: datetime,
    deadline: datetime,
    arm_next: bool,
) -> _Phase:
    """Relays of the named VMs. With ARM next, relays get ARM_FALLBACK_AFTER_SECONDS from
    their first attempt (kept in the row across invocations) and no waiting for relays
    not heard yet: ARM can approve now."""
    settings, clock = pipeline.settings, pipeline.clock
    handover = deadline
    if arm_next:
        tried = [a.at for a in record.approval_attempts if a.vm and a.vm != ARM]
        first = min(tried) if tried else now
        handover = min(deadline, first + timedelta(seconds=settings.arm_fallback_after_seconds))
    # A relay that refused for good is not asked again for this event, in this call or later.
    refused = {a.vm for a in record.approval_attempts if final_refusal(a.outcome)}
    relays = _relays(pipeline, record, now, skip=refused)
    unheard = len({r.casefold() for r in record.resources}) > len(relays) + len(refused)
    if not relays:
        # The named VMs' relays may simply not have reported yet (a set-mate's document
        # came first): wait for them while there is time, then give up.
        waiting = unheard and not arm_next and clock.now() < deadline
        return _Phase(
            outcome="later" if waiting else "exhausted",
            detail="no VM named in Resources has a relay that reported recently with an "
            "attested key and an address Azure knows"
            + (f" (refused before: {', '.join(sorted(refused))})" if refused else ""),
        )
    return _try_relays(
        record,
        relays,
        pipeline.session,
        clock,
        min(stop, handover),
        handover,
        by,
        unheard and not arm_next,
    )


def arm_owners(store: Store, record: EventRecord) -> list[ArmResource]:
    """Where the event can be acknowledged: the owner Event Grid named, then the owners the
    named VMs' compute metadata gives (scale set, availability set or the VM itself)."""
    owners: list[ArmResource] = []
    candidates: list[ArmResource | None] = []
    if record.arm_resource:
        candidates.append(owner_of_vm(record.arm_resource))
    # The named VMs of one event share few owners (their set): the first few VMs known
    # give them, without a read per VM of an event naming 1,000.
    for name in record.resources[: RELAYS_PER_ATTEMPT * 2]:
        vm = store.get_vm(name)
        if vm is not None:
            candidates.append(owner_of_vm(vm.resource_id, vm.scale_set, vm.availability_set))
    for owner in candidates:
        if owner is not None and not any(owner.same(o) for o in owners):
            owners.append(owner)
    return owners


def _arm_phase(
    pipeline: Pipeline,
    record: EventRecord,
    owners: list[ArmResource],
    by: str,
    stop: datetime,
    deadline: datetime,
) -> _Phase:
    """Acknowledge through ARM: 429/5xx/network retried honouring Retry-After until `stop`;
    a 404 tries the next candidate owner; any other 4xx is final for this event."""
    settings, clock = pipeline.settings, pipeline.clock
    if not owners:
        return _Phase(
            outcome="exhausted",
            detail="no ARM id for the event's owner (no Event Grid notification, and no "
            "named VM's relay sent its compute metadata)",
        )
    if pipeline.credential is None:
        pipeline.credential = default_credential()
    attempts: list[Attempt] = []
    delay = BACKOFF_START_SECONDS
    queue = list(owners)
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
            return _Phase(
                outcome="approved",
                via=ARM,
                detail=f"acknowledged through ARM on {owner.id}",
                attempts=attempts,
                status=answer.status,
            )
        if answer.verdict == "refused":
            queue.pop(0)
            if answer.status == 404 and queue:
                continue  # another owner may hold it (e.g. the set, not the VM)
            return _Phase(outcome="exhausted", detail=answer.text, attempts=attempts)
        wait = answer.retry_after if answer.retry_after is not None else delay
        if clock.now() + timedelta(seconds=wait) >= stop:
            break
        clock.sleep(wait)
        delay = min(delay * 2, BACKOFF_MAX_SECONDS)
    text = attempts[-1].outcome if attempts else "no time left"
    if stop < deadline:
        return _Phase(outcome="later", detail=f"ARM not answering yet: {text}", attempts=attempts)
    return _Phase(
        outcome="exhausted",
        detail=f"ARM did not approve before the approval deadline: {text}",
        attempts=attempts,
    )


def _manual_detail(by: str, result: ApprovalResult) -> str:
    who = by.removeprefix("manual:")
    if result.outcome == "approved":
        return f"approved by {who} (by hand), via {approval_path(result.vm)}"
    return f"{who} approved by hand, but nothing could approve: {result.detail}"


def _why_not(record: EventRecord | None) -> str:
    if record is None:
        return "unknown event"
    if record.ended:
        return f"event {record.ended}"
    if record.started:
        return "event already started"
    if record.approval == "approved":
        return "already approved"
    return "another caller is approving it"


def approval_stale_after(settings: Settings) -> timedelta:
    """An approval claim older than one invocation's budget (and a minute) was left by a
    crash: another caller may take it over."""
    return timedelta(seconds=settings.approval_budget_seconds + 60)


def _claim(
    store: Store, event_id: str, now: datetime, settings: Settings
) -> tuple[EventRecord | None, bool]:
    stale_after = approval_stale_after(settings)

    def change(rec: EventRecord | None) -> EventRecord | None:
        if rec is None or rec.ended or rec.started or rec.approval == "approved":
            return None
        busy = rec.approval == "in_progress"
        if busy and not claims.can_claim(rec.approval_claim, now, stale_after):
            return None
        rec.approval = "in_progress"
        rec.approval_claim = claims.pending(now)
        return rec

    return store.mutate_event(event_id, change)


def _deadline(record: EventRecord, settings: Settings, now: datetime) -> datetime:
    if record.not_before is None:
        return now + timedelta(seconds=settings.approval_budget_seconds)
    return record.not_before - timedelta(seconds=settings.approval_margin_seconds)


def _relays(
    pipeline: Pipeline, record: EventRecord, now: datetime, skip: set[str | None]
) -> list[tuple[VmRecord, RelayTarget]]:
    """Named VMs whose relays were heard recently (a message, or a verified liveness
    hint), in `Resources` order (first is leader): at most RELAYS_PER_ATTEMPT of them, so an
    event naming 1,000 VMs costs a few point reads, not 1,000 (the others stay "unheard": a
    later attempt reaches them)."""
    fresh = timedelta(seconds=pipeline.settings.relay_silent_after_seconds)
    chosen: list[tuple[VmRecord, RelayTarget]] = []
    for name in record.resources:
        if len(chosen) >= RELAYS_PER_ATTEMPT:
            break
        if name in skip:
            continue
        vm = pipeline.store.get_vm(name)
        if vm is None:
            continue
        relay = pipeline.relay_target(vm)
        if relay is None:
            continue
        heard = vm.last_seen
        if heard is None or now - heard > fresh:
            heard = pipeline.last_heard(vm)  # only then the liveness read
        if heard is None or now - heard > fresh:
            continue
        chosen.append((vm, relay))
    return chosen


def _try_relays(
    record: EventRecord,
    relays: list[tuple[VmRecord, RelayTarget]],
    session: requests.Session,
    clock: Clock,
    stop: datetime,
    deadline: datetime,
    by: str,
    unheard: bool,
) -> _Phase:
    """Round-robin over the relays with backoff between rounds; `unheard`: some named VMs
    have no usable relay yet, so "all refused" is not final while time remains.
    `deadline`: when relays are given up (NotBefore less the margin, or ARM's turn)."""
    attempts: list[Attempt] = []
    refused: set[str] = set()
    delay = BACKOFF_START_SECONDS
    while True:
        for vm, relay in relays:
            if vm.name in refused:
                continue
            remaining = (stop - clock.now()).total_seconds()
            if remaining <= 0:
                break
            wanted = record.event_id.casefold()
            verdict, status, text = post_start(
                relay,
                record.event_id,
                session,
                remaining,
                reported=any(e.casefold() == wanted for e in vm.event_ids),
                expect={"EventType": record.event_type, "EventSource": record.event_source},
            )
            attempts.append(Attempt(at=clock.now(), vm=vm.name, outcome=text, by=by))
            if verdict == "approved":
                return _Phase(
                    outcome="approved",
                    via=vm.name,
                    detail=text,
                    attempts=attempts,
                    status=status,
                )
            if verdict == "refused":
                refused.add(vm.name)
        if all(vm.name in refused for vm, _ in relays):
            # Named VMs whose relays are not known yet may still approve: keep it pending.
            waiting = unheard and clock.now() < deadline
            return _Phase(
                outcome="later" if waiting else "exhausted",
                detail="every known named relay refused: " + _last_texts(attempts),
                attempts=attempts,
            )
        now = clock.now()
        if now + timedelta(seconds=delay) >= stop:
            if stop < deadline:
                return _Phase(
                    outcome="later",
                    detail="relays unreachable so far: " + _last_texts(attempts),
                    attempts=attempts,
                )
            return _Phase(
                outcome="exhausted",
                detail="no relay answered before the approval deadline: " + _last_texts(attempts),
                attempts=attempts,
            )
        clock.sleep(delay)
        delay = min(delay * 2, BACKOFF_MAX_SECONDS)


def approval_path(approved_by: str | None) -> str:
    """How an approval reached Azure, for the audit and announcements: relay:<vm> or arm."""
    return ARM if approved_by == ARM else f"relay:{approved_by}"


def _last_texts(attempts: list[Attempt]) -> str:
    seen: dict[str, str] = {}
    for attempt in attempts:
        seen[attempt.vm or "-"] = attempt.outcome
    return "; ".join(f"{vm}: {text}" for vm, text in seen.items())[:1000]


def _finish(
    store: Store,
    record: EventRecord,
    outcome: Outcome,
    vm: str | None,
    attempts: list[Attempt],
    detail: str,
    clock: Clock,
    by: str,
    imds_status: int | None = None,
) -> ApprovalResult:
    now = clock.now()
    state = {"approved": "approved", "failed": "failed", "retry_later": "pending"}[outcome]

    def change(rec: EventRecord | None) -> EventRecord | None:
        if rec is None:
            return None
        if rec.approval == "approved" and outcome != "approved":
            return None  # someone else succeeded meanwhile; keep their result
        rec.approval = state  # type: ignore[assignment]
        # Done once approved or failed; released for a later try otherwise.
        rec.approval_claim = claims.DONE if outcome in ("approved", "failed") else ""
        rec.approval_reason = detail[:1000]
        rec.approval_attempts = (rec.approval_attempts + attempts)[-MAX_ATTEMPTS_KEPT:]
        if outcome == "approved":
            rec.approved_by = vm
        if outcome == "retry_later":
            rec.approve_after = None
        return rec

    store.mutate_event(record.event_id, change)
    decision = record.decision
    store.audit(
        record.event_id,
        at=now,
        rule=decision.rule if decision else "",
        action="approve",
        outcome=outcome if outcome != "approved" else f"approved via {approval_path(vm)}",
        detail=detail,
        by=by,
    )
    log.info("approval of %s: %s %s", record.event_id, outcome, detail)
    return ApprovalResult(
        event_id=record.event_id,
        outcome=outcome,
        vm=vm,
        detail=detail,
        attempts=attempts,
        imds_status=imds_status if isinstance(imds_status, int) else None,
    )
