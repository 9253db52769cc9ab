"""Flagging a VM whose relay said "approved" to an event Azure never started (issue 37): a
relay that says "approved" to events its VM made up would otherwise take its set's slot
again and again, a new EventId each lapse.

The decider (functions.pipeline.reconcile) flags it when the event's `overdue`
announcement is published (Transition.OVERDUE), just before it: a crash in between leaves
the announcement's claim, whose next publish flags again (the flag is idempotent). The
approver reads the flag (functions.pipeline.relay_phase.suspect) and does not ask that
VM's relay again for UNSTARTED_FOR. It lives here, with its rule (`flags_unstarted`), and
not among the slots (functions.pipeline.capacity), since it reads and writes no slot row:
publishing the announcement no longer steps back into the slots' module (issue 46).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from functions.identity.facts import normalise_vm_id
from functions.model.envelope import PREEMPT, SCHEDULED, TERMINATE
from functions.store.records import EventRecord, VmRecord

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


def flag_unstarted(pipeline: Any, record: EventRecord, now: datetime) -> None:
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
    admission = getattr(pipeline, "admission", None)
    if flagged is None or not flagged.vm_id or admission is None:
        return

    def flag(identity: Any) -> Any:
        if identity is None or identity.unstarted == record.event_id:
            return None
        return identity.model_copy(update={"unstarted": record.event_id, "unstarted_at": now})

    admission.registry.mutate(normalise_vm_id(flagged.vm_id), flag)
