"""A relay announced `relay_silent` reports again: `relay_recovered`, once per silence.

The claim is part of ingest's own conditional write of the VM row (functions.pipeline.ingest
moves the silence mark `silent_announced_for` into `recovery_pending`), so of all the
documents racing in, exactly one announces the end of a silence. This module publishes it
and clears the mark. A crash or a topic failure in between leaves the mark, and the
watchdog publishes it again after a while: the MessageId names the silence
(`<vm>:relay_recovered:<last seen before it>`), so Service Bus drops a second copy.

Channels: PagerDuty resolves `relay-silent:<vm>` (the incident `relay_silent` opened),
Teams posts a short follow-up, the webhook gets it like any transition.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from functions.model.event import Notification, Transition
from functions.pipeline.publish import Publisher
from functions.store import claims
from functions.store.records import VmRecord
from functions.store.state import Store

log = logging.getLogger(__name__)

# Its announcer publishes within this; after it the sweep publishes it again.
RECOVERY_LEASE = timedelta(minutes=3)


def silence_occurrence(last_seen: datetime) -> str:
    """What tells one silence of a VM from the next (relay_silent and relay_recovered)."""
    return last_seen.strftime("%Y%m%dT%H%M%S")


def claim_recovery(record: VmRecord, now: datetime) -> str | None:
    """Called in the VM row write of a document that was heard: move an announced silence
    to `recovery_pending` (the caller writes the row) and return its mark."""
    mark = record.silent_announced_for
    if mark is None:
        return None
    record.recovery_pending = mark
    record.recovery_claim = claims.pending(now, RECOVERY_LEASE)
    record.silent_announced_for = None
    record.silence_claim = ""
    return mark


def recovery_note(vm: str, mark: str, now: datetime) -> Notification:
    try:
        last_seen = datetime.fromisoformat(mark)
        minutes = max(0, int((now - last_seen).total_seconds() // 60))
        occurrence, how_long = silence_occurrence(last_seen), f"after {minutes} min of silence "
    except (ValueError, TypeError):  # not a mark the watchdog writes: still announce it
        occurrence, how_long = "".join(c for c in mark if c.isalnum())[:40] or "unknown", ""
    return Notification(
        transition=Transition.RELAY_RECOVERED,
        occurred_at=now,
        vm=vm,
        detail=f"relay on {vm} reporting again {how_long}(last seen before: {mark})",
        occurrence=occurrence,
        page=False,
    )


def announce_recovery(
    store: Store, publisher: Publisher, vm: str, mark: str, now: datetime
) -> None:
    """Publish the claimed recovery, then clear the claim (raises if the publish fails;
    the claim then stays for the watchdog). The VM's open-index listing says so first,
    and is dropped once the recovery is announced (functions.pipeline.watchdog)."""
    store.mark_recovering(vm)
    publisher.publish(recovery_note(vm, mark, now))

    def change(rec: VmRecord | None) -> VmRecord | None:
        if rec is None or rec.recovery_pending != mark:
            return None
        rec.recovery_pending = None  # done: the next silence starts afresh
        rec.recovery_claim = ""
        return rec

    _, cleared = store.mutate_vm(vm, change)
    if cleared:
        store.unmark_vm(vm)  # its open-index listing (functions.pipeline.watchdog)


def left_behind(record: VmRecord, now: datetime) -> str | None:
    """A recovery claimed long enough ago that its announcer must have failed."""
    if record.recovery_pending is None:
        return None
    if record.recovery_claim and not claims.is_free(record.recovery_claim, now):
        return None
    return record.recovery_pending
