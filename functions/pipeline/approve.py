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

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

import requests
from pydantic import BaseModel, Field

from functions.approvers.relay import DIFFERS, RelayTarget, final_refusal, post_start
from functions.clock import Clock
from functions.model.event import Transition
from functions.model.view import VmView, normalise_resources
from functions.pipeline.announce import publish_claimed
from functions.pipeline.approve_arm import (
    ARM,
    BACKOFF_MAX_SECONDS,
    BACKOFF_START_SECONDS,
    RELAYS_PER_ATTEMPT,
    Phase,
    arm_owners,
    arm_phase,
)
from functions.pipeline.context import Pipeline
from functions.pipeline.lanes import RelayLanes
from functions.pipeline.lifecycle import approval_lease, note_sent
from functions.pipeline.slot_rules import suspect
from functions.pipeline.views import own_views
from functions.settings import Settings
from functions.store import claims
from functions.store.recent import copy_record
from functions.store.records import MAX_ATTEMPTS_KEPT, Attempt, EventRecord
from functions.store.reporters import Reporter
from functions.store.state import Store

log = logging.getLogger(__name__)

Outcome = Literal["approved", "failed", "retry_later", "skipped"]


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
    relays: tuple[str, ...] | None = None,
    claimed: EventRecord | None = None,
    settle: tuple[Transition, ...] = (),
    settle_rows: list[dict[str, Any]] | None = None,
    tag: str = "",
    reporters: list[Reporter] | None = None,
) -> ApprovalResult:
    """Approve one event now, through the approvers of APPROVERS in order; record and
    (optionally) announce.

    - `give_up_at`: stop retrying at this time even if NotBefore is further away; the
      outcome is then `retry_later` and the row stays `pending` for the watchdog.
    - `announce`: publish `approved` / `approval_failed` (once, fleet-wide).
    - `by`: who asked ("policy", "terminate", "watchdog", "manual:<name>"), for the audit.
    - `relays`: only these named VMs' relays may be asked (the drain workflow: the VMs
      whose own view decided drain, functions.terminate.targets); None: any named VM's.
    - `claimed`: the row as the caller wrote it with its own approval claim (ingest
      claims it in the write that decides): no second write to claim it.
    - `settle`: announcements the caller published and left pending: marked done in the
      write that records the outcome (one write for both); on `skipped` the caller marks
      them. `settle_rows`: the audit rows that go with that mark (the decision's), in the
      same transaction, and only with it.
    - `tag`: who claims (the drain of this event: "drain:<EventId>"); a claim with the same
      tag, left by a runner that died, is taken over at once instead of after its lease.
    - `reporters`: the event's reporter rows as the caller just read them (the reconcile
      by key reads them for the decider): not queried again.
    Never raises for relay or ARM trouble; returns `skipped` when the event is gone,
    already started or approved, or another caller is approving it right now.
    """
    store, settings, clock = pipeline.store, pipeline.settings, pipeline.clock
    now = clock.now()
    policy = settings.policy.policy
    if policy is not None and policy.dry_run:
        return ApprovalResult(event_id=event_id, outcome="skipped", detail="dry run")
    if claimed is not None and claimed.approval == "in_progress":
        record: EventRecord | None = claimed
    else:
        closed = _lanes_closed(pipeline, event_id, now)
        if closed:  # nothing claimed or written: the event is due again as it was
            return ApprovalResult(event_id=event_id, outcome="retry_later", detail=closed)
        record, won = _claim(store, event_id, now, settings, tag)
        if not won:
            return ApprovalResult(event_id=event_id, outcome="skipped", detail=why_not(record))
    assert record is not None
    deadline = _deadline(record, settings, now)
    stop = min(deadline, give_up_at) if give_up_at else deadline
    order = settings.approver_order
    owners = arm_owners(store, record) if "arm" in order else []
    attempts: list[Attempt] = []
    details: list[str] = []
    later = vetoed = False
    result: ApprovalResult | None = None
    for index, approver in enumerate(order):
        arm_next = "arm" in order[index + 1 :] and bool(owners)
        if approver == "relay":
            phase = _relay_phase(
                pipeline, record, by, now, stop, deadline, arm_next, relays, reporters
            )
        else:
            phase = arm_phase(pipeline, record, owners, by, stop, deadline, expect_for)
        attempts += phase.attempts
        if phase.outcome == "vetoed":
            details.append(f"{approver}: {phase.detail}")
            vetoed = True
            break  # a named VM's own view differs: nothing approves this event for it
        if phase.outcome == "approved":
            result = _finish(
                pipeline,
                record,
                "approved",
                phase.via,
                attempts,
                phase.detail,
                by,
                imds_status=phase.status,
                announce=announce,
                settle=(settle, settle_rows or []),
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
            pipeline,
            record,
            "retry_later" if later else "failed",
            None,
            attempts,
            "; ".join(details),
            by,
            announce=announce,
            settle=(settle, settle_rows or []),
            vetoed=vetoed,
        )
    return result


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


