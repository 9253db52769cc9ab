"""Fleet state in Azure Table storage: VMs, events, capacity slots, audit and rejects.

Every change to a shared row is a read-modify-write guarded by the row's ETag
(`MatchConditions.IfNotModified`), and every "first one wins" is a conditional insert.
No in-process lock is ever involved: the 100 VMs of an availability set may be ingested
by different function instances at once, and only the Table service sees them all.

Each record is one pydantic model stored as JSON in a `data` column (plus a few plain
columns for people browsing the tables), so the schema lives in one place.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any, TypeVar
from urllib.parse import urlsplit

import requests
from azure.core import MatchConditions
from azure.core.exceptions import (
    HttpResponseError,
    ResourceExistsError,
    ResourceModifiedError,
    ResourceNotFoundError,
)
from azure.data.tables import TableClient, TableServiceClient, UpdateMode

from functions.store.http import NO_ECHO, Urllib3Transport
from functions.store.keys import VM_BUCKETS, reserved, row_key, vm_partition
from functions.store.liveness import Liveness, Skipped
from functions.store.recent import RecentRows, copy_record
from functions.store.records import (
    CapacityRecord,
    EventRecord,
    Record,
    VmRecord,
)

log = logging.getLogger(__name__)

# The Azure SDK logs every HTTP request and response at Information, and the Functions
# worker forwards the root logger to Application Insights: those lines were most of the
# telemetry per document (about 7.5 KB; the bench's log_bytes_per_doc_by_logger), paid for
# in Log Analytics. Warnings and errors from the SDK still pass.
logging.getLogger("azure.core.pipeline.policies.http_logging_policy").setLevel(logging.WARNING)

EVENT_ROW = "event"  # in an event's partition: its lifecycle, decision, approval
REPORTER = "r|"  # in an event's partition: one row per reporting VM, "r|<vm key>"
OPEN_EVENTS = reserved("open")  # events table: one row per event not ended yet
CLAIMS = reserved("once")  # events table: fleet-wide "first one wins" markers
RECENT_EVENT_ROWS = 1024  # event rows a Store remembers as the start of its next write
RECENT_VM_ROWS = 2048  # VM rows likewise: about 2 KB each, so a few MB at most
CHUNK_CHARS = 30_000  # UTF-16 units in one string property: 60 KB, under the 64 KiB limit
MAX_CHUNKS = 15  # a row's JSON at most 450,000 UTF-16 units (900 KB): under the 1 MiB entity
BATCH = 100  # operations per entity group transaction (the service's limit)


def ended_partition(day: str) -> str:
    """Events table: the events that ended on `day` (YYYY-MM-DD), for retention."""
    return reserved(f"ended|{day}")


def capacity_partition(key: str) -> str:
    return reserved("cap|" + row_key(key))


class RowTooLarge(ValueError):
    """A record would not fit a Table row; the caller records why instead of failing."""


def utf16_prefix(text: str, units: int) -> str:
    """The longest prefix of `text` that is at most `units` UTF-16 code units long (how
    Table storage measures a string property), never splitting a surrogate pair; lone
    surrogates become U+FFFD so the row can always be sent."""
    text = text.encode("utf-8", "replace").decode("utf-8") if not text.isascii() else text
    if len(text) <= units // 2:
        return text
    out, used = [], 0
    for ch in text:
        used += 2 if ord(ch) > 0xFFFF else 1
        if used > units:
            break
        out.append(ch)
    return "".join(out)


def _callback_url_ok(value: object) -> bool:
    """A relay's callback as the envelope allows it: http(s)://HOST[:PORT], no user info."""
    if not isinstance(value, str) or len(value) > 2048:
        return False
    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018 - raises ValueError for a port out of range
    except ValueError:
        return False
    return parts.scheme in ("http", "https") and bool(parts.hostname) and "@" not in parts.netloc


