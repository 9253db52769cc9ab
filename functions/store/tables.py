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
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any, TypeVar

import requests
from azure.core import MatchConditions
from azure.core.exceptions import (
    HttpResponseError,
    ResourceExistsError,
    ResourceModifiedError,
    ResourceNotFoundError,
)
from azure.core.pipeline.transport import RequestsTransport
from azure.data.tables import TableClient, TableServiceClient, UpdateMode

from functions.store.keys import row_key
from functions.store.records import (
    CapacityRecord,
    EventRecord,
    Record,
    VmRecord,
)

log = logging.getLogger(__name__)

VM_PARTITION = "vm"
EVENT_PARTITION = "event"
CAPACITY_PARTITION = "capacity"
RECENT_EVENT_ROWS = 1024  # event rows a Store remembers as the start of its next write


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


class ConflictError(RuntimeError):
    """A row kept changing under us; the caller may retry the whole operation."""


def transport_options(endpoint: str) -> dict[str, Any]:
    """HTTP settings for the Table client, read from the environment once.

    By default requests re-reads the proxy variables (walking all of `os.environ`), the
    CA-bundle variables and ~/.netrc on *every* request: about a tenth of ingest's CPU,
    for values that do not change while we run. So: proxies (honouring NO_PROXY for our
    one endpoint) and the CA bundle are read here, once. A ~/.netrc entry is no longer
    applied; it would only have replaced the Table signature with Basic auth anyway.
    """
    proxies = requests.utils.get_environ_proxies(endpoint)
    verify = os.environ.get("REQUESTS_CA_BUNDLE") or os.environ.get("CURL_CA_BUNDLE") or True
    return {
        "transport": RequestsTransport(use_env_settings=False, connection_verify=verify),
        "proxies": {k: v for k, v in proxies.items() if k != "no"} or None,
    }


R = TypeVar("R", bound=Record)


class _Unread:
    """The row has not been read yet: `_mutate` reads it first."""


UNREAD: Any = _Unread()


def _copy(record: R) -> R:
    """A deep copy through the JSON the row is stored as: several times faster than
    `model_copy(deep=True)`, and exactly what a fresh read would give."""
    copied = type(record).model_validate_json(record.model_dump_json())
    copied.etag = record.etag
    return copied


