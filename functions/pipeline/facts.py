"""What the decider reads beside an event row (functions.pipeline.due.Facts): the event's
reporter rows (each VM's own status, view and when its relay saw it) and, once it is past
its start, whether every VM that still lists it went silent. Read by `reconcile_key`
(functions.pipeline.reconcile) alone, so every entry point decides from the same rows.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from functions.model.envelope import STARTED
from functions.pipeline.context import Pipeline
from functions.pipeline.due import Facts
from functions.store.records import EventRecord
from functions.store.reporters import Reporter

# Reporters whose VM rows a reconcile reads to tell whether all went silent: an event with
# more is ended by their documents (or Azure), never by reading a thousand rows.
MAX_SILENCE_READS = 100


def load_facts(
    pipeline: Pipeline, record: EventRecord, now: datetime, rows: list[Reporter] | None = None
) -> tuple[Facts, list[Reporter] | None]:
    """What the decider reads beside an open event's row: its reporter rows (one partition
    query: who still lists it, each one's own status, view and when its relay saw it; the
    approver uses the same rows) and, once it is past its start, whether every VM that
    still lists it went silent (their VM rows, up to MAX_SILENCE_READS, stopping at the
    first that was heard). The rows are None for an ended event (nothing read). `rows`:
    the reporter rows as the caller read them with the event row (one query for both:
    Store.event_and_reporters), not queried again."""
    if record.ended:
        return Facts(), None
    if rows is None:
        rows = pipeline.store.reporter_rows(record.event_id)
    current = {r.vm: r for r in rows if r.status}
    record.reporters = {vm: r.status for vm, r in current.items()}
    record.past_reporters = [r.vm for r in rows]
    reporting = bool(current)
    past = record.started or (record.not_before is not None and now >= record.not_before)
    silent: bool | None = None
    if past and reporting:
        silent = all_silent(pipeline, list(current), now)
    said_started = [r.seen or now for r in current.values() if r.status == STARTED]
    gone = [r.seen for r in rows if not r.status and r.seen is not None]
    known = {r.vm.casefold() for r in rows}
    facts = Facts(
        unreported=any(vm.casefold() not in known for vm in record.resources),
        reporting=reporting,
        reported=bool(rows),
        silent=silent,
        left_at=max(gone) if gone and not reporting else None,
        started_seen=min(said_started) if said_started else None,
        scheduled=any(r.status != STARTED for r in current.values()),
    )
    return facts, rows


def all_silent(pipeline: Pipeline, names: list[str], now: datetime) -> bool:
    """Every one of these VMs' relays was last heard (a message, a Service Bus heartbeat,
    its verified liveness row) longer than RELAY_SILENT_AFTER_SECONDS ago; False at the
    first that was heard since, or past MAX_SILENCE_READS VMs."""
    if not names or len(names) > MAX_SILENCE_READS:
        return False
    quiet = timedelta(seconds=pipeline.settings.relay_silent_after_seconds)
    verify = pipeline.liveness_verifier
    for name in names:
        vm = pipeline.store.get_vm(name)
        if vm is None:
            continue  # its row is gone (forgotten): nothing will be heard from it
        # Its last message, or its verified liveness hint if later.
        heard = pipeline.store.liveness.last_heard(
            vm.vm_id, vm.last_seen, verify, silent_after=quiet, now=pipeline.clock.now()
        )
        if heard is not None and now - heard <= quiet:
            return False
    return True