class BadRow(ValueError):
    """A stored row that cannot be read as its record (malformed JSON, wrong types, too
    large): the readers skip and report it (`skipped`), never stop on it."""

    def __init__(self, table: str, entity: Any, why: str) -> None:
        self.skipped = Skipped(
            table,
            str(entity.get("PartitionKey", "?"))[:80],
            str(entity.get("RowKey", "?"))[:80],
            why[:300],
        )
        super().__init__(str(self.skipped))


def _why(exc: Exception) -> str:
    return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300]


VM_MARK = "vm|"  # in the open index: a VM with silence marks (RowKey reserved("vm|<key>"))


class ConflictError(RuntimeError):
    """A row kept changing under us; the caller may retry the whole operation."""


def transport_options(endpoint: str) -> dict[str, Any]:
    """HTTP settings for the Table client, read from the environment once.

    requests would re-read the proxy variables (walking all of `os.environ`), the
    CA-bundle variables and ~/.netrc on *every* request, for values that do not change
    while we run. So: the proxy (honouring NO_PROXY for our one endpoint) and the CA
    bundle are read here, once, for the urllib3 transport (functions.store.http says why
    not requests). A ~/.netrc entry is not applied; it would only have replaced the Table
    signature with Basic auth anyway.
    """
    proxies = requests.utils.get_environ_proxies(endpoint)
    proxy = proxies.get(urlsplit(endpoint).scheme) or proxies.get("all")
    verify = os.environ.get("REQUESTS_CA_BUNDLE") or os.environ.get("CURL_CA_BUNDLE") or True
    return {"transport": Urllib3Transport(proxy=proxy, verify=verify)}


R = TypeVar("R", bound=Record)


class _Unread:
    """The row has not been read yet: `_mutate` reads it first."""


UNREAD: Any = _Unread()


def _chunks(text: str) -> dict[str, str]:
    """The record's JSON as `data`, `data1`, ... so no one property nears 64 KiB. Table
    storage counts UTF-16 units (a character beyond U+FFFF takes two), and so do we."""
    units = len(text) if text.isascii() else len(text.encode("utf-16-le", "replace")) // 2
    if units > CHUNK_CHARS * MAX_CHUNKS:
        raise RowTooLarge(f"row of {units} UTF-16 units exceeds {CHUNK_CHARS * MAX_CHUNKS}")
    if text.isascii():
        parts = [text[i : i + CHUNK_CHARS] for i in range(0, len(text), CHUNK_CHARS)] or [""]
    else:
        parts, current, used = [], [], 0
        for ch in text:
            width = 2 if ord(ch) > 0xFFFF else 1
            if used + width > CHUNK_CHARS:
                parts.append("".join(current))
                current, used = [], 0
            current.append(ch)
            used += width
        parts.append("".join(current))
    return {("data" if n == 0 else f"data{n}"): part for n, part in enumerate(parts)}


def _unchunk(entity: Any) -> str | None:
    if "data" not in entity:
        return None
    parts = [entity["data"]]
    n = 1
    while f"data{n}" in entity:
        parts.append(entity[f"data{n}"])
        n += 1
    return "".join(parts)


def _in_batches(ops: list[Any]) -> Iterator[list[Any]]:
    for start in range(0, len(ops), BATCH):
        yield ops[start : start + BATCH]