class Store:
    """All state the function app keeps. Thread-safe to share; cheap to create per thread."""

    def __init__(self, service: TableServiceClient, prefix: str = "sebridge") -> None:
        self.service = service
        self.prefix = prefix
        self.vms = service.get_table_client(f"{prefix}vms")
        self.events = service.get_table_client(f"{prefix}events")
        self.audit_table = service.get_table_client(f"{prefix}audit")
        self.rejected = service.get_table_client(f"{prefix}rejected")
        self._recent_events: OrderedDict[str, EventRecord] = OrderedDict()
        self._recent_lock = threading.Lock()  # guards the dict only; never the Table rows

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
        for name in ("vms", "events", "audit", "rejected", "drains"):
            # A concurrent creator winning is fine.
            with contextlib.suppress(ResourceExistsError):
                self.service.create_table_if_not_exists(f"{self.prefix}{name}")
        return self

    # ------------------------------------------------------------------ generic rows

    @staticmethod
    def _load(model: type[R], entity: Any) -> R:
        record = model.model_validate_json(entity["data"])
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
        return {"PartitionKey": pk, "RowKey": rk, "data": record.model_dump_json(), **extra}

    def _insert(self, table: TableClient, pk: str, rk: str, record: R, extra: dict) -> bool:
        """Conditional insert: True if this call created the row, False if it existed."""
        try:
            meta = table.create_entity(self._entity(pk, rk, record, extra))
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
        for attempt in range(attempts):
            unverified = attempt == 0 and known is not UNREAD
            current = known if unverified else self._get(table, model, pk, rk)
            snapshot = _copy(current) if current is not None else None
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

    # ------------------------------------------------------------------ VMs

    def get_vm(self, name: str) -> VmRecord | None:
        return self._get(self.vms, VmRecord, VM_PARTITION, row_key(name))

    def mutate_vm(
        self,
        name: str,
        change: Callable[[VmRecord | None], VmRecord | None],
        known: VmRecord | None = UNREAD,
    ) -> tuple[VmRecord | None, bool]:
        return self._mutate(
            self.vms,
            VmRecord,
            VM_PARTITION,
            row_key(name),
            change,
            lambda r: {"name": r.name},
            known=known,
        )

    def list_vms(self) -> list[VmRecord]:
        rows = self.vms.query_entities("PartitionKey eq @pk", parameters={"pk": VM_PARTITION})
        return [self._load(VmRecord, row) for row in rows]

    # ------------------------------------------------------------------ events

    def get_event(self, event_id: str) -> EventRecord | None:
        rk = row_key(event_id)
        record = self._get(self.events, EventRecord, EVENT_PARTITION, rk)
        self._note_event(rk, record)
        return record

    def _note_event(self, rk: str, record: EventRecord | None) -> None:
        """Remember the event row as last read or written here, with its ETag."""
        with self._recent_lock:
            if record is None or record.etag is None:
                self._recent_events.pop(rk, None)
                return
            self._recent_events[rk] = _copy(record)
            self._recent_events.move_to_end(rk)
            while len(self._recent_events) > RECENT_EVENT_ROWS:
                self._recent_events.popitem(last=False)

    def recent_event(self, event_id: str) -> EventRecord | None:
        """The event row as this Store last read or wrote it, if remembered: unverified, so
        only facts that never change back may be taken from it (see lifecycle: an ended
        event stays ended, and `past_reporters` only grows)."""
        recalled = self._recall_event(row_key(event_id))
        return None if recalled is UNREAD else recalled

    def _recall_event(self, rk: str) -> EventRecord | None:
        with self._recent_lock:
            record = self._recent_events.get(rk)
            return _copy(record) if record is not None else UNREAD

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
            known = self._recall_event(rk)
        record, won = self._mutate(
            self.events,
            EventRecord,
            EVENT_PARTITION,
            rk,
            change,
            lambda r: {
                "EventType": r.event_type,
                "EventStatus": r.event_status,
                "ended": r.ended,
                "action": r.decision.action if r.decision else "",
                "approval": r.approval,
            },
            known=known,
        )
        self._note_event(rk, record)
        return record, won

    def list_events(self, include_ended: bool = False) -> list[EventRecord]:
        query = "PartitionKey eq @pk" + ("" if include_ended else " and ended eq ''")
        rows = self.events.query_entities(query, parameters={"pk": EVENT_PARTITION})
        return [self._load(EventRecord, row) for row in rows]

    # ------------------------------------------------------------------ capacity

    def mutate_capacity(
        self, key: str, change: Callable[[CapacityRecord | None], CapacityRecord | None]
    ) -> tuple[CapacityRecord | None, bool]:
        return self._mutate(
            self.events,
            CapacityRecord,
            CAPACITY_PARTITION,
            row_key(key),
            change,
            lambda r: {"holders": ",".join(r.holders)},
        )

    def get_capacity(self, key: str) -> CapacityRecord | None:
        return self._get(self.events, CapacityRecord, CAPACITY_PARTITION, row_key(key))

    def claim_once(self, key: str, now: datetime) -> bool:
        """A fleet-wide "first one wins" marker (e.g. one announcement per policy error)."""
        entity = {"PartitionKey": "once", "RowKey": row_key(key), "at": now.isoformat()}
        try:
            self.events.create_entity(entity)
        except ResourceExistsError:
            return False
        return True

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
        """One row per decision or approval outcome; partitioned by event for easy reading."""
        self.audit_table.create_entity(
            {
                "PartitionKey": row_key(event_id),
                # Wall-clock nanoseconds break ties between rows written in one (injected) instant.
                "RowKey": f"{at.strftime('%Y%m%dT%H%M%S.%fZ')}-{time.time_ns():020d}-"
                f"{uuid.uuid4().hex[:6]}",
                "EventId": event_id,
                "rule": rule,
                "action": action,
                "outcome": outcome,
                "detail": detail[:4000],
                "by": by[:200],
                "time": at,
            }
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
            }
        )

    def rejected_rows(self) -> Iterator[dict[str, Any]]:
        for row in self.rejected.list_entities():
            yield dict(row)
