"""Announcing a transition exactly once fleet-wide: claim in the event row, then publish.

The claim (functions.store.claims, one mark per transition in `announced`, written under
the row's ETag) is what makes 100 concurrent reporters announce once. A claim is written
"pending" and marked "done" after the publish; if the publish fails the claim is released
and the error raised, so the message is redelivered and the announcement retried. A crash
between the two leaves "pending", which the watchdog republishes once it is stale (the
MessageId makes that safe).

Publishing `overdue` for an event approved through a VM's relay that Azure never started
flags that VM `unstarted` first (issue 37; `flag_unstarted`, its rule `flags_unstarted`):
a relay that says "approved" to events its VM made up would otherwise take its set's slot
again and again, a new EventId each lapse. A crash in between leaves the announcement's
claim, whose next publish flags again (the flag is idempotent). The approver reads the
flag (functions.pipeline.relay_phase.suspect) and does not ask that VM's relay again for
UNSTARTED_FOR. It reads and writes no slot row (not functions.pipeline.capacity's).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import datetime
from typing import Any

from functions.identity.facts import normalise_vm_id
from functions.model.envelope import PREEMPT, SCHEDULED, TERMINATE
from functions.model.event import Links, Notification, Transition
from functions.model.policy import Policy, transition_pages
from functions.pipeline.context import Pipeline
from functions.pipeline.due import ENDS
from functions.settings import Settings
from functions.store import claims
from functions.store.audit import AuditRows
from functions.store.records import EventRecord, VmRecord
from functions.store.rows import UNREAD
from functions.store.state import Store

NO_PAGE = {Transition.COMPLETED, Transition.CANCELLED, Transition.APPROVED}


def build(
    record: EventRecord,
    transition: Transition,
    now: datetime,
    policy: Policy | None,
    settings: Settings | None = None,
    detail: str = "",
    vm: str | None = None,
) -> Notification:
    """The notification for one transition; pages and links follow the policy and settings."""
    decision = record.decision
    detail = detail or _default_detail(record, transition)
    again = occurrence(record, transition)
    if transition in NO_PAGE:
        page = False
    elif transition_pages(policy, transition):
        page = True
    else:
        page = bool(decision and decision.page and transition != Transition.SCHEDULED)
    links = Links()
    if settings is not None:
        links = Links(
            status_url=settings.status_url(),
            approve_url=settings.approve_url(record.event_id),
        )
    return Notification(
        transition=transition,
        occurred_at=now,
        event=record.snapshot(),
        vm=vm,
        decision=decision,
        detail=detail,
        links=links,
        occurrence=again,
        page=page,
        waiting=record.waiting_for if record.approval == "pending" else "",
    )


def occurrence(record: EventRecord, transition: Transition) -> str | None:
    """What tells a re-decided `decided` apart from a first one (MessageId suffix), so
    Service Bus duplicate detection never drops it; the same on every republish."""
    if transition is Transition.DECIDED and record.redecided_at is not None:
        return "redecided-" + record.redecided_at.strftime("%Y%m%dT%H%M%S")
    if transition in (Transition.COMPLETED, Transition.CANCELLED) and record.reopened:
        return f"reopened-{record.reopened}"
    return None


def _transition_details(record: EventRecord, overdue: str) -> dict[Transition, str]:
    """The details the announcements say beyond their default: why it is overdue, and how
    it ended (the row's `end_detail`)."""
    details: dict[Transition, str] = {}
    if overdue:
        details[Transition.OVERDUE] = overdue
    if record.ended and record.end_detail:
        for transition in ENDS:
            details[transition] = record.end_detail
    return details


def _default_detail(record: EventRecord, transition: Transition) -> str:
    decision = record.decision
    if transition == Transition.DECIDED and decision is not None:
        return decision.reason
    if transition == Transition.POLICY_INVALID and decision is not None:
        return decision.reason
    if transition == Transition.APPROVAL_FAILED:
        return f"nothing could approve: it will start at NotBefore. {record.approval_reason}"
    if transition == Transition.APPROVED:
        if record.approved_by == "arm":
            return f"approved via arm: {record.approval_reason}"
        return f"approved via relay:{record.approved_by}: through the relay of {record.approved_by}"
    return ""


def publish_claimed(
    pipeline: Pipeline,
    record: EventRecord,
    transitions: Iterable[Transition],
    now: datetime,
    details: dict[Transition, str] | None = None,
    *,
    mark: bool = True,
    with_rows: list[dict[str, Any]] | None = None,
) -> list[Notification]:
    """Publish transitions this caller claimed in `record.announced`, then mark them done
    (`mark` False: the caller marks them done in a write it makes anyway), with
    `with_rows` (the decision's audit row) in the same transaction as that mark."""
    sent = []
    pending = list(transitions)
    if pending and not record.past_reporters:
        pipeline.store.load_reporters(record)  # who reported it, for the notification
    for index, transition in enumerate(pending):
        note = build(
            record,
            transition,
            now,
            pipeline.policy,
            pipeline.settings,
            (details or {}).get(transition, ""),
        )
        try:
            pipeline.publisher.publish(note)
        except Exception:
            # Given back, so the next reconcile claims and announces them at once.
            release(pipeline.store, record.event_id, pending[index:], known=record)
            raise
        sent.append(note)
    if pending and mark:
        mark_done(pipeline.store, record.event_id, pending, known=record, with_rows=with_rows)
    return sent


def publish_due(
    pipeline: Pipeline,
    record: EventRecord,
    sending: list[Transition],
    now: datetime,
    overdue: str,
    *,
    deferred: bool,
    approving: str,
) -> list[dict[str, Any]]:
    """Publish the announcements the reconcile claimed (`sending`, in the order a person
    reads them; `overdue`: why it is overdue; its VM flagged `unstarted` first), the
    decision's audit row with them. With
    `deferred` the approval that follows marks them done, with the audit row, in the
    write recording its outcome; else they are marked done here. `approving`: the holder
    of the approval claimed with them, given back if the topic fails (`give_back`).
    Returns the audit rows that go with marking them done."""
    if Transition.OVERDUE in sending:
        # Before the announcement: a crash in between leaves its claim, whose next
        # publish flags again (the flag is idempotent).
        flag_unstarted(pipeline, record, now)
    audited: list[dict[str, Any]] = []
    if {Transition.DECIDED, Transition.POLICY_INVALID} & set(sending):
        # The decision's audit goes with its announcement, in the write that marks it
        # done: both are due until then, so a host that dies before leaves both due.
        noted = _decision_audit(record)
        audited = [noted] if noted is not None else []
    details = _transition_details(record, overdue)
    try:
        publish_claimed(
            pipeline, record, sending, now, details, mark=not deferred, with_rows=audited
        )
    except Exception:
        if approving:
            give_back(pipeline.store, record.event_id, approving)
        raise
    return audited


def release(
    store: Store,
    event_id: str,
    transitions: Iterable[Transition],
    known: EventRecord | None = UNREAD,
) -> None:
    """Give back claims whose publish failed, so the next caller announces them."""
    _settle(store, event_id, transitions, known, claims.release)


def give_back(store: Store, event_id: str, holder: str) -> None:
    """The approval `holder` claimed with announcements whose publish failed (the topic
    failed before the approval could follow them: functions.pipeline.reconcile): its claim
    goes back beside theirs (`release`), so the redelivery approves at once."""

    def change(rec: EventRecord | None) -> EventRecord | None:
        if rec is None or rec.approval != "in_progress" or not holder:
            return None
        if claims.holder(rec.approval_claim) != holder:
            return None
        rec.approval = "pending"
        rec.approval_claim = ""
        return rec

    store.mutate_event(event_id, change)


def mark_done(
    store: Store,
    event_id: str,
    transitions: Iterable[Transition],
    known: EventRecord | None = UNREAD,
    with_rows: list[dict[str, Any]] | None = None,
) -> None:
    """`known`: the row as the claim wrote it; usually nobody wrote since, saving a read.
    `with_rows`: written in the same transaction as the mark, and only with it (whoever
    marks them done writes them: the announcement and its audit come together)."""
    _settle(store, event_id, transitions, known, claims.finish, with_rows)


def _settle(
    store: Store,
    event_id: str,
    transitions: Iterable[Transition],
    known: EventRecord | None,
    settle: Callable[[dict[str, str], set[str]], bool],
    with_rows: list[dict[str, Any]] | None = None,
) -> None:
    """Apply `settle` to the transitions' marks; write only if it changed one."""
    keys = {t.value for t in transitions}

    def change(rec: EventRecord | None) -> EventRecord | None:
        if rec is None or not settle(rec.announced, keys):
            return None
        return rec

    store.mutate_event(event_id, change, known=known, with_rows=with_rows)


def _decision_audit(record: EventRecord) -> dict[str, Any] | None:
    """The audit row of the row's decision (None without one): one row per decision,
    keyed by when it was made, so a redelivery or a takeover that audits it again leaves
    one row. Written in the write that marks its announcement done (`mark_done`'s
    `with_rows`, or the approval's outcome when that write carries the mark): a host that
    dies before leaves both due, and whoever announces the decision then audits the
    decision as it is then, never one a later view replaced. What follows the decision
    (its announcement, the approval and its capacity slot) is not done here: the
    decision's own write holds its intent, and functions.pipeline.reconcile does it."""
    decision = record.decision
    if decision is None:
        return None
    outcome = "decided"
    if decision.policy_error:
        outcome = "failed closed: policy invalid"
    elif decision.dry_run:
        outcome = f"dry run: would {decision.action}"
    elif decision.action == "approve" and record.event_status != "Started":
        window = record.approve_after or decision.approve_after
        if window is not None and record.approval != "in_progress":
            outcome = f"waiting for the maintenance window at {window.isoformat()}"
        else:
            outcome = "approving"
    at = record.redecided_at or record.decided_at or record.first_seen
    # One row per announcement of a decision (its MessageId's occurrence): a re-decision
    # made in the same instant as the first (two views in one reconcile) is a row of its
    # own, not an overwrite of the first.
    again = occurrence(record, Transition.DECIDED) or "first"
    return AuditRows.audit_row(
        record.event_id,
        at=at,
        rule=decision.rule,
        action=decision.action,
        outcome=outcome,
        detail=decision.reason,
        once=f"decision:{at.isoformat()}:{decision.rule}:{decision.action}:{again}",
        rank=1,
    )


# ------------------------------------------------------------------ unstarted

# Types after which the VM is gone (evicted, deleted): never flagged for not starting.
GONE_AFTER = frozenset(t.casefold() for t in (PREEMPT, TERMINATE))


def flags_unstarted(record: EventRecord, own_status: str | None) -> str:
    """The VM to flag `unstarted` for this event ("" for none): the VM whose relay
    approved it, when its own document (its reporter row's status: `own_status`) still
    lists the event as Scheduled. A set-mate that keeps listing a shared event cannot get
    the approver flagged, nor can a VM that no longer lists it (a 5 s Freeze over between
    two polls)."""
    vm = record.approved_by
    if record.approval != "approved" or not vm or vm == "arm" or record.started:
        return ""
    if record.event_type.casefold() in GONE_AFTER:
        return ""  # its VM is evicted or deleted: no Started may ever be seen, and no lie
    return vm if own_status == SCHEDULED else ""


def flag_unstarted(pipeline: Pipeline, record: EventRecord, now: datetime) -> None:
    """An event approved through a VM's relay that Azure never started, by that VM's own
    document (its reporter row: one point read): its relay is not asked to approve again
    for a while (`relay_phase.suspect`)."""
    if not record.approved_by or record.approved_by == "arm" or record.approval != "approved":
        return
    own = pipeline.store.get_reporter(record.event_id, record.approved_by)
    vm = flags_unstarted(record, None if own is None else own.status)
    if not vm:
        return

    def change(rec: VmRecord | None) -> VmRecord | None:
        if rec is None or rec.unstarted == record.event_id:
            return None
        rec.unstarted = record.event_id
        rec.unstarted_at = now
        return rec

    flagged, _ = pipeline.store.mutate_vm(vm, change)
    # And in its identity row, where the approver looks (it reads no VM row for a VM whose
    # own reporter row is fresh: functions.pipeline.relay_phase).
    admission = pipeline.admission
    if flagged is None or not flagged.vm_id or admission is None:
        return

    def flag(identity: Any) -> Any:
        if identity is None or identity.unstarted == record.event_id:
            return None
        return identity.model_copy(update={"unstarted": record.event_id, "unstarted_at": now})

    admission.registry.mutate(normalise_vm_id(flagged.vm_id), flag)
