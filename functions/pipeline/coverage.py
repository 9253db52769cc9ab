"""Fleet coverage (issue 44 item 4): which VMs in scope have a relay, which relays went
silent, which relay versions and contracts run where, and which drain each VM really has.

The fleet page and `/api/status` read one summary row (events table, PartitionKey
`%coverage`, RowKey `summary`): one point read per page view, whatever the fleet. The row is
written by a pass (`run_coverage`) on the identity sync's timer, at most once per
COVERAGE_EVERY:

- it lists the identities table (the VMs Resource Graph shows the app, functions.identity.
  sync, and those enrolled on demand), 1,000 rows a request: every row is a VM in scope; one
  without a callback key has never had an attested message from a relay ("no relay heard");
- it lists the liveness table, 1,000 rows a request, and believes a row only as the watchdog
  does (functions.store.liveness.vouch: shape, the VM's key made its RowKey and signature),
  with the keys from the first listing, so no per-VM request is made;
- per enrolled VM, its latest believed heartbeat gives its relay version, its contract (and
  whether this app accepts it, ACCEPTED_CONTRACTS), whether it is silent
  (RELAY_SILENT_AFTER_SECONDS), and its drain (functions.model.drains.drain_for).

Cost at 100,000 VMs: about 100 identities pages + 100 liveness pages + 1 write per pass
(about 200 Table requests; at one pass per 10 minutes about 29,000 a day, 0.3 per VM-day),
and a page view 1 point read. Memory: each enrolled VM's name and keys for the pass (tens of
MB at 100,000 VMs). The counts are as of the pass (`generated_at`), minutes old at worst.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any

from azure.core.exceptions import ResourceNotFoundError
from pydantic import BaseModel, Field, ValidationError

from functions.model.drains import DRAIN_KINDS, RelayFacts, drain_for
from functions.pipeline.context import Pipeline
from functions.store.keys import reserved
from functions.store.liveness import (
    ACCEPTED_CONTRACTS,
    BadHint,
    Entry,
    LivenessHint,
    UnknownContract,
    check_row,
    row_vm_id,
    vouch,
)
from functions.terminate.settings import DrainSettings

log = logging.getLogger(__name__)

PARTITION, ROW = reserved("coverage"), "summary"
COVERAGE_EVERY = timedelta(minutes=10)
PAGE = 1000
MAX_NAMED = 20  # VMs named per list (all are counted)


class Coverage(BaseModel):
    """The summary row's content (what `/api/status` returns as `coverage`)."""

    generated_at: datetime
    in_scope: int = 0  # identities rows: VMs the app knows of (Resource Graph or enrolled)
    no_relay: int = 0  # in scope, never an attested message from a relay
    no_relay_vms: list[str] = Field(default_factory=list)
    enrolled: int = 0  # a relay of theirs has enrolled (a callback key)
    heartbeat_rows: int = 0  # enrolled VMs with a believed liveness row
    silent: int = 0  # of those, not heard for RELAY_SILENT_AFTER_SECONDS
    silent_vms: list[str] = Field(default_factory=list)
    versions: dict[str, int] = Field(default_factory=dict)  # relay version -> VMs
    contracts: dict[str, int] = Field(default_factory=dict)  # contract -> VMs
    not_accepted: int = 0  # VMs whose relay speaks a contract this app does not accept
    not_accepted_vms: list[str] = Field(default_factory=list)
    accepted_contracts: list[int] = Field(default_factory=list)
    drains: dict[str, int] = Field(default_factory=dict)  # drain kind -> enrolled VMs
    no_drain_vms: list[str] = Field(default_factory=list)
    drain_error: str = ""  # DRAIN__* invalid: drains not counted
    unbelieved_rows: int = 0  # liveness rows not believed (junk; the watchdog deletes them)
    requests: int = 0  # Table requests the pass made


def read_coverage(table: Any) -> Coverage | None:
    """The last pass's summary (one point read); None before the first pass."""
    try:
        row: Any = table.get_entity(PARTITION, ROW)
    except ResourceNotFoundError:
        return None
    try:
        return Coverage.model_validate_json(row.get("data") or "")
    except ValidationError:
        log.warning("coverage: the summary row is not readable; the next pass rewrites it")
        return None


def due(table: Any, now: datetime) -> bool:
    """Whether a pass is due (one point read): none yet, the last one COVERAGE_EVERY ago,
    or dated ahead of this host's clock."""
    last = read_coverage(table)
    if last is None:
        return True
    age = now - last.generated_at
    return age >= COVERAGE_EVERY or age < timedelta(0)