class Store:
    """All state the function app keeps. Thread-safe to share; cheap to create per thread.

    Layout (functions/README.md, "What is stored", has the why):
    - `{prefix}vms`: a VM's row in partition `vm00`..`vm07` (hash of its name), RowKey =
      its name's key. Document state is JSON in `data`; liveness is in plain columns
      (`seen`, `callback_url`, `relay_version`) that a heartbeat merges without reading.
    - `{prefix}events`: each event is its own partition (PartitionKey = EventId's key):
      RowKey `event` holds the lifecycle, decision, approval and announcements; RowKey
      `r|<vm>` is one reporter, written by that reporter alone. Index partitions: `%open`
      (events not ended), `%ended|<day>` (for retention), `%cap|<set>` (capacity slots),
      `%once` (fleet-wide markers).
    - `{prefix}audit`: PartitionKey = EventId's key (deleted with its event).
    - `{prefix}rejected`: PartitionKey = day.
    """

    def __init__(self, service: TableServiceClient, prefix: str = "sebridge") -> None:
        self.service = service
        self.prefix = prefix
        self.vms = service.get_table_client(f"{prefix}vms")
        self.events = service.get_table_client(f"{prefix}events")
        self.audit_table = service.get_table_client(f"{prefix}audit")
        self.rejected = service.get_table_client(f"{prefix}rejected")
        # Relays' heartbeats (contract §5): read as hints, never as truth.
        self.liveness = Liveness(service, prefix)
        self._recent_events: RecentRows[EventRecord] = RecentRows(RECENT_EVENT_ROWS)
        self._recent_vms: RecentRows[VmRecord] = RecentRows(RECENT_VM_ROWS)

    @classmethod
    def from_connection_string(cls, connection_string: str, prefix: str = "sebridge") -> Store:
        endpoint = TableServiceClient.from_connection_string(connection_string).url
        service = TableServiceClient.from_connection_string(
            connection_string, **transport_options(endpoint)
        )
        return cls(service, prefix)

    @classmethod
    def from_settings(cls, settings: Any) -> Store:
        kind, value = settings.table_connection()
        if kind == "connection_string":
            return cls.from_connection_string(value, settings.state_table_prefix)
        from azure.identity import DefaultAzureCredential

        service = TableServiceClient(
            endpoint=value, credential=DefaultAzureCredential(), **transport_options(value)
        )
        return cls(service, settings.state_table_prefix)

    def ensure_tables(self) -> Store:
        for name in ("vms", "events", "audit", "rejected", "drains", "identities", "liveness"):
            # A concurrent creator winning is fine.
            with contextlib.suppress(ResourceExistsError):
                self.service.create_table_if_not_exists(f"{self.prefix}{name}")
        return self

    # ------------------------------------------------------------------ generic rows

    @staticmethod
    def _load(model: type[R], entity: Any) -> R:
        """The row's record; BadRow (naming the row's keys) if it is not one."""
        try:
            text = _unchunk(entity)
            record = model.model_validate_json(text) if isinstance(text, str) else None
        except Exception as exc:  # malformed JSON, wrong types, a non-string chunk
            raise BadRow(model.__name__, entity, _why(exc)) from None
        if record is None:
            raise BadRow(model.__name__, entity, "no data")
        record.etag = entity.metadata.get("etag")
        return record

    def _get(self, table: TableClient, model: type[R], pk: str, rk: str) -> R | None:
        try:
            entity = table.get_entity(pk, rk)
        except ResourceNotFoundError:
            return None
        return self._load(model, entity)

    @staticmethod
    def _entity(pk: str, rk: str, record: Record, extra: dict[str, Any]) -> dict[str, Any]:
        return {"PartitionKey": pk, "RowKey": rk, **_chunks(record.model_dump_json()), **extra}

    def _insert(self, table: TableClient, pk: str, rk: str, record: R, extra: dict) -> bool:
        """Conditional insert: True if this call created the row, False if it existed."""
        try:
            meta = table.create_entity(self._entity(pk, rk, record, extra), **NO_ECHO)
        except ResourceExistsError:
            return False
        record.etag = meta.get("etag")
        return True

    def _replace(self, table: TableClient, pk: str, rk: str, record: R, extra: dict) -> None:
        """Replace only if unchanged since read; raise ResourceModifiedError otherwise."""
        meta = table.update_entity(
            self._entity(pk, rk, record, extra),
            mode=UpdateMode.REPLACE,
            etag=record.etag,
            match_condition=MatchConditions.IfNotModified,
        )
        record.etag = meta.get("etag")

    def _mutate(
        self,
        table: TableClient,
        model: type[R],
        pk: str,
        rk: str,
        change: Callable[[R | None], R | None],
        extra: Callable[[R], dict[str, Any]],
        attempts: int = 120,
        known: R | None = UNREAD,
        load: Callable[[Any], R] | None = None,
    ) -> tuple[R | None, bool]:
        """Optimistic read-modify-write. `change` gets the current row (or None) and returns
        the new row, or None for "nothing to change". It may run several times, so it must
        only compute, never act. Returns (row as stored, whether this call wrote it).

        `known` is the row as the caller last read or wrote it (None: it did not exist).
        The first attempt starts from it instead of reading again; its ETag still guards
        the write, so if the row moved since, the write fails and the loop reads afresh.
        A row is trusted only through a fresh read or a successful conditional write: a
        "nothing to change" computed from `known` is checked against a fresh read too."""
        if known is not None and known is not UNREAD and known.etag is None:
            known = UNREAD  # built, not read: no ETag to guard a write with

        def read() -> R | None:
            if load is None:
                return self._get(table, model, pk, rk)
            try:
                return load(table.get_entity(pk, rk))
            except ResourceNotFoundError:
                return None

        for attempt in range(attempts):
            unverified = attempt == 0 and known is not UNREAD
            current = known if unverified else read()
            snapshot = copy_record(current) if current is not None else None
            updated = change(snapshot)
            if updated is None:
                if unverified:
                    continue
                return current, False
            try:
                if current is None:
                    if self._insert(table, pk, rk, updated, extra(updated)):
                        return updated, True
                else:
                    updated.etag = current.etag
                    self._replace(table, pk, rk, updated, extra(updated))
                    return updated, True
            except ResourceModifiedError:
                pass
            except ResourceNotFoundError:
                if current is None:
                    raise  # an insert found no table: not a race, a setup problem
                # the row was deleted since we read it: start over
            except HttpResponseError as exc:
                if exc.status_code not in (409, 412):
                    raise
            if not unverified:  # a stale `known` is no race: read again at once
                # Lost the race: back off a little (jittered, so 100 writers spread out).
                time.sleep(random.uniform(0, min(0.2, 0.005 * (2**attempt))))  # noqa: S311
        raise ConflictError(f"{table.table_name}/{rk} kept changing; gave up after {attempts}")

    def _delete_rows(self, table: TableClient, keys: list[tuple[str, str]]) -> int:
        """Delete rows, one transaction per partition and 100 rows; returns requests made."""
        by_partition: dict[str, list[str]] = {}
        for pk, rk in keys:
            by_partition.setdefault(pk, []).append(rk)
        requests_made = 0
        for pk, rks in by_partition.items():
            for chunk in _in_batches(rks):
                ops = [("delete", {"PartitionKey": pk, "RowKey": rk}) for rk in chunk]
                requests_made += 1
                try:
                    table.submit_transaction(ops)
                except Exception:  # one row gone already fails the batch: go one by one
                    for rk in chunk:
                        requests_made += 1
                        with contextlib.suppress(ResourceNotFoundError):
                            table.delete_entity(pk, rk)
        return requests_made

    # ------------------------------------------------------------------ VMs

    @staticmethod
    def _load_vm(entity: Any) -> VmRecord:
        """Document state from `data`, overlaid with the liveness columns heartbeats merge."""
        try:
            text = _unchunk(entity)
            record = (
                VmRecord.model_validate_json(text)
                if text is not None
                else VmRecord(name=str(entity.get("name") or entity["RowKey"])[:1000])
            )
        except Exception as exc:  # a row that is not a VM's record: the caller skips it
            raise BadRow("VmRecord", entity, _why(exc)) from None
        seen = entity.get("seen")
        if isinstance(seen, datetime) and (record.last_seen is None or seen > record.last_seen):
            record.last_seen = seen
        url = entity.get("callback_url")
        if url and _callback_url_ok(url):
            record.callback_url = url.rstrip("/")
        elif url:
            # Relays write these columns themselves (relay.liveness), past the envelope's
            # checks: a value that is not a plain http(s) URL is never called back.
            log.warning("VM %s: ignoring callback_url column %.100r", record.name, url)
        version = entity.get("relay_version")
        if isinstance(version, str) and version:
            record.relay_version = version[:100]
        record.etag = entity.metadata.get("etag")
        return record

    @staticmethod
    def _vm_columns(record: VmRecord) -> dict[str, Any]:
        columns: dict[str, Any] = {
            "name": record.name,
            "silent": record.silent_announced_for is not None,
            "recovering": record.recovery_pending is not None,
        }
        if record.last_seen is not None:
            columns["seen"] = record.last_seen
        if record.callback_url:
            columns["callback_url"] = record.callback_url
        if record.relay_version:
            columns["relay_version"] = record.relay_version
        return columns

    def get_vm(self, name: str, *, strict: bool = False) -> VmRecord | None:
        """The VM row. One that cannot be read raises BadRow with `strict` (the watchdog
        skips and reports it); otherwise it reads as a new VM's, carrying the bad row's
        ETag, so the VM's next write replaces it and the VM is never blocked by it."""
        key = row_key(name)
        try:
            entity = self.vms.get_entity(vm_partition(name), key)
        except ResourceNotFoundError:
            self._recent_vms.forget(key)
            return None
        record = self._load_vm(entity) if strict else self._load_vm_or_fresh(name, entity)
        self._recent_vms.note(key, record)
        return record

    def recent_vm(self, name: str) -> VmRecord | None:
        """The VM row as this Store last read or wrote it, if remembered. Unverified:
        anyone may have written since (a heartbeat, the watchdog, another instance), so a
        caller relies on it only where it can tell nobody changed what it reads
        (functions.pipeline.ingest: the next document of the same relay) and writes
        with its ETag as the guard."""
        return self._recent_vms.recall(row_key(name))

    def mutate_vm(
        self,
        name: str,
        change: Callable[[VmRecord | None], VmRecord | None],
        known: VmRecord | None = UNREAD,
    ) -> tuple[VmRecord | None, bool]:
        key = row_key(name)
        try:
            record, won = self._mutate(
                self.vms,
                VmRecord,
                vm_partition(name),
                key,
                change,
                self._vm_columns,
                known=known,
                load=lambda entity: self._load_vm_or_fresh(name, entity),
            )
        except BaseException:
            self._recent_vms.forget(key)
            raise
        self._recent_vms.note(key, record)
        return record, won

    def _load_vm_or_fresh(self, name: str, entity: Any) -> VmRecord:
        """A VM row that cannot be read must not block its VM: it is logged and replaced
        (conditionally, under its ETag) by the next write, as if the VM were new."""
        try:
            return self._load_vm(entity)
        except BadRow as exc:
            log.warning("VM %.100r: replacing an unreadable row: %s", name, exc)
            record = VmRecord(name=name)
            record.etag = entity.metadata.get("etag")
            return record

    def heard(self, beats: list[tuple[str, datetime, str | None, str | None]]) -> int:
        """Liveness of many VMs at once: (name, seen, callback_url, relay_version) each.

        A merge, never a read or a replace, so it cannot undo a document's write; one
        transaction per VM partition (at most VM_BUCKETS per 100 VMs). Returns requests."""
        latest: dict[str, tuple[str, datetime, str | None, str | None]] = {}
        for beat in beats:
            key = row_key(beat[0])
            if key not in latest or beat[1] >= latest[key][1]:
                latest[key] = beat
        by_partition: dict[str, list[dict[str, Any]]] = {}
        for key, (name, seen, callback_url, relay_version) in latest.items():
            entity: dict[str, Any] = {
                "PartitionKey": vm_partition(name),
                "RowKey": key,
                "name": name,
                "seen": seen,
            }
            if callback_url:
                entity["callback_url"] = callback_url
            if relay_version:
                entity["relay_version"] = relay_version
            by_partition.setdefault(entity["PartitionKey"], []).append(entity)
        made = 0
        for key in latest:  # their rows move: a remembered one would only fail its write
            self._recent_vms.forget(key)
        for entities in by_partition.values():
            for chunk in _in_batches(entities):
                ops = [("upsert", e, {"mode": UpdateMode.MERGE}) for e in chunk]
                self.vms.submit_transaction(ops)
                made += 1
        return made

    def vms_due(self, silent_before: datetime) -> Iterator[VmRecord]:
        """VMs not heard since `silent_before`, or announced silent, or with a recovery
        announcement pending: one filtered query per VM partition, whatever the fleet."""
        query = "PartitionKey eq @pk and (seen lt @cutoff or silent eq true or recovering eq true)"
        for bucket in range(VM_BUCKETS):
            rows = self.vms.query_entities(
                query, parameters={"pk": f"vm{bucket:02d}", "cutoff": silent_before}
            )
            for row in rows:
                try:
                    yield self._load_vm(row)
                except BadRow as exc:
                    log.warning("vms: skipped %s", exc)

    def delete_vm(self, name: str) -> None:
        self._recent_vms.forget(row_key(name))
        with contextlib.suppress(ResourceNotFoundError):
            self.vms.delete_entity(vm_partition(name), row_key(name))

    def list_vms(self) -> list[VmRecord]:
        """Every VM (for tools and tests; the function app never lists the fleet)."""
        rows = self.vms.query_entities("PartitionKey ge 'vm' and PartitionKey lt 'vn'")
        found = []
        for row in rows:
            try:
                found.append(self._load_vm(row))
            except BadRow as exc:
                log.warning("vms: skipped %s", exc)
        return found

    # ------------------------------------------------------------------ events

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

    def load_reporters(self, record: EventRecord) -> EventRecord:
        """Fill `reporters` (VM -> status, those still reporting it) and `past_reporters`
        (every VM that ever did) from the event's reporter rows: one partition query."""
        rows = self.events.query_entities(
            "PartitionKey eq @pk and RowKey gt @lo and RowKey lt @hi",
            parameters={"pk": row_key(record.event_id), "lo": REPORTER, "hi": "r}"},
            select=["vm", "status"],
        )
        present: dict[str, str] = {}
        everyone: list[str] = []
        for row in rows:
            vm, status = row.get("vm"), row.get("status")
            if not isinstance(vm, str) or not isinstance(status, str | None):
                log.warning("events: skipped reporter row %.100r", row.get("RowKey"))
                continue
            everyone.append(vm)
            if status:
                present[vm] = status
        record.reporters = present
        record.past_reporters = everyone
        return record

    def set_reporter(self, event_id: str, vm: str, status: str, at: datetime) -> None:
        """This VM's own row in the event's partition: status "" = it no longer reports it.
        Only that VM's documents write it (one session each), so a blind upsert is safe."""
        self.events.upsert_entity(
            {
                "PartitionKey": row_key(event_id),
                "RowKey": REPORTER + row_key(vm),
                "vm": vm,
                "status": status,
                "at": at,
            },
            mode=UpdateMode.REPLACE,
        )

    def anyone_reports(self, event_id: str) -> bool:
        """Whether any VM still reports the event: one query that stops at the first."""
        rows = self.events.query_entities(
            "PartitionKey eq @pk and RowKey gt @lo and RowKey lt @hi and status ne ''",
            parameters={"pk": row_key(event_id), "lo": REPORTER, "hi": "r}"},
            select=["RowKey"],
            results_per_page=1,
        )
        return next(iter(rows), None) is not None

    def open_event(self, event_id: str, now: datetime) -> None:
        """List the event in the open index (before its row exists: never a row unlisted)."""
        self.events.upsert_entity(
            {
                "PartitionKey": OPEN_EVENTS,
                "RowKey": row_key(event_id),
                "EventId": event_id,
                "at": now,
            },
            mode=UpdateMode.REPLACE,
        )

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
    ) -> tuple[EventRecord | None, bool]:
        """Read-modify-write of an event row. Without `known`, the write starts from the
        row as this Store last read or wrote it, if it still remembers it: one VM's
        documents about an event usually come one after another through the same worker,
        and nobody else wrote the row in between. That remembered row is only the
        starting point of a conditional write (If-Match its ETag): if anyone wrote since,
        the write fails and the row is read afresh, so it is never trusted stale."""
        rk = row_key(event_id)
        if known is UNREAD:
            known = self._recent_events.recall(rk) or UNREAD
        record, won = self._mutate(
            self.events, EventRecord, rk, EVENT_ROW, change, self._event_columns, known=known
        )
        self._recent_events.note(rk, record)
        return record, won

    def list_events(self, include_ended: bool = False) -> list[EventRecord]:
        """Events not ended (the open index, then each row), or with `include_ended` every
        event row still kept (a scan: for the status page's `?all=true` only)."""
        if include_ended:
            rows = self.events.query_entities("RowKey eq @rk", parameters={"rk": EVENT_ROW})
            loaded = []
            for row in rows:
                try:
                    loaded.append(self._load(EventRecord, row))
                except BadRow as exc:
                    log.warning("events: skipped %s", exc)
            return loaded
        found = []
        for event_id, _ in self.open_events():
            try:
                record = self.get_event(event_id)
            except BadRow as exc:
                log.warning("events: skipped %s", exc)
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
        """Expired events: each one's rows (event, reporters), its audit rows, and then
        the index rows naming them (in batches). Returns the Table requests it took."""
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

    # ------------------------------------------------------------------ audit, rejects

    def audit(
        self,
        event_id: str,
        *,
        at: datetime,
        rule: str,
        action: str,
        outcome: str,
        detail: str = "",
        by: str = "policy",
    ) -> None:
        """One row per decision or approval outcome, in the event's partition (so it is
        read with the event and deleted with it)."""
        self.audit_table.create_entity(
            {
                "PartitionKey": row_key(event_id),
                # Wall-clock nanoseconds break ties between rows written in one (injected) instant.
                "RowKey": f"{at.strftime('%Y%m%dT%H%M%S.%fZ')}-{time.time_ns():020d}-"
                f"{uuid.uuid4().hex[:6]}",
                "EventId": event_id[:1000],
                "rule": rule[:1000],
                "action": action[:100],
                "outcome": outcome[:1000],
                "detail": detail[:4000],
                "by": by[:200],
                "time": at,
            },
            **NO_ECHO,
        )

    def audit_rows(self, event_id: str) -> list[dict[str, Any]]:
        rows = self.audit_table.query_entities(
            "PartitionKey eq @pk", parameters={"pk": row_key(event_id)}
        )
        return sorted((dict(r) for r in rows), key=lambda r: r["RowKey"])

    def reject(self, *, at: datetime, reason: str, body: bytes | str, message_id: str = "") -> None:
        """Keep an envelope that does not validate, with why, so nothing is silently lost."""
        text = body.decode("utf-8", "replace") if isinstance(body, bytes) else body
        self.rejected.create_entity(
            {
                "PartitionKey": at.strftime("%Y-%m-%d"),
                "RowKey": f"{at.strftime('%H%M%S.%f')}-{uuid.uuid4().hex[:8]}",
                "reason": utf16_prefix(reason, 4000),
                "message_id": utf16_prefix(message_id, 512),
                # A string property holds 32 K UTF-16 units (64 KiB): cut there, not at
                # 30 000 characters, which non-BMP text would make twice as long.
                "body": utf16_prefix(text, 30000),
                "time": at,
            },
            **NO_ECHO,
        )

    def rejected_rows(self) -> Iterator[dict[str, Any]]:
        for row in self.rejected.list_entities():
            yield dict(row)

    def expired_rejects(self, before_day: str) -> list[tuple[str, str]]:
        """Rejected rows of days before `before_day`: a range query over old days only."""
        rows = self.rejected.query_entities(
            "PartitionKey lt @day",
            parameters={"day": before_day},
            select=["PartitionKey", "RowKey"],
        )
        return [(row["PartitionKey"], row["RowKey"]) for row in rows]

    def delete_rejects(self, keys: list[tuple[str, str]]) -> int:
        return self._delete_rows(self.rejected, keys)