def _relay_phase(
    pipeline: Pipeline,
    record: EventRecord,
    by: str,
    now: datetime,
    stop: datetime,
    deadline: datetime,
    arm_next: bool,
    only: tuple[str, ...] | None = None,
    reporters: list[Reporter] | None = None,
) -> Phase:
    """Relays of the named VMs. With ARM next, relays get ARM_FALLBACK_AFTER_SECONDS from
    their first attempt (kept in the row across invocations) and no waiting for relays
    not heard yet: ARM can approve now."""
    settings, clock = pipeline.settings, pipeline.clock
    handover = deadline
    if arm_next:
        tried = [a.at for a in record.approval_attempts if a.vm and a.vm != ARM]
        first = min(tried) if tried else now
        handover = min(deadline, first + timedelta(seconds=settings.arm_fallback_after_seconds))
    differs = [a for a in record.approval_attempts if a.outcome.startswith(DIFFERS)]
    if differs:
        return Phase(outcome="vetoed", detail=f"{differs[-1].vm}'s relay: {differs[-1].outcome}")
    # A relay that refused for good is not asked again for this event, in this call or later.
    refused: set[str] = {
        a.vm for a in record.approval_attempts if a.vm is not None and final_refusal(a.outcome)
    }
    # Each VM's own view (its reporter row: one query) is what its relay must confirm; a
    # VM whose own view decided stricter than the event is not asked, except by a person.
    rows = reporters if reporters is not None else pipeline.store.reporter_rows(record.event_id)
    record.reporter_views, stricter_own = own_views(rows, record)
    # The same rows say who reports it (what Store.load_reporters reads): the outcome's
    # announcement names them without a second query of the partition (issue 47).
    record.reporters = {r.vm: r.status for r in rows if r.status}
    record.past_reporters = [r.vm for r in rows]
    not_approving: set[str] = set() if by.startswith("manual:") else set(stricter_own)
    if only is not None:
        allowed = {name.casefold() for name in only}
        not_approving |= {name for name in record.resources if name.casefold() not in allowed}
    skip = refused.union(not_approving)
    relays = _relays(pipeline, record, now, skip=skip, rows=rows)
    unheard = len({r.casefold() for r in record.resources}) > len(relays) + len(skip)
    if not relays:
        # The named VMs' relays may simply not have reported yet (a set-mate's document
        # came first): wait for them while there is time, then give up.
        waiting = unheard and not arm_next and clock.now() < deadline
        return Phase(
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
        pipeline.relay_lanes,
    )


def view_for(record: EventRecord, vm_name: str) -> VmView:
    """The view of the event the decision for `vm_name` rests on, as that VM's relay must
    see it in its own IMDS: its own view, as its reporter row keeps it (loaded into
    `record.reporter_views` by the relay phase). A named VM that has not reported the
    event (or ARM's "") gets the event as stored."""
    own = record.reporter_views.get(vm_name.casefold())
    if own is not None:
        return own
    return VmView(
        vm=vm_name,
        event_type=record.event_type,
        event_source=record.event_source,
        duration_s=record.duration_in_seconds,
        not_before=record.not_before,
        resources=normalise_resources(record.resources),
    )


