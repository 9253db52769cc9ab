"""The bulk sync: every VM Resource Graph shows the app, paged into the identities table.

Without it each new VM costs Resource Graph queries on its first message: at the documented
quota (15 queries per 5 s per user) 100,000 new VMs take hours, and their first events wait
meanwhile. With it the fleet is read by the page, 1,000 VMs per query
(functions.identity.facts.vm_query on `resources`, then on `computeresources`), and a VM's
first message finds its facts stored (registry.CachedResolver stores its key beside them
without a query); lookups on demand remain only for vmIds the sync has not seen yet.

The timer (function_app `identity_sync`, every 5 minutes) calls `sync_identities`, which:

- starts a pass when the last one finished RESOURCE_GRAPH_SYNC_HOURS ago (the rows' facts
  are then never older than that, below VM_FACTS_MAX_AGE_SECONDS), else does nothing (one
  Table read);
- pages with `$skipToken`, and sleeps when `x-ms-user-quota-remaining` reaches 0 until
  `x-ms-user-quota-resets-after` (or Retry-After on a 429), within its time budget; when
  the budget runs out it stores the cursor (table, skip token, the rows of a VM a page cut
  in two) and the next run resumes there;
- writes each page as entity group transactions (up to 100 rows of one partition each)
  that MERGE only the facts columns (`data`, `name`, `fetched_at`): a VM's callback keys,
  stored by admission, are never touched;
- on a 4xx other than 429 (a configuration error: functions.identity.resource_graph)
  stops, keeps the cursor and raises ResourceGraphRefused for the handler to announce
  (functions.identity.graph_state);
- with disruption budgets in the policy (functions.model.budgets), also writes where
  Azure places each VM (its tags, zone, sets, subscription) as a placement row by name
  (functions.store.placements), and counts each budget group's VMs as it goes; the counts
  ride in the cursor row (so they advance with it, atomically) and become the groups' size
  rows when the pass ends, which then deletes the placements it did not refresh (VMs
  Azure no longer lists). A change to the budgets' groups starts a pass at once (from the
  top, counting afresh): until it ends, a new group's size is unknown, and a percentage
  budget allows 1 VM there.

Cost for 100,000 VMs (measured by `make bench`, tests/bench/enrol_bench.py): 100 queries
and about 1,600 batch requests a pass (a page of 1,000 VMs spreads over 8 partitions of
about 125 rows, two transactions each), plus one cursor read and write a run. With a pass
every 3 hours: 800 queries and about 13,000 Table requests a day, 0.13 per VM-day. With
budgets, the placement rows double the batches (about 3,200 a pass), plus the size rows
(a transaction per 100 groups) and the sweep (a query per placement partition).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import datetime, timedelta
from typing import Any

from azure.core.exceptions import (
    ResourceNotFoundError,
    ServiceRequestError,
    ServiceResponseError,
)
from azure.data.tables import TableClient, UpdateMode
from pydantic import BaseModel, Field

from functions.identity.facts import (
    TABLES,
    FactsUnavailable,
    UnknownVm,
    VmFacts,
    facts_from_rows,
    placement_of,
    rows_by_vm,
    vm_query,
)
from functions.identity.registry import BUCKETS, partition_of
from functions.identity.resource_graph import (
    PAGE_ROWS,
    Page,
    ResourceGraph,
    ResourceGraphRefused,
)
from functions.model.budgets import Budget, budgets_fingerprint, counted_in
from functions.store.placements import Placements
from functions.store.rows import CHUNK_CHARS

log = logging.getLogger(__name__)

CURSOR_PARTITION, CURSOR_ROW = "sync", "cursor"
BATCH = 100  # an entity group transaction's limit
WRITE_ATTEMPTS = 3
CARRY_LIMIT = 30000  # characters of held-back rows stored in the cursor row
DEFAULT_WAIT = 5.0  # a transient failure without Retry-After: one quota window
MAX_GROUPS = 5000  # budget groups counted in one pass (their counts ride in the cursor row)
TALLY_CHUNKS = 12  # the counts' JSON at most this many 30,000-unit columns (the row < 1 MiB)


class Cursor(BaseModel):
    """Where a pass is: which table, the skip token, the held-back rows of the VM a page
    boundary cut in two; when the pass started and when the last one finished."""

    table: int = 0
    skip_token: str | None = None
    carry: list[dict[str, Any]] = Field(default_factory=list)
    pass_started: datetime | None = None
    last_pass: datetime | None = None
    etag: str | None = None
    # Disruption budgets: the fingerprint of the groups this pass counts (None: no
    # budgets), the counts so far (budget -> group -> VMs) and the groups past MAX_GROUPS.
    budgets: str | None = None
    tally: dict[str, dict[str, int]] = Field(default_factory=dict)
    tally_dropped: int = 0
    # The last pass wrote placements and sizes, and budgets are gone since: this pass's
    # end deletes them.
    clean_up: bool = False

    def count(self, pairs: list[tuple[str, str]]) -> None:
        for budget, group in pairs:
            groups = self.tally.setdefault(budget, {})
            if group in groups:
                groups[group] += 1
            elif sum(len(g) for g in self.tally.values()) < MAX_GROUPS:
                groups[group] = 1
            else:
                self.tally_dropped += 1


class SyncReport(BaseModel):
    """One run, for the log line and the bench."""

    due: bool = True
    finished_pass: bool = False
    queries: int = 0
    pages: int = 0
    vms_written: int = 0
    unusable: int = 0  # rows facts_from_rows refused (e.g. two resources with one vmId)
    placements_written: int = 0  # placement rows (with budgets only)
    groups_sized: int = 0  # budget groups whose size the finished pass wrote
    groups_dropped: int = 0  # VMs not counted: their group was past MAX_GROUPS
    placements_swept: int | None = None  # rows deleted at the pass's end (None: no sweep)
    table_requests: int = 0
    quota_waits: int = 0
    waited_seconds: float = 0.0
    error: str | None = None


class _Budget:
    def __init__(self, seconds: float, monotonic: Callable[[], float]) -> None:
        self.monotonic = monotonic
        self.deadline = monotonic() + seconds

    def allows(self, wait: float) -> bool:
        return self.monotonic() + wait < self.deadline


def load_cursor(table: TableClient) -> Cursor:
    try:
        row = table.get_entity(CURSOR_PARTITION, CURSOR_ROW)
    except ResourceNotFoundError:
        return Cursor()
    data = json.loads(row.get("cursor") or "{}")
    tally = "".join(row.get(f"tally{n}") or "" for n in range(TALLY_CHUNKS))
    if tally:
        data["tally"] = json.loads(tally)
    return Cursor.model_validate({**data, "etag": row.metadata.get("etag")})


def save_cursor(table: TableClient, cursor: Cursor) -> None:
    """Unconditional: the timer runs as a singleton (one instance holds its lease). The
    budget counts go in columns of their own, in the same row, so they move with the
    cursor: a run that dies before this write leaves both where they were."""
    text = cursor.model_dump_json(exclude={"etag", "tally"})
    if len(text) > 60000:  # never: the carry is bounded; a pass restarts rather than fail
        text = cursor.model_copy(update={"skip_token": None, "carry": []}).model_dump_json(
            exclude={"etag", "tally"}
        )
    entity = {"PartitionKey": CURSOR_PARTITION, "RowKey": CURSOR_ROW, "cursor": text}
    tally = json.dumps(cursor.tally, separators=(",", ":"), sort_keys=True)
    if not tally.isascii():  # tag values: UTF-16 units are what a column holds
        tally = json.dumps(cursor.tally, separators=(",", ":"), sort_keys=True, ensure_ascii=True)
    for n in range(TALLY_CHUNKS):
        part = tally[n * CHUNK_CHARS : (n + 1) * CHUNK_CHARS]
        if part:
            entity[f"tally{n}"] = part
    table.upsert_entity(entity, mode=UpdateMode.REPLACE)


def write_facts(
    table: TableClient,
    rows: list[dict[str, Any]],
    now: datetime,
    report: SyncReport,
    pool: ThreadPoolExecutor | None = None,
) -> list[VmFacts]:
    """Merge the facts of every VM in `rows` into its identity row, 100 per transaction;
    the partitions in parallel when a `pool` is given (each is its own Table partition).
    Returns the facts written."""
    by_partition: dict[str, list[dict[str, Any]]] = {}
    written: list[VmFacts] = []
    grouped = rows_by_vm(rows)
    unnamed = len(rows) - sum(len(mine) for mine in grouped.values())
    if unnamed:  # a VM row without a usable vmId: counted and logged, never silently lost
        report.unusable += unnamed
        log.warning("identity sync: %d row(s) without a usable vmId left out", unnamed)
    for vm_id, mine in grouped.items():
        try:
            facts = facts_from_rows(vm_id, mine, now)
        except (FactsUnavailable, UnknownVm) as exc:
            report.unusable += 1
            log.warning("identity sync: vmId %s left out: %s", vm_id, exc)
            continue
        written.append(facts)
        entity = {
            "PartitionKey": partition_of(vm_id),
            "RowKey": vm_id,
            "data": facts.model_dump_json(),
            "name": facts.name.casefold(),
            "fetched_at": facts.fetched_at,
        }
        by_partition.setdefault(partition_of(vm_id), []).append(entity)

    def write(entities: list[dict[str, Any]]) -> tuple[int, int]:
        made = 0
        for start in range(0, len(entities), BATCH):
            operations = [
                ("upsert", e, {"mode": UpdateMode.MERGE}) for e in entities[start : start + BATCH]
            ]
            for attempt in range(WRITE_ATTEMPTS):
                made += 1
                try:
                    table.submit_transaction(operations)
                    break
                except (ServiceRequestError, ServiceResponseError):
                    # A dropped connection: the transaction merges the same facts again,
                    # so sending it again is safe. Anything else fails the run (the cursor
                    # stays before this page; the next run writes it again).
                    if attempt + 1 == WRITE_ATTEMPTS:
                        raise
                    time.sleep(0.2 * (attempt + 1))
        return made, len(entities)

    parts = list(by_partition.values())
    results = list(pool.map(write, parts)) if pool is not None else [write(p) for p in parts]
    for made, count in results:
        report.table_requests += made
        report.vms_written += count
    return written


def _split(rows: list[dict[str, Any]], more: bool) -> tuple[list[dict[str, Any]], list[dict]]:
    """(rows to write now, rows to hold back): while pages remain, the last VM's rows wait
    for the next page, which may hold its other NICs (rows come ordered by id)."""
    if not more or not rows:
        return rows, []
    last = str(rows[-1].get("id", "")).casefold()
    ready = [r for r in rows if str(r.get("id", "")).casefold() != last]
    carry = [r for r in rows if str(r.get("id", "")).casefold() == last]
    if len(json.dumps(carry, default=str)) > CARRY_LIMIT:
        return rows, []
    return ready, carry


def sync_identities(
    graph: ResourceGraph,
    table: TableClient,
    now: Callable[[], datetime],
    *,
    every: timedelta,
    budget_seconds: float,
    sleep: Callable[[float], None] = time.sleep,
    monotonic: Callable[[], float] = time.monotonic,
    page_rows: int = PAGE_ROWS,
    budgets: tuple[Budget, ...] = (),
) -> SyncReport:
    """Run (or continue) a pass within `budget_seconds`; see the module docstring.
    `budgets`: the policy's disruption budgets (placements and group sizes are written
    only with some). Raises ResourceGraphRefused (a configuration error) after saving the
    cursor."""
    report = SyncReport()
    cursor = load_cursor(table)
    report.table_requests += 1
    started = now()
    wanted = budgets_fingerprint(budgets) if budgets else None
    placements = Placements(table)
    if cursor.pass_started is None:
        regrouped = wanted is not None and cursor.budgets != wanted
        if not regrouped and cursor.last_pass is not None and started - cursor.last_pass < every:
            report.due = False
            return report
        gone = cursor.budgets is not None and wanted is None
        cursor = Cursor(
            pass_started=started, last_pass=cursor.last_pass, budgets=wanted, clean_up=gone
        )
    elif cursor.budgets != wanted:
        # The budgets' groups changed in the middle of a pass: the counts so far are of
        # other groups. Start again from the top, counting afresh.
        log.warning("identity sync: the budgets' groups changed; the pass starts again")
        cursor = Cursor(pass_started=started, last_pass=cursor.last_pass, budgets=wanted)
    budget = _Budget(budget_seconds, monotonic)
    queries_before = graph.requests
    retried_token = False

    def fetch(table_index: int, token: str | None, wait: float) -> Page:
        if wait:
            sleep(wait)  # the quota is spent: its window resets first
        return graph.query(vm_query(TABLES[table_index]), token, top=page_rows)

    # The next page is asked for while this one is written (Resource Graph's latency hides
    # behind the Table writes), and a page's partitions are written in parallel.
    pager = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sync-page")
    writers = ThreadPoolExecutor(max_workers=BUCKETS, thread_name_prefix="sync-write")
    pending: Future[Page] | None = None
    try:
        while budget.allows(0):
            try:
                if pending is None:
                    page = fetch(cursor.table, cursor.skip_token, 0.0)
                else:
                    page = pending.result()
            except ResourceGraphRefused:
                pending = None
                if cursor.skip_token and not retried_token:
                    # A skip token kept across runs may have expired: this table again.
                    log.warning("identity sync: skip token refused; restarting the table")
                    cursor.skip_token, cursor.carry, retried_token = None, [], True
                    continue
                raise
            except FactsUnavailable as exc:
                pending = None
                wait = exc.retry_after if exc.retry_after is not None else DEFAULT_WAIT
                if not budget.allows(wait):
                    report.error = str(exc)
                    break
                report.quota_waits += 1
                report.waited_seconds += wait
                sleep(wait)
                continue
            pending = None
            report.pages += 1
            more = page.skip_token
            ready, carry = _split(cursor.carry + page.rows, more is not None)
            next_table, next_token = (cursor.table, more) if more else (cursor.table + 1, None)
            finished = next_table == len(TABLES)
            if not finished:
                wait = 0.0
                if page.quota_remaining == 0:
                    wait = page.quota_resets_after or DEFAULT_WAIT
                if budget.allows(wait):
                    if wait:
                        report.quota_waits += 1
                        report.waited_seconds += wait
                    pending = pager.submit(fetch, next_table, next_token, wait)
            written = write_facts(table, ready, now(), report, writers)
            if budgets:
                placed = [placement_of(facts) for facts in written]
                report.table_requests += placements.put(placed, writers)
                report.placements_written += len(placed)
                for placement in placed:
                    cursor.count(counted_in(budgets, placement))
            cursor.table, cursor.skip_token, cursor.carry = next_table, next_token, carry
            if finished:
                _finish(placements, cursor, now(), report)
                cursor = Cursor(last_pass=cursor.pass_started, budgets=wanted)
                report.finished_pass = True
                break
            if pending is None:
                break  # the quota's wait would outlast the budget: the next run goes on
    finally:
        pager.shutdown(wait=True, cancel_futures=True)
        writers.shutdown(wait=True)
        report.queries = graph.requests - queries_before
        save_cursor(table, cursor)
        report.table_requests += 1
    return report


def _finish(placements: Placements, cursor: Cursor, now: datetime, report: SyncReport) -> None:
    """The pass's end: the groups' sizes as counted, and the placements it did not
    refresh (VMs Azure no longer lists, or every one once budgets are gone) deleted."""
    if cursor.budgets is None and not cursor.clean_up:
        return  # no budgets, now or in the pass before: nothing of theirs to keep up
    report.table_requests += placements.write_sizes(cursor.tally, now)
    report.groups_sized = sum(len(groups) for groups in cursor.tally.values())
    report.groups_dropped = cursor.tally_dropped
    if cursor.tally_dropped:
        log.warning(
            "identity sync: %d VM(s) in budget groups past %d left uncounted: those groups "
            "have no size (a percentage budget allows 1 VM there)",
            cursor.tally_dropped,
            MAX_GROUPS,
        )
    assert cursor.pass_started is not None
    requests, swept = placements.sweep(cursor.pass_started)
    report.table_requests += requests
    report.placements_swept = swept
