"""Reporter rows: one per VM that reported an event, in the event's partition
(RowKey `r|<vm>`), written by that VM's documents alone. Each keeps the VM's own view of
the event (functions.pipeline.decide), its last status, when its relay saw it, and its
relay's measurements (the impact ledger): what a VM says decides only for that VM, so its
words live here, never merged into the event row (docs/lifecycle.md).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from azure.core.exceptions import ResourceExistsError, ResourceNotFoundError
from azure.data.tables import TableClient, UpdateMode
from pydantic import ValidationError

from functions.model.envelope import LedgerEntry, summarize
from functions.model.event import Decision
from functions.model.view import VmView
from functions.store.http import NO_ECHO
from functions.store.keys import row_key
from functions.store.liveness import Skipped
from functions.store.records import EventRecord
from functions.store.rows import Rows, _chunks, _unchunk, _why

log = logging.getLogger(__name__)

REPORTER = "r|"  # in an event's partition: one row per reporting VM, "r|<vm key>"
# Reporter row columns of the impact ledger (LedgerEntry JSON, functions/ledger.py): what
# the VM's relay measured up to the document showing the event Started, and to the one
# without it (two columns, so the later write needs no read of the earlier).
LEDGER, LEDGER_LEFT = "ledger", "ledger_left"
SEEN = "seen"  # when the VM's relay saw what its status says (its clock, bounded by ours)
VM_ID = "vm_id"  # the reporting VM's attested vmId


@dataclass(frozen=True)
class Reporter:
    """One reporter row as read: who, its last status ("" = no longer reports it), its
    view of the event (None for rows written before views were kept, or unreadable) and,
    for a view the event row could not keep, the decision made on it."""

    vm: str
    status: str
    view: VmView | None
    key: str
    decision: Decision | None
    # What this VM's relay measured of the event (the impact ledger), if it sent any.
    ledger: LedgerEntry | None = None
    # Why the measurements this row holds cannot be read ("" when they can, or it has none).
    ledger_unreadable: str = ""
    # When its relay saw what `status` says (its `seen`; else when the row was written).
    seen: datetime | None = None
    # The VM's vmId as admission attested it when its document wrote the row ("" for rows
    # of before issue 47): the approver finds its identity (Azure's address, its keys)
    # from here, without reading the VM row, while the row is fresh.
    vm_id: str = ""

    @classmethod
    def from_row(cls, row: Any, skipped: list[Skipped] | None = None) -> Reporter | None:
        """The row as read; None (logged, and added to `skipped`) for one naming no VM."""
        vm, status = row.get("vm"), row.get("status")
        if not isinstance(vm, str) or not isinstance(status, str | None):
            _skip(row, "no VM name or status", skipped)
            return None
        view: VmView | None = None
        decision: Decision | None = None
        try:
            text = _unchunk({"data" + k[4:]: v for k, v in row.items() if k.startswith("view")})
            if isinstance(text, str):
                view = VmView.model_validate_json(text)
            if isinstance(row.get("decision"), str):
                decision = Decision.model_validate_json(row["decision"])
        except (ValueError, TypeError):
            log.warning("events: unreadable view in reporter row %.100r", row.get("RowKey"))
            view, decision = None, None
        key = row.get("key") if isinstance(row.get("key"), str) else ""
        entry, why = read_ledger(row, skipped)
        at = row.get(SEEN) if isinstance(row.get(SEEN), datetime) else row.get("at")
        seen = at if isinstance(at, datetime) else None
        vm_id = row.get(VM_ID) if isinstance(row.get(VM_ID), str) else ""
        return cls(vm, status or "", view, key, decision, entry, why, seen, vm_id[:64])


def _skip(row: Any, why: str, skipped: list[Skipped] | None) -> Skipped:
    """Log a row (or a column of one) that cannot be read, and add it to `skipped`: the
    pages and exports that read it count and name it instead of failing on it."""
    what = Skipped(
        "events",
        str(row.get("PartitionKey", "?"))[:80],
        str(row.get("RowKey", "?"))[:80],
        why[:300],
    )
    log.warning("events: skipped %s", what)
    if skipped is not None:
        skipped.append(what)
    return what


def read_ledger(row: Any, skipped: list[Skipped] | None = None) -> tuple[LedgerEntry | None, str]:
    """A reporter row's impact ledger, its two parts as one, and "" ; (None, why) for
    measurements that cannot be read (out of bounds, written before the bounds, or made
    up), logged and added to `skipped`; (None, "") when it has none."""
    from functions.ledger import combined

    parts = []
    try:
        for column in (LEDGER, LEDGER_LEFT):
            text = row.get(column)
            if isinstance(text, str):
                parts.append(LedgerEntry.model_validate_json(text))
        return combined(parts), ""
    except ValidationError as exc:
        why = f"measurements unreadable: {summarize(exc)}"
        _skip(row, why, skipped)
        return None, why
    except ValueError as exc:  # not JSON
        why = f"measurements unreadable: {_why(exc)}"
        _skip(row, why, skipped)
        return None, why


class ReporterRows(Rows):
    """Reads and writes of the reporter rows."""

    events: TableClient

    def load_reporters(
        self, record: EventRecord, *, ledger: bool = False, skipped: list[Skipped] | None = None
    ) -> EventRecord:
        """Fill `reporters` (VM -> status, those still reporting it) and `past_reporters`
        (every VM that ever did) from the event's reporter rows: one partition query.
        `ledger=True` also fills `record.ledger` (VM -> its relay's measurements, or in
        `record.ledger_unreadable` why they cannot be read) from the same query. Rows that
        cannot be read are logged, skipped and added to `skipped`."""
        rows = self.events.query_entities(
            "PartitionKey eq @pk and RowKey gt @lo and RowKey lt @hi",
            parameters={"pk": row_key(record.event_id), "lo": REPORTER, "hi": "r}"},
            select=["PartitionKey", "RowKey", "vm", "status", "at", SEEN]
            + ([LEDGER, LEDGER_LEFT] if ledger else []),
        )
        present: dict[str, str] = {}
        everyone: list[str] = []
        seen: dict[str, datetime] = {}
        for row in rows:
            vm, status = row.get("vm"), row.get("status")
            if not isinstance(vm, str) or not isinstance(status, str | None):
                _skip(row, "no VM name or status", skipped)
                continue
            everyone.append(vm)
            if status:
                present[vm] = status
            at = row.get(SEEN) if isinstance(row.get(SEEN), datetime) else row.get("at")
            if isinstance(at, datetime):
                seen[vm] = at
            if ledger:
                entry, why = read_ledger(row, skipped)
                if entry is not None:
                    record.ledger[vm] = entry
                elif why:
                    record.ledger_unreadable[vm] = why
        record.reporters = present
        record.past_reporters = everyone
        record.reporter_seen = seen
        return record

    def set_reporter(
        self,
        event_id: str,
        vm: str,
        status: str,
        at: datetime,
        *,
        view: VmView | None = None,
        key: str = "",
        decision: Decision | None = None,
        first: bool = False,
        ledger: LedgerEntry | None = None,
        seen: datetime | None = None,
        vm_id: str = "",
    ) -> bool:
        """This VM's own row in the event's partition: status "" = it no longer reports it.
        Only that VM's documents write it (one session each), so a blind upsert is safe.
        With `view` (this VM's view of the event and its key, functions.pipeline.decide)
        the row is replaced whole; without, only the status changes and the view stays.
        `decision` is kept only for a view the event row could not keep (MAX_VIEWS).
        `first`: the VM's row says it does not list the event: the row is inserted, which
        tells at no extra request whether it ever reported it (an end the other reporters
        made reopens only for a VM that never did). Returns False when `first` found a row.
        `seen`: when its relay saw what `status` says (the decider's time of a start or an
        end it derives from the reporters: functions.pipeline.due). `vm_id`: the VM's
        attested vmId (where the approver finds its relay: `Reporter.vm_id`).
        """
        entity: dict[str, Any] = {
            "PartitionKey": row_key(event_id),
            "RowKey": REPORTER + row_key(vm),
            "vm": vm,
            "status": status,
            "at": at,
        }
        if seen is not None:
            entity[SEEN] = seen
        if vm_id:
            entity[VM_ID] = vm_id
        if view is not None:
            # A view lists up to 1,000 names: split like a record's JSON (64 KiB a property).
            chunks = _chunks(view.model_dump_json())
            entity.update({"view" + name[4:]: part for name, part in chunks.items()})
            entity["key"] = key
            if decision is not None:
                entity["decision"] = decision.model_dump_json()
        if ledger is not None:  # < 1 KB: bounded fields
            entity[LEDGER_LEFT if ledger.left_at else LEDGER] = ledger.model_dump_json()
        if first:
            try:
                self.events.create_entity(entity, **NO_ECHO)
                return True
            except ResourceExistsError:
                pass  # reported it before: written below, as any later report
        mode = UpdateMode.MERGE if view is None else UpdateMode.REPLACE
        self.events.upsert_entity(entity, mode=mode)
        return not first

    def get_reporter(self, event_id: str, vm: str) -> Reporter | None:
        """One VM's reporter row (a point read): its status, view and the key of the view;
        None if it never reported the event. A row whose view cannot be read has none."""
        try:
            row = self.events.get_entity(row_key(event_id), REPORTER + row_key(vm))
        except ResourceNotFoundError:
            return None
        return Reporter.from_row(row)

    def view_for(self, event_id: str, vm: str) -> VmView | None:
        """`vm`'s own view of the event, as its latest document showed it (one point read):
        what its relay is asked to confirm before it approves. None if it does not report
        the event now (never did, or stopped) or its row holds no view."""
        reporter = self.get_reporter(event_id, vm)
        return reporter.view if reporter is not None and reporter.status else None

    def reporter_rows(self, event_id: str, skipped: list[Skipped] | None = None) -> list[Reporter]:
        """Every reporter of the event with its view: one partition query. Rows that cannot
        be read are logged, skipped and added to `skipped`."""
        rows = self.events.query_entities(
            "PartitionKey eq @pk and RowKey gt @lo and RowKey lt @hi",
            parameters={"pk": row_key(event_id), "lo": REPORTER, "hi": "r}"},
        )
        return [r for r in (Reporter.from_row(row, skipped) for row in rows) if r is not None]

    def active_reporters(self, event_id: str, limit: int) -> list[str]:
        """The VMs that still list the event, at most `limit` + 1 of them (so a caller
        can tell "a few" from "more than `limit`"): one query, one page."""
        rows = self.events.query_entities(
            "PartitionKey eq @pk and RowKey gt @lo and RowKey lt @hi and status ne ''",
            parameters={"pk": row_key(event_id), "lo": REPORTER, "hi": "r}"},
            select=["vm"],
            results_per_page=limit + 1,
        )
        names: list[str] = []
        for row in rows:
            if isinstance(row.get("vm"), str):
                names.append(row["vm"])
            if len(names) > limit:
                break
        return names
