"""Ingest one envelope: VM state, event lifecycle, the decision, announcements, approval.

The Service Bus handler and the local host both call `ingest_message`; it takes every
collaborator as an argument. Its contract with the caller:
- it returns normally when the message is done with (processed, a stale duplicate, or
  rejected and recorded): complete the message;
- it raises when something transient failed (storage, the topic): abandon the message so
  it is redelivered; everything here is idempotent, so the redelivery is harmless.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Literal

import requests
from pydantic import BaseModel, Field

from functions.announce import publish_claimed
from functions.approve import ApprovalResult, approve_event
from functions.clock import Clock
from functions.lifecycle import absent, report
from functions.notifications import Decision, Transition
from functions.policy import Policy, decide, is_impactful
from functions.publish import Publisher
from functions.redecide import redecide, should_redecide
from functions.relay_recovery import announce_recovery, claim_recovery
from functions.settings import Settings
from functions.state import CapacityRecord, EventRecord, Store, VmRecord
from relay.models import TERMINATE, DocumentError, Envelope, ScheduledEvent, parse_envelope

log = logging.getLogger(__name__)


class IngestResult(BaseModel):
    outcome: Literal["processed", "stale", "rejected"]
    vm: str | None = None
    reason: str = ""
    transitions: list[tuple[str, str]] = Field(default_factory=list)  # (EventId, transition)
    approvals: list[ApprovalResult] = Field(default_factory=list)


class Pipeline:
    """The collaborators ingest, the watchdog and the HTTP functions share."""

    def __init__(
        self,
        store: Store,
        settings: Settings,
        publisher: Publisher,
        session: requests.Session,
        clock: Clock,
    ) -> None:
        self.store = store
        self.settings = settings
        self.publisher = publisher
        self.session = session
        self.clock = clock

    @property
    def policy(self) -> Policy | None:
        return self.settings.policy.policy


def ingest_message(body: bytes | str, pipeline: Pipeline, message_id: str = "") -> IngestResult:
    """Process one message body from the documents queue (or the local inbox)."""
    now = pipeline.clock.now()
    try:
        envelope = parse_envelope(body)
    except DocumentError as exc:
        log.warning("rejected message %s: %s", message_id or "?", exc)
        pipeline.store.reject(at=now, reason=str(exc), body=body, message_id=message_id)
        return IngestResult(outcome="rejected", reason=str(exc))
    return ingest_envelope(envelope, pipeline)


def _is_stale(vm: VmRecord | None, envelope: Envelope) -> bool:
    """Older than what we have: a redelivery or an out-of-order message.

    Both the sequence and the relay's observation time must be no newer: a relay whose
    state was wiped restarts its sequence, but its clock still moves forward.
    """
    if vm is None or vm.last_observed_at is None:
        return False
    return envelope.sequence <= vm.last_sequence and envelope.observed_at <= vm.last_observed_at


def ingest_envelope(envelope: Envelope, pipeline: Pipeline) -> IngestResult:
    store, clock = pipeline.store, pipeline.clock
    name = envelope.vm.name
    result = IngestResult(outcome="processed", vm=name)
    for _ in range(20):
        vm = store.get_vm(name)
        if _is_stale(vm, envelope):
            return IngestResult(outcome="stale", vm=name, reason="sequence already processed")
        now = clock.now()
        document = envelope.scheduled_events
        current: list[ScheduledEvent] = list(document.events) if document else []
        # Event rows first, VM row last: if we crash in between, the redelivery is not
        # "stale" and redoes the (idempotent) event updates.
        to_approve: list[str] = []
        for event in current:
            _report(event, envelope, pipeline, now, result, to_approve)
        if document is not None:
            current_ids = {e.event_id.casefold() for e in current}
            for old in vm.event_ids if vm else []:
                if old.casefold() not in current_ids:
                    _absent(old, name, pipeline, now, result)
        recovered: list[str] = []  # the silence this document ends, if announced
        if _save_vm(store, vm, envelope, now, recovered):
            # After the VM row, so this VM's callback URL is known to the approver.
            for event_id in to_approve:
                result.approvals.append(
                    approve_event(
                        event_id,
                        store,
                        pipeline.settings,
                        pipeline.session,
                        clock,
                        publisher=pipeline.publisher,
                        give_up_at=now
                        + timedelta(seconds=pipeline.settings.approval_budget_seconds),
                    )
                )
            for mark in recovered:
                _announce_recovery(pipeline, name, mark, now)
            return result
        log.info("VM row %s changed concurrently; re-reading", name)
    raise RuntimeError(f"VM row {name} kept changing; giving up this delivery")


def _save_vm(
    store: Store,
    vm: VmRecord | None,
    envelope: Envelope,
    now: datetime,
    recovered: list[str] | None = None,
) -> bool:
    """Write the VM row only if nobody else did since we read it (else the caller redoes).

    The write starts from the row read at the top of ingest (its ETag guards it), so a
    document costs one read of the VM row, not two. A silence announced for this VM ends
    here: its mark goes to `recovered` for the caller to announce (once: only one writer
    of the row sees it)."""
    expected = vm.etag if vm else None
    claimed: list[str] = []

    def change(current: VmRecord | None) -> VmRecord | None:
        claimed.clear()
        if (current.etag if current else None) != expected:
            raise _Moved
        record = current or VmRecord(name=envelope.vm.name)
        mark = claim_recovery(record, now)
        if mark is not None:
            claimed.append(mark)
        record.last_sequence = max(record.last_sequence, envelope.sequence)
        if record.last_observed_at is None or envelope.observed_at > record.last_observed_at:
            record.last_observed_at = envelope.observed_at
        record.last_seen = now
        ref = envelope.vm
        record.callback_url = ref.callback_url or record.callback_url
        record.scale_set = ref.scale_set or record.scale_set
        record.availability_set = ref.availability_set or record.availability_set
        record.resource_id = ref.resource_id or record.resource_id
        record.relay_version = envelope.relay_version
        if envelope.document is not None:
            document = envelope.scheduled_events
            assert document is not None
            record.last_incarnation = document.document_incarnation
            record.event_ids = [e.event_id for e in document.events]
        return record

    try:
        store.mutate_vm(envelope.vm.name, change, known=vm)
    except _Moved:
        return False
    if recovered is not None:
        recovered.extend(claimed)
    return True


def _announce_recovery(pipeline: Pipeline, name: str, mark: str, now: datetime) -> None:
    """After the document's own work: a topic failure here must not redeliver a document
    that is already processed (it would be stale); the watchdog publishes it later."""
    try:
        announce_recovery(pipeline.store, pipeline.publisher, name, mark, now)
    except Exception:
        log.exception("relay_recovered for %s not published; the watchdog retries", name)


class _Moved(Exception):
    pass


def _report(
    event: ScheduledEvent,
    envelope: Envelope,
    pipeline: Pipeline,
    now: datetime,
    result: IngestResult,
    to_approve: list[str],
) -> None:
    store = pipeline.store
    if _already_ended_with(store, event.event_id, envelope.vm.name):
        return
    claimed: list[Transition] = []
    made: list[bool] = []  # whether this write made the decision (vs. re-announcing it)

    newcomer: list[bool] = []  # this VM was not a reporter before

    def change(rec: EventRecord | None) -> EventRecord | None:
        claimed.clear()
        made.clear()
        newcomer[:] = [rec is None or envelope.vm.name not in rec.reporters]
        updated, transitions = report(rec, event, envelope.vm, now)
        claimed.extend(transitions)
        target = updated if updated is not None else rec
        if target is None or target.ended:
            return updated
        if target.decision is None:
            target.decision = decide(pipeline.settings.policy, event, now, tuple(target.scale_sets))
            target.decided_at = now
            made.append(True)
        elif should_redecide(target, pipeline.settings.policy, now):
            # It failed closed on an invalid policy; this host's policy is valid.
            redecide(target, event, pipeline.settings.policy, now)
            made.append(True)
        # Claimed here also when a failed publish released the claim: the redelivery
        # announces the decision it could not announce before.
        key = (
            Transition.POLICY_INVALID if target.decision.policy_error else Transition.DECIDED
        ).value
        if key not in target.announced:
            target.announced[key] = f"pending:{now.isoformat()}"
            claimed.append(Transition(key))
            return target
        return updated

    record, won = store.mutate_event(event.event_id, change)
    if not won or record is None:
        return
    approve_now = False
    if made:
        record, approve_now = after_decision(record, event, pipeline, now)
    elif Transition.DECIDED in claimed or (newcomer[0] and event.affects(envelope.vm.name)):
        # A decision re-announced after a failed publish, or a named VM whose relay was
        # not known when the approval was last tried: try (again) now.
        approve_now = (
            record.approval == "pending"
            and record.approve_after is None
            and record.approval_reason != "capacity"
        )
    announce_first = [t for t in claimed if t in (Transition.SCHEDULED, Transition.STARTED)]
    rest = [t for t in claimed if t not in announce_first]
    publish_claimed(
        store,
        pipeline.publisher,
        record,
        announce_first + rest,
        now,
        pipeline.policy,
        pipeline.settings,
    )
    result.transitions.extend((record.event_id, t.value) for t in announce_first + rest)
    if approve_now:
        to_approve.append(record.event_id)


def _already_ended_with(store: Store, event_id: str, vm: str | None) -> bool:
    """Whether the event is known to have ended (with `vm` among its past reporters):
    then neither a late report nor an absence changes its row. Taken from the row as this
    Store last saw it, without a read: ending is final and past reporters are only ever
    added, so what was true then is true now."""
    seen = store.recent_event(event_id)
    return seen is not None and bool(seen.ended) and (vm is None or vm in seen.past_reporters)


def after_decision(
    record: EventRecord, event: ScheduledEvent, pipeline: Pipeline, now: datetime
) -> tuple[EventRecord, bool]:
    """The winner of the decision audits it and, for `approve`, applies the capacity guard.
    Returns the row and whether to approve now (the caller does, after announcing)."""
    store = pipeline.store
    decision = record.decision
    assert decision is not None
    outcome = "decided"
    approval = ""
    reason_suffix = ""
    if decision.policy_error:
        outcome = "failed closed: policy invalid"
    elif decision.dry_run:
        outcome = f"dry run: would {decision.action}"
    elif decision.action == "approve" and record.event_status != "Started":
        approval = "pending"
        if decision.approve_after is not None:
            outcome = f"waiting for the maintenance window at {decision.approve_after.isoformat()}"
        elif needs_capacity(event) and not acquire_capacity(store, record, pipeline.policy, now):
            reason_suffix = (
                f"; waiting: {capacity_limit(pipeline.policy)} impactful event(s) already "
                "approved in its scale set / availability set"
            )
            outcome = "waiting for capacity"
        else:
            outcome = "approving"
    store.audit(
        record.event_id,
        at=now,
        rule=decision.rule,
        action=decision.action,
        outcome=outcome,
        detail=decision.reason + reason_suffix,
    )
    if not approval:
        return record, False

    def change(rec: EventRecord | None) -> EventRecord | None:
        if rec is None or rec.approval:
            return None
        rec.approval = "pending"  # type: ignore[assignment]
        rec.approve_after = decision.approve_after
        if reason_suffix:
            rec.approval_reason = "capacity"
            rec.decision = decision.model_copy(update={"reason": decision.reason + reason_suffix})
        return rec

    updated, _ = store.mutate_event(record.event_id, change, known=record)
    return updated or record, outcome == "approving"


def _absent(
    event_id: str, vm: str, pipeline: Pipeline, now: datetime, result: IngestResult
) -> None:
    end_event(event_id, vm, pipeline, now, result)


def end_event(
    event_id: str,
    vm: str,
    pipeline: Pipeline,
    now: datetime,
    result: IngestResult | None = None,
    detail: str = "",
) -> None:
    store = pipeline.store
    if _already_ended_with(store, event_id, None):
        return
    claimed: list[Transition] = []

    def change(rec: EventRecord | None) -> EventRecord | None:
        claimed.clear()
        updated, transitions = absent(rec, vm, now)
        claimed.extend(transitions)
        return updated

    record, won = store.mutate_event(event_id, change)
    if not won or record is None or not claimed:
        return
    if holds_capacity(record):
        release_capacity(store, record)
    details = dict.fromkeys(claimed, detail) if detail else None
    publish_claimed(
        store, pipeline.publisher, record, claimed, now, pipeline.policy, pipeline.settings, details
    )
    if result is not None:
        result.transitions.extend((record.event_id, t.value) for t in claimed)


# ----------------------------------------------------------------------- capacity guard


def needs_capacity(event: ScheduledEvent | EventRecord) -> bool:
    """Only impactful events count, and Terminate does not: a deletion is what the scale
    set's owner asked for, and holding it back would only delay it to NotBefore."""
    if event.event_type.casefold() == TERMINATE.casefold():
        return False
    if isinstance(event, EventRecord):
        probe = ScheduledEvent(
            EventId=event.event_id,
            EventStatus=event.event_status,
            EventType=event.event_type,
            DurationInSeconds=event.duration_in_seconds,
        )
        return is_impactful(probe)
    return is_impactful(event)


