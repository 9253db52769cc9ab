"""The events table: each event's row and its reporters, the open and ended indexes,
capacity slots and fleet-wide "first one wins" markers.

Each event is its own partition (PartitionKey = EventId's key): RowKey `event` holds the
lifecycle, decision, approval and announcements; RowKey `r|<vm>` is one reporter, written
by that reporter alone. Index partitions: `%open` (events not ended, and VMs with silence
marks), `%ended|<day>` (for retention), `%cap|<set>` (capacity slots), `%once` (markers).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from azure.core.exceptions import ResourceExistsError, ResourceNotFoundError
from azure.data.tables import TableClient, UpdateMode

from functions.store.http import NO_ECHO
from functions.store.keys import reserved, row_key
from functions.store.liveness import Skipped
from functions.store.recent import RecentRows
from functions.store.records import CapacityRecord, EventRecord
from functions.store.reporters import (  # noqa: F401  (named here by older callers)
    LEDGER,
    LEDGER_LEFT,
    REPORTER,
    Reporter,
    ReporterRows,
    read_ledger,
)
from functions.store.rows import UNREAD, BadRow

log = logging.getLogger(__name__)

EVENT_ROW = "event"  # in an event's partition: its lifecycle, decision, approval
OPEN_EVENTS = reserved("open")  # events table: one row per event not ended yet
CLAIMS = reserved("once")  # events table: fleet-wide "first one wins" markers
RECENT_EVENT_ROWS = 1024  # event rows a Store remembers as the start of its next write
VM_MARK = "vm|"  # in the open index: a VM with silence marks (RowKey reserved("vm|<key>"))

DUE = "due"  # the open index's column: when the event is next due (`due_text`)
NEVER = "9999-12-31T23:59:59Z"  # due only when something is observed


def due_text(at: datetime | None) -> str:
    """A due time as the index keeps it: UTC to the second, so text order is time order."""
    if at is None:
        return NEVER
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def ended_partition(day: str) -> str:
    """Events table: the events that ended on `day` (YYYY-MM-DD), for retention."""
    return reserved(f"ended|{day}")


def capacity_partition(key: str) -> str:
    return reserved("cap|" + row_key(key))


class EventRows(ReporterRows):
    """Reads and writes of the events table (its reporter rows: functions.store.reporters)."""

    events: TableClient
    audit_table: TableClient
    _recent_events: RecentRows[EventRecord]
    _due_written: OrderedDict[str, datetime | None]
    _due_lock: threading.Lock

    @staticmethod
    def _event_columns(r: EventRecord) -> dict[str, Any]:
        return {
            "EventId": r.event_id,
            "EventType": r.event_type,
            "EventStatus": r.event_status,
            "ended": r.ended,
            "action": r.decision.action if r.decision else "",
            "approval": r.approval,
        }

    def get_event(self, event_id: str, *, reporters: bool = False) -> EventRecord | None:
        """The event row (one point read); `reporters=True` also reads its reporter rows."""
        rk = row_key(event_id)
        record = self._get(self.events, EventRecord, rk, EVENT_ROW)
        self._recent_events.note(rk, record)
        if record is not None and reporters:
            self.load_reporters(record)
        return record

    def event_and_reporters(
        self, event_id: str, skipped: list[Skipped] | None = None
    ) -> tuple[EventRecord | None, list[Reporter]]:
        """The event row and its reporter rows with their views, in one partition query
        (what `get_event` and `reporter_rows` read in two): the decider's read
        (functions.pipeline.reconcile.reconcile_key). The row carries its ETag as a point
        read's does, so it guards the writes that start from it. Reporter rows that
        cannot be read are logged, skipped and added to `skipped`; an event row that
        cannot be read raises BadRow, as `get_event` does."""
        rk = row_key(event_id)
        entities = self.events.query_entities(
            # Spaces around each @name: the SDK substitutes whole words only.
            "PartitionKey eq @pk and ( RowKey eq @row or ( RowKey gt @lo and RowKey lt @hi ) )",
            parameters={"pk": rk, "row": EVENT_ROW, "lo": REPORTER, "hi": "r}"},
        )
        record: EventRecord | None = None
        rows: list[Reporter] = []
        for entity in entities:
            if entity.get("RowKey") == EVENT_ROW:
                record = self._load(EventRecord, entity)
                continue
            reporter = Reporter.from_row(entity, skipped)
            if reporter is not None:
                rows.append(reporter)
        self._recent_events.note(rk, record)
        return record, rows

    def open_event(self, event_id: str, now: datetime) -> None:
        """List the event in the open index (before its row exists: never a row unlisted),
        due at once: the next sweep looks at it, and its reconcile says when it is next due."""
        self.events.upsert_entity(
            {
                "PartitionKey": OPEN_EVENTS,
                "RowKey": row_key(event_id),
                "EventId": event_id,
                "at": now,
                DUE: due_text(now),
            },
            mode=UpdateMode.REPLACE,
        )

    def due_written(self, event_id: str) -> tuple[bool, datetime | None]:
        """(known, the due time) this Store last wrote for the event in the open index."""
        with self._due_lock:
            key = row_key(event_id)
            if key not in self._due_written:
                return False, None
            self._due_written.move_to_end(key)
            return True, self._due_written[key]

    def set_due(self, event_id: str, at: datetime | None) -> None:
        """When the event is next due (None: only when something is observed): the sweep
        finds it then with one filtered query (`due_events`), never by reading every open
        event. A merge: an index row that a close removed meanwhile comes back, is found
        due, and its reconcile removes it again."""
        self.events.upsert_entity(
            {
                "PartitionKey": OPEN_EVENTS,
                "RowKey": row_key(event_id),
                "EventId": event_id,
                DUE: due_text(at),
            },
            mode=UpdateMode.MERGE,
        )
        with self._due_lock:
            self._due_written[row_key(event_id)] = at
            while len(self._due_written) > RECENT_EVENT_ROWS:
                self._due_written.popitem(last=False)

    def listed_at(self, event_id: str) -> datetime | None:
        """When the event was listed in the open index (None: not listed)."""
        try:
            row = self.events.get_entity(OPEN_EVENTS, row_key(event_id), select=["at"])
        except ResourceNotFoundError:
            return None
        at = row.get("at")
        return at if isinstance(at, datetime) else None

    def due_events(self, now: datetime, limit: int) -> list[tuple[str, str]]:
        """Open events due by `now` (EventId, the due time as the index says it), at most
        `limit`, earliest first: one query of the open index, filtered by the service."""
        rows = self.events.query_entities(
            f"PartitionKey eq @pk and {DUE} le @now",
            parameters={"pk": OPEN_EVENTS, "now": due_text(now)},
            select=["RowKey", "EventId", DUE],
        )
        found: list[tuple[str, str]] = []
        for row in rows:
            event_id, due = row.get("EventId"), row.get(DUE)
            if isinstance(event_id, str) and event_id and isinstance(due, str):
                found.append((event_id, due))
            if len(found) >= limit * 4:
                break
        found.sort(key=lambda item: item[1])
        return found[:limit]

    def close_event(self, event_id: str, ended_at: datetime) -> None:
        """Move an ended event from the open index to the day it ended (for retention)."""
        day = ended_at.strftime("%Y-%m-%d")
        self.events.upsert_entity(
            {
                "PartitionKey": ended_partition(day),
                "RowKey": row_key(event_id),
                "EventId": event_id,
            },
            mode=UpdateMode.REPLACE,
        )
        with contextlib.suppress(ResourceNotFoundError):
            self.events.delete_entity(OPEN_EVENTS, row_key(event_id))

    def open_events(self) -> list[tuple[str, datetime | None]]:
        """(EventId, listed at) of every event not ended: one query of the small index."""
        return self.open_index()[0]

    def open_index(
        self, skipped: Callable[[Skipped], None] | None = None
    ) -> tuple[list[tuple[str, datetime | None]], list[dict[str, str]]]:
        """One query of the open index: (events not ended as (EventId, listed at), VMs
        with silence marks as {"vm", "vm_id", "mark", "done"}). A row that is neither is skipped
        and reported."""
        rows = self.events.query_entities(
            "PartitionKey eq @pk",
            parameters={"pk": OPEN_EVENTS},
            select=["RowKey", "EventId", "at", "vm", "vm_id", "mark", "done"],
        )
        events: list[tuple[str, datetime | None]] = []
        marks: list[dict[str, str]] = []
        for row in rows:
            rk = str(row.get("RowKey", ""))
            if rk.startswith(reserved(VM_MARK)) and isinstance(row.get("vm"), str):
                mark = {k: row[k] for k in ("vm", "vm_id", "mark") if isinstance(row.get(k), str)}
                marks.append({**mark, "done": "yes" if row.get("done") is True else ""})
                continue
            event_id, at = row.get("EventId"), row.get("at")
            if isinstance(event_id, str) and event_id and (at is None or isinstance(at, datetime)):
                events.append((event_id, at))
                continue
            skip = Skipped(self.events.table_name, OPEN_EVENTS, rk[:80], "not an index row")
            log.warning("open index: skipped %s", skip)
            if skipped is not None:
                skipped(skip)
        return events, marks

    def vm_marks(self, skipped: Callable[[Skipped], None] | None = None) -> list[dict[str, str]]:
        """The VMs listed with silence marks ({"vm", "vm_id", "mark", "done"}): one range
        query of the open index, none of its event rows."""
        low = reserved(VM_MARK)
        rows = self.events.query_entities(
            "PartitionKey eq @pk and RowKey ge @lo and RowKey lt @hi",
            parameters={"pk": OPEN_EVENTS, "lo": low, "hi": low[:-1] + chr(ord(low[-1]) + 1)},
            select=["RowKey", "vm", "vm_id", "mark", "done"],
        )
        marks: list[dict[str, str]] = []
        for row in rows:
            if not isinstance(row.get("vm"), str):
                rk = str(row.get("RowKey"))[:80]
                skip = Skipped(self.events.table_name, OPEN_EVENTS, rk, "not a VM mark")
                log.warning("open index: skipped %s", skip)
                if skipped is not None:
                    skipped(skip)
                continue
            mark = {k: row[k] for k in ("vm", "vm_id", "mark") if isinstance(row.get(k), str)}
            marks.append({**mark, "done": "yes" if row.get("done") is True else ""})
        return marks

    def mark_vm(self, name: str, vm_id: str, mark: str, *, done: bool = False) -> None:
        """List a VM in the open index as having silence marks (before the VM row gets
        them, so a VM row is never marked unlisted); the watchdog drops the listing when
        it finds the VM row without marks."""
        self.events.upsert_entity(
            {
                "PartitionKey": OPEN_EVENTS,
                "RowKey": reserved(VM_MARK + row_key(name)),
                "vm": name,
                "vm_id": vm_id,
                "mark": mark,
                "done": done,  # the silence's announcement is published
            },
            mode=UpdateMode.REPLACE,
        )

    def mark_recovering(self, name: str) -> None:
        """The VM's listing: its silence is ending (a recovery is being announced), so the
        watchdog looks at the VM row again until the listing is dropped."""
        self.events.upsert_entity(
            {
                "PartitionKey": OPEN_EVENTS,
                "RowKey": reserved(VM_MARK + row_key(name)),
                "vm": name,
                "done": False,
            },
            mode=UpdateMode.MERGE,
        )

    def unmark_vm(self, name: str) -> None:
        with contextlib.suppress(ResourceNotFoundError):
            self.events.delete_entity(OPEN_EVENTS, reserved(VM_MARK + row_key(name)))

    def drop_open(self, event_id: str) -> None:
        with contextlib.suppress(ResourceNotFoundError):
            self.events.delete_entity(OPEN_EVENTS, row_key(event_id))

    def recent_event(self, event_id: str) -> EventRecord | None:
        """The event row as this Store last read or wrote it, if remembered: unverified, so
        only facts that never change back may be taken from it (see lifecycle: an ended
        event stays ended, a decision once made stays made)."""
        return self._recent_events.recall(row_key(event_id))

    def mutate_event(
        self,
        event_id: str,
        change: Callable[[EventRecord | None], EventRecord | None],
        known: EventRecord | None = UNREAD,
        with_rows: list[dict[str, Any]] | None = None,
    ) -> tuple[EventRecord | None, bool]:
        """Read-modify-write of an event row (with `with_rows`, rows of the event's
        partition written in the same transaction: functions.store.rows `_mutate`).
        Without `known`, the write starts from the row as this Store last read or wrote
        it, if it still remembers it: one VM's documents about an event usually come one
        after another through the same worker,
        and nobody else wrote the row in between. That remembered row is only the
        starting point of a conditional write (If-Match its ETag): if anyone wrote since,
        the write fails and the row is read afresh, so it is never trusted stale."""
        rk = row_key(event_id)
        if known is UNREAD:
            known = self._recent_events.recall(rk) or UNREAD
        record, won = self._mutate(
            self.events,
            EventRecord,
            rk,
            EVENT_ROW,
            change,
            self._event_columns,
            known=known,
            with_rows=with_rows,
        )
        self._recent_events.note(rk, record)
        return record, won

    def note_arm_sent(self, record: EventRecord, now: datetime) -> None:
        """Write `arm_sent_at` before the ARM approver's first acknowledge (one write,
        only on its path: functions.pipeline.approve_arm), so a takeover after a crash
        knows a 409 may answer a call that landed. The row's new ETag goes back into
        `record`, whose outcome write follows."""

        def change(rec: EventRecord | None) -> EventRecord | None:
            if rec is None or rec.arm_sent_at is not None:
                return None
            rec.arm_sent_at = now
            return rec

        written, won = self.mutate_event(record.event_id, change, known=record)
        if written is not None:
            record.arm_sent_at = written.arm_sent_at
            if won:
                record.etag = written.etag

    def list_events(
        self, include_ended: bool = False, skipped: list[Skipped] | None = None
    ) -> list[EventRecord]:
        """Events not ended (the open index, then each row), or with `include_ended` every
        event row still kept (a scan: for the status page's `?all=true` only). Rows that
        cannot be read are logged, skipped and added to `skipped`."""
        if include_ended:
            rows = self.events.query_entities("RowKey eq @rk", parameters={"rk": EVENT_ROW})
            loaded = []
            for row in rows:
                try:
                    loaded.append(self._load(EventRecord, row))
                except BadRow as exc:
                    log.warning("events: skipped %s", exc)
                    if skipped is not None:
                        skipped.append(exc.skipped)
            return loaded
        found = []
        for event_id, _ in self.open_index(skipped.append if skipped is not None else None)[0]:
            try:
                record = self.get_event(event_id)
            except BadRow as exc:
                log.warning("events: skipped %s", exc)
                if skipped is not None:
                    skipped.append(exc.skipped)
                continue
            if record is not None and not record.ended:
                found.append(record)
        return found

    def expired_events(self, before_day: str, limit: int) -> list[tuple[str, str]]:
        """(day, EventId) of events that ended before `before_day`: one range query over
        the ended-on-day partitions, which after deletion hold only what expires next."""
        rows = self.events.query_entities(
            "PartitionKey ge @lo and PartitionKey lt @hi",
            parameters={"lo": ended_partition(""), "hi": ended_partition(before_day)},
            select=["PartitionKey", "EventId"],
            results_per_page=min(limit, 1000),
        )
        out: list[tuple[str, str]] = []
        for row in rows:
            out.append((row["PartitionKey"], row["EventId"]))
            if len(out) >= limit:
                break
        return out

    def delete_events(self, expired: list[tuple[str, str]]) -> int:
        """Expired events: each one's rows (event, reporters, audit), the audit rows an
        earlier version kept in the audit table, and then the index rows naming them (in
        batches). Returns the Table requests it took."""
        made = 0
        for _, event_id in expired:
            pk = row_key(event_id)
            for table in (self.events, self.audit_table):
                rows = table.query_entities(
                    "PartitionKey eq @pk", parameters={"pk": pk}, select=["RowKey"]
                )
                keys = [(pk, row["RowKey"]) for row in rows]
                made += 1 + self._delete_rows(table, keys)
            self._recent_events.forget(pk)
        made += self._delete_rows(self.events, [(day, row_key(e)) for day, e in expired])
        return made

    # ------------------------------------------------------------------ capacity

    def mutate_capacity(
        self, key: str, change: Callable[[CapacityRecord | None], CapacityRecord | None]
    ) -> tuple[CapacityRecord | None, bool]:
        return self._mutate(
            self.events,
            CapacityRecord,
            capacity_partition(key),
            "slots",
            change,
            lambda r: {"holders": ",".join(r.holders)[:1000]},
        )

    def get_capacity(self, key: str) -> CapacityRecord | None:
        return self._get(self.events, CapacityRecord, capacity_partition(key), "slots")

    def claim_once(self, key: str, now: datetime) -> bool:
        """A fleet-wide "first one wins" marker (e.g. one announcement per policy error)."""
        entity = {"PartitionKey": CLAIMS, "RowKey": row_key(key), "at": now.isoformat()}
        try:
            self.events.create_entity(entity, **NO_ECHO)
        except ResourceExistsError:
            return False
        return True

    def forget_once(self, key: str) -> None:
        """Undo a `claim_once` whose act failed, so the next delivery claims it again."""
        with contextlib.suppress(ResourceNotFoundError):
            self.events.delete_entity(CLAIMS, row_key(key))