def expect_for(record: EventRecord, vm_name: str) -> dict[str, object]:
    """The callback's `Expect` entry: `view_for(...).expect()`, without Resources when the
    row could not keep every name (an event naming more than MAX_RESOURCES VMs)."""
    expect = view_for(record, vm_name).expect()
    if record.resources_dropped:
        expect.pop("Resources")
    return expect


def _manual_detail(by: str, outcome: str, vm: str | None, detail: str) -> str:
    who = by.removeprefix("manual:")
    if outcome == "approved":
        return f"approved by {who} (by hand), via {approval_path(vm)}"
    return f"{who} approved by hand, but nothing could approve: {detail}"


def why_not(record: EventRecord | None) -> str:
    """Why an approval was not attempted, in words for the audit and the caller."""
    if record is None:
        return "unknown event"
    if record.ended:
        return f"event {record.ended}"
    if record.started:
        return "event already started"
    if record.approval == "approved":
        return "already approved"
    return "another caller is approving it"


def _claim(
    store: Store, event_id: str, now: datetime, settings: Settings, tag: str = ""
) -> tuple[EventRecord | None, bool]:
    """Claim the approval for `tag` (functions.store.claims: held for one attempt's budget
    and a margin; its holder, delivered again after its host died, takes it over at once)."""
    lease = approval_lease(settings.approval_budget_seconds)

    def change(rec: EventRecord | None) -> EventRecord | None:
        if rec is None or rec.ended or rec.started or rec.approval == "approved":
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


def _deadline(record: EventRecord, settings: Settings, now: datetime) -> datetime:
    if record.not_before is None:
        return now + timedelta(seconds=settings.approval_budget_seconds)
    return record.not_before - timedelta(seconds=settings.approval_margin_seconds)


# Named VMs that have not reported the event whose rows one attempt reads at most: the
# event's reporters come first (one query of its reporter rows), so a `Resources` list a
# VM made up (999 names no relay reported) costs this many point reads, not 999.
MAX_UNREPORTED_READS = 4


def candidates(record: EventRecord, skip: set[str]) -> list[str]:
    """The named VMs an attempt may ask, in `Resources` order (first is leader): those
    that reported the event (their own views are loaded in `record.reporter_views`), then
    at most MAX_UNREPORTED_READS of the rest."""
    reported = record.reporter_views
    named = [n for n in record.resources if n not in skip]
    first = [n for n in named if n.casefold() in reported]
    rest = [n for n in named if n.casefold() not in reported][:MAX_UNREPORTED_READS]
    return first + rest


@dataclass(frozen=True)
class Asked:
    """A relay an attempt may ask: its VM's name, whether that VM's latest document lists
    the event, and where and how to call it (Azure's address, the attested keys)."""

    name: str
    reported: bool
    target: RelayTarget