def capacity_limit(policy: Policy | None) -> int:
    return policy.max_concurrent_per_set if policy else 1


def capacity_keys(record: EventRecord) -> list[str]:
    return [f"ss:{s}" for s in record.scale_sets] + [f"as:{a}" for a in record.availability_sets]


def acquire_capacity(
    store: Store, record: EventRecord, policy: Policy | None, now: datetime
) -> bool:
    """Take a slot in each of the event's sets, or none at all."""
    limit = capacity_limit(policy)
    taken: list[str] = []
    for key in capacity_keys(record):
        if _take(store, key, record.event_id, limit):
            taken.append(key)
        else:
            for done in taken:
                _give_back(store, done, record.event_id)
            return False
    return True


def _take(store: Store, key: str, event_id: str, limit: int) -> bool:
    # Holders whose event ended (or vanished) free their slot; checked before the write.
    current = store.get_capacity(key)
    dead = {h for h in (current.holders if current else []) if not _holds(store, h)}

    def change(rec: CapacityRecord | None) -> CapacityRecord | None:
        rec = rec or CapacityRecord(key=key)
        if event_id in rec.holders:
            return None
        holders = [h for h in rec.holders if h not in dead]
        if len(holders) >= limit:
            raise _Full
        rec.holders = [*holders, event_id]
        return rec

    try:
        store.mutate_capacity(key, change)
    except _Full:
        return False
    return True


class _Full(Exception):
    pass


def _holds(store: Store, event_id: str) -> bool:
    record = store.get_event(event_id)
    return record is not None and not record.ended


def _give_back(store: Store, key: str, event_id: str) -> None:
    def change(rec: CapacityRecord | None) -> CapacityRecord | None:
        if rec is None or event_id not in rec.holders:
            return None
        rec.holders = [h for h in rec.holders if h != event_id]
        return rec

    store.mutate_capacity(key, change)


def holds_capacity(record: EventRecord) -> bool:
    """Whether the event may hold a slot: only an `approve` decision ever takes one (in
    ingest or the watchdog), so ending a held or drained event need not read the slots.
    A slot left behind anyway (a crash) is freed by `_take`, which drops ended holders."""
    return record.decision is not None and record.decision.action == "approve"


def release_capacity(store: Store, record: EventRecord) -> None:
    for key in capacity_keys(record):
        _give_back(store, key, record.event_id)


def decision_for(record: EventRecord) -> Decision | None:
    return record.decision