def run_coverage(
    pipeline: Pipeline, *, force: bool = False, drain: DrainSettings | None = None
) -> Coverage | None:
    """One pass, if due (or `force`), written to the summary row; None when not due or the
    app has no identities table (no admission). `drain`: the drain workflow's settings
    where they are not the process's DRAIN__* (the local stack's)."""
    admission = pipeline.admission
    if admission is None:
        return None
    events = pipeline.store.events
    now = pipeline.clock.now()
    if not force and not due(events, now):
        return None
    registry = admission.registry
    out = Coverage(generated_at=now, accepted_contracts=sorted(ACCEPTED_CONTRACTS))
    entries: dict[str, Entry] = {}
    no_relay: list[str] = []
    for page in _pages(
        # Only the identity rows (id00..id07): the same table holds the budgets'
        # placement and group-size rows, which are not VMs.
        registry.table.query_entities(
            "PartitionKey ge @low and PartitionKey lt @high",
            parameters={"low": "id", "high": "ie"},
            select=["PartitionKey", "RowKey", "data", "keys"],
            results_per_page=PAGE,
        ),
        out,
    ):
        for row in page:
            out.in_scope += 1
            try:
                identity = registry._load(row)  # the row as IdentityStore.get reads it
            except (ValueError, KeyError):
                continue
            if identity.keys:
                entries[str(row["RowKey"])] = (
                    identity.facts.name,
                    tuple(k.secret for k in identity.keys),
                )
            else:
                no_relay.append(identity.facts.name)
    out.enrolled = len(entries)
    out.no_relay = len(no_relay)
    out.no_relay_vms = sorted(no_relay, key=str.casefold)[:MAX_NAMED]
    refused: dict[str, tuple[str, str]] = {}
    hints = _believed(pipeline, entries, out, refused)
    _tally(pipeline, entries, hints, now, out, drain)
    _refused(refused, hints, out)
    events.upsert_entity({"PartitionKey": PARTITION, "RowKey": ROW, "data": out.model_dump_json()})
    out.requests += 1
    return out


def _pages(listing: Any, out: Coverage) -> Iterable[list[Any]]:
    for page in listing.by_page():
        out.requests += 1
        yield list(page)


def _believed(
    pipeline: Pipeline,
    entries: Mapping[str, Entry],
    out: Coverage,
    refused: dict[str, tuple[str, str]],
) -> dict[str, LivenessHint]:
    """Each enrolled VM's latest believed heartbeat (current key's row first); rows of a
    contract this app does not read go to `refused` (vm_id -> (name, contract))."""
    hints: dict[str, LivenessHint] = {}
    listing = pipeline.store.liveness.table.list_entities(results_per_page=PAGE)
    for page in _pages(listing, out):
        for row in page:
            vm_id = str(row_vm_id(row))
            try:
                check_row(row)
                hint = vouch(row, entries.get(vm_id))
            except UnknownContract:
                # A relay newer than this app: its row cannot be checked, so it is named
                # only as the enrolled VM it claims to be, and counted once per VM.
                entry = entries.get(vm_id)
                if entry is not None:
                    refused[vm_id] = (entry[0], str(row.get("contract")))
                out.unbelieved_rows += 1
                continue
            except BadHint:
                out.unbelieved_rows += 1
                continue
            known = hints.get(vm_id)
            if known is None or (hint.current, hint.seen) > (known.current, known.seen):
                hints[vm_id] = hint
    return hints


def _tally(
    pipeline: Pipeline,
    entries: Mapping[str, Entry],
    hints: Mapping[str, LivenessHint],
    now: datetime,
    out: Coverage,
    drain: DrainSettings | None = None,
) -> None:
    silent_after = timedelta(seconds=pipeline.settings.relay_silent_after_seconds)
    if drain is None:
        try:
            drain = DrainSettings()
        except ValidationError as exc:
            out.drain_error = (
                f"DRAIN__* invalid ({exc.error_count()} error(s)): see `settings check`"
            )
    versions: Counter[str] = Counter()
    contracts: Counter[str] = Counter()
    kinds: Counter[str] = Counter(dict.fromkeys(DRAIN_KINDS, 0))
    silent: list[str] = []
    no_drain: list[str] = []
    for vm_id, (name, _) in entries.items():
        hint = hints.get(vm_id)
        if hint is not None:
            versions[hint.relay_version or "unknown"] += 1
            contracts[str(hint.contract)] += 1
            if now - hint.seen > silent_after:
                silent.append(name)
        if drain is not None:
            kind = drain_for(RelayFacts.of(hint), drain, now).kind
            kinds[kind] += 1
            if kind == "none":
                no_drain.append(name)
    out.heartbeat_rows = len(hints)
    out.silent, out.silent_vms = len(silent), sorted(silent, key=str.casefold)[:MAX_NAMED]
    out.versions = dict(sorted(versions.items()))
    out.contracts = dict(sorted(contracts.items()))
    out.drains = dict(kinds) if drain is not None else {}
    out.no_drain_vms = sorted(no_drain, key=str.casefold)[:MAX_NAMED]


def _refused(
    refused: Mapping[str, tuple[str, str]], hints: Mapping[str, LivenessHint], out: Coverage
) -> None:
    """VMs whose relay writes a contract this app does not read (and no row it does)."""
    names = [name for vm_id, (name, _) in refused.items() if vm_id not in hints]
    for vm_id, (_, contract) in refused.items():
        if vm_id not in hints:
            out.contracts[contract] = out.contracts.get(contract, 0) + 1
    out.not_accepted = len(names)
    out.not_accepted_vms = sorted(names, key=str.casefold)[:MAX_NAMED]


def coverage_state(pipeline: Pipeline) -> dict[str, Any] | None:
    """What `/api/status` returns as `coverage` (one point read); None before a pass."""
    found = read_coverage(pipeline.store.events)
    return None if found is None else json.loads(found.model_dump_json())