def _relays(
    pipeline: Pipeline,
    record: EventRecord,
    now: datetime,
    skip: set[str],
    rows: list[Reporter] | None = None,
) -> list[Asked]:
    """Named VMs whose relays were heard recently (a message, or a verified liveness
    hint), reporters first (`candidates`): at most RELAYS_PER_ATTEMPT of them, so an event
    naming 1,000 VMs costs a few point reads, not 1,000 (the others stay "unheard": a
    later attempt reaches them). A VM whose approved event never started in its own view
    (`unstarted`) is not asked for a while (functions.pipeline.slot_rules.suspect).

    A VM whose own reporter row (`rows`, read with the event) says it lists the event,
    lately, with its attested vmId, was heard by that document: its identity row alone
    (address, keys, `unstarted`) is read, not its VM row too (issue 47: 6 Table requests
    per approval, 5 with this). Others are found as before, through the VM row."""
    fresh = timedelta(seconds=pipeline.settings.relay_silent_after_seconds)
    own = {row.vm.casefold(): row for row in rows or ()}
    chosen: list[Asked] = []
    for name in candidates(record, skip):
        if len(chosen) >= RELAYS_PER_ATTEMPT:
            break
        row = own.get(name.casefold())
        if row is not None and row.status and row.vm_id and _lately(row.seen, now, fresh):
            found = pipeline.relay_identity(row.vm_id)
            if found is not None and not suspect(found[1], record.event_id, now):
                chosen.append(Asked(row.vm, True, found[0]))
            continue
        vm = pipeline.store.get_vm(name)
        if vm is None or suspect(vm, record.event_id, now) or not vm.vm_id:
            continue
        found = pipeline.relay_identity(vm.vm_id)
        if found is None or suspect(found[1], record.event_id, now):
            continue
        heard = vm.last_seen
        if heard is None or now - heard > fresh:
            heard = pipeline.last_heard(vm)  # only then the liveness read
        if heard is None or now - heard > fresh:
            continue
        wanted = record.event_id.casefold()
        reported = any(e.casefold() == wanted for e in vm.event_ids)
        chosen.append(Asked(vm.name, reported, found[0]))
    return chosen


def _lately(seen: datetime | None, now: datetime, fresh: timedelta) -> bool:
    return seen is not None and now - seen <= fresh


def _try_relays(
    record: EventRecord,
    relays: list[Asked],
    session: requests.Session,
    clock: Clock,
    stop: datetime,
    deadline: datetime,
    by: str,
    unheard: bool,
    lanes: RelayLanes | None = None,
) -> Phase:
    """Round-robin over the relays with backoff between rounds; `unheard`: some named VMs
    have no usable relay yet, so "all refused" is not final while time remains.
    `deadline`: when relays are given up (NotBefore less the margin, or ARM's turn).
    `lanes`: each VM's share of this host's workers (functions.pipeline.lanes): a relay
    busy with another approval, or silent lately, is not asked; when no relay was asked in
    a round, this attempt ends at once (`later`) instead of holding its worker."""
    attempts: list[Attempt] = []
    refused: set[str] = set()
    delay = BACKOFF_START_SECONDS
    me = object()  # this attempt, in the lanes: its own retries are never refused
    while True:
        asked = held = False
        for relay in relays:
            name = relay.name
            if name in refused:
                continue
            remaining = (stop - clock.now()).total_seconds()
            if remaining <= 0:
                break
            busy = lanes.enter(name, me, clock.now()) if lanes is not None else None
            if busy is not None:
                held = True
                attempts.append(
                    Attempt(at=clock.now(), vm=name, outcome=f"not asked: {busy}", by=by)
                )
                continue
            verdict, status, text = "retry", None, "error: the exchange raised"
            try:
                verdict, status, text = post_start(
                    relay.target,
                    record.event_id,
                    session,
                    remaining,
                    reported=relay.reported,
                    expect=expect_for(record, name),
                )
            finally:
                if lanes is not None:  # no HTTP answer in a fair time: silent lately
                    silent = text.startswith("error:") and remaining >= 2 * lanes.patience
                    lanes.leave(name, me, clock.now(), not silent, text)
            asked = True
            attempts.append(Attempt(at=clock.now(), vm=name, outcome=text, by=by))
            if verdict == "differs":
                return Phase(outcome="vetoed", detail=f"{name}'s relay: {text}", attempts=attempts)
            if verdict == "approved":
                return Phase(
                    outcome="approved",
                    via=name,
                    detail=text,
                    attempts=attempts,
                    status=status,
                )
            if verdict == "refused":
                refused.add(name)
        if held and not asked:
            # Every relay left is another approval's or silent lately: its turn comes
            # when the event is due again, and this worker goes back to the queue now.
            return Phase(
                outcome="later",
                detail="relays not asked now: " + _last_texts(attempts),
                attempts=attempts,
            )
        if all(r.name in refused for r in relays):
            # Named VMs whose relays are not known yet may still approve: keep it pending.
            waiting = unheard and clock.now() < deadline
            return Phase(
                outcome="later" if waiting else "exhausted",
                detail="every known named relay refused: " + _last_texts(attempts),
                attempts=attempts,
            )
        now = clock.now()
        if now + timedelta(seconds=delay) >= stop:
            if stop < deadline:
                return Phase(
                    outcome="later",
                    detail="relays unreachable so far: " + _last_texts(attempts),
                    attempts=attempts,
                )
            return Phase(
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
    pipeline: Pipeline,
    record: EventRecord,
    outcome: Outcome,
    vm: str | None,
    attempts: list[Attempt],
    detail: str,
    by: str,
    imds_status: int | None = None,
    *,
    announce: bool = True,
    settle: tuple[tuple[Transition, ...], list[dict[str, Any]]] = ((), []),
    vetoed: bool = False,
) -> ApprovalResult:
    """Record the outcome in one write. An outcome worth announcing is published FIRST
    and written as done in that same write: a crash in between leaves the claim held,
    and whoever takes it over approves again (the relay answers a repeated AttemptId
    from memory, ARM acknowledges once) and publishes again (the topic drops a
    MessageId it has seen), so nothing is lost and nothing happens twice. A publish
    that fails leaves the announcement unclaimed; reconcile announces it later."""
    store, clock = pipeline.store, pipeline.clock
    now = clock.now()
    settle_marks, settle_rows = settle
    state = {"approved": "approved", "failed": "failed", "retry_later": "pending"}[outcome]
    transition = {"approved": Transition.APPROVED, "failed": Transition.APPROVAL_FAILED}.get(
        outcome
    )
    announced = False
    if announce and transition is not None and transition.value not in record.announced:
        shown = copy_record(record)
        # Who reports it is not stored on the row (the copy drops it): kept, not reread.
        shown.reporters, shown.past_reporters = dict(record.reporters), list(record.past_reporters)
        shown.approval = state  # type: ignore[assignment]
        shown.approval_reason = detail[:1000]
        shown.approved_by = vm if outcome == "approved" else shown.approved_by
        # A person's approval names them in the announcement too, not only in the audit.
        manual = by.startswith("manual:")
        details = {transition: _manual_detail(by, outcome, vm, detail)} if manual else None
        try:
            publish_claimed(pipeline, shown, [transition], now, details, mark=False)
            announced = True
        except Exception:
            log.exception(
                "%s of %s not published; reconcile retries it", transition, record.event_id
            )

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
        done = [t.value for t in settle_marks if claims.is_pending(rec.announced.get(t.value))]
        if announced and transition is not None:
            done.append(transition.value)
        claims.finish(rec.announced, done)
        return rec

    decision = record.decision
    audit = store.audit_row(
        record.event_id,
        at=now,
        rule=decision.rule if decision else "",
        action="approve",
        outcome=outcome if outcome != "approved" else f"approved via {approval_path(vm)}",
        detail=detail,
        by=by,
        # Once per outcome: an outcome kept by someone else's write meanwhile (below) is
        # audited on its own, and a takeover that records the same outcome again leaves
        # one audit row.
        once=f"approval:{outcome}:{vm}" if outcome != "retry_later" else "",
        anchor=record.decided_at,
        rank=3,
    )
    # The audit row in the same transaction as the outcome's write (one request; both or
    # neither: a host that dies before it leaves the claim to a takeover, which audits).
    _, wrote = store.mutate_event(
        record.event_id, change, known=record, with_rows=[audit, *settle_rows]
    )
    if not wrote:
        store.put_audit(audit)
    log.info("approval of %s: %s %s", record.event_id, outcome, detail)
    return ApprovalResult(
        event_id=record.event_id,
        outcome=outcome,
        vm=vm,
        detail=detail,
        attempts=attempts,
        imds_status=imds_status if isinstance(imds_status, int) else None,
    )
