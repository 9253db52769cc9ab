"""Table rows as records: the shared machinery every table module builds on.

Every change to a shared row is a read-modify-write guarded by the row's ETag
(`MatchConditions.IfNotModified`), and every "first one wins" is a conditional insert.
No in-process lock is ever involved: the 100 VMs of an availability set may be ingested
by different function instances at once, and only the Table service sees them all.

Each record is one pydantic model stored as JSON in a `data` column (plus a few plain
columns for people browsing the tables), so the schema lives in one place. The tables
themselves are read and written by `functions.store.vms`, `functions.store.events` and
`functions.store.audit`; `functions.store.state.Store` puts them together.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import time
from collections.abc import Callable, Iterator
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
from functions.store.liveness import Skipped
from functions.store.recent import copy_record
from functions.store.records import Record

log = logging.getLogger(__name__)

# The Azure SDK logs every HTTP request and response at Information, and the Functions
# worker forwards the root logger to Application Insights: those lines were most of the
# telemetry per document (about 7.5 KB; the bench's log_bytes_per_doc_by_logger), paid for
# in Log Analytics. Warnings and errors from the SDK still pass.
logging.getLogger("azure.core.pipeline.policies.http_logging_policy").setLevel(logging.WARNING)

CHUNK_CHARS = 30_000  # UTF-16 units in one string property: 60 KB, under the 64 KiB limit
MAX_CHUNKS = 15  # a row's JSON at most 450,000 UTF-16 units (900 KB): under the 1 MiB entity
BATCH = 100  # operations per entity group transaction (the service's limit)


class RowTooLarge(ValueError):
    """A record would not fit a Table row; the caller records why instead of failing."""


def put_if_unchanged(table: Any, entity: dict[str, Any], read: Any) -> bool:
    """Create `entity` if `read` is None, else replace it under the ETag it was read with.
    False when another host created, changed or deleted it first: the single-row state
    machines (policy, Resource Graph refusal, admission report) then re-read and let the
    winner's write stand, so a transition is announced by exactly one host."""
    try:
        if read is None:
            table.create_entity(entity)
        else:
            table.update_entity(
                entity,
                mode=UpdateMode.REPLACE,
                etag=read.metadata["etag"],
                match_condition=MatchConditions.IfNotModified,
            )
    except (ResourceExistsError, ResourceModifiedError, ResourceNotFoundError):
        return False
    return True


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
        parts, used = [], 0
        current: list[str] = []
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


class Rows:
    """Generic record rows: read, conditional insert and replace, the optimistic
    read-modify-write loop, batched deletes. The table modules add their own tables."""

    service: TableServiceClient
    prefix: str

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

    def _write_with(
        self,
        table: TableClient,
        pk: str,
        rk: str,
        record: R,
        extra: dict,
        rows: list[dict[str, Any]],
        *,
        insert: bool,
    ) -> None:
        """The record's conditional write (an insert, or a replace If-Match its ETag) and
        `rows` (Insert Or Replace, same partition) in one entity group transaction: one
        request, all or nothing, so a companion row (an outcome's audit row) exists exactly
        when the write it records does. A lost race raises as the single write would
        (the transaction's error carries the failed operation's 409 or 412)."""
        entity = self._entity(pk, rk, record, extra)
        first: Any = (
            ("create", entity)
            if insert
            else (
                "update",
                entity,
                {
                    "mode": UpdateMode.REPLACE,
                    "etag": record.etag,
                    "match_condition": MatchConditions.IfNotModified,
                },
            )
        )
        ops = [first, *(("upsert", row, {"mode": UpdateMode.REPLACE}) for row in rows)]
        results = table.submit_transaction(ops)
        record.etag = results[0].get("etag") if results else None

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
        with_rows: list[dict[str, Any]] | None = None,
    ) -> tuple[R | None, bool]:
        """Optimistic read-modify-write. `change` gets the current row (or None) and returns
        the new row, or None for "nothing to change". It may run several times, so it must
        only compute, never act. Returns (row as stored, whether this call wrote it).

        `known` is the row as the caller last read or wrote it (None: it did not exist).
        The first attempt starts from it instead of reading again; its ETag still guards
        the write, so if the row moved since, the write fails and the loop reads afresh.
        A row is trusted only through a fresh read or a successful conditional write: a
        "nothing to change" computed from `known` is checked against a fresh read too.

        `with_rows`: rows of the same partition written in the same transaction as the
        write (`_write_with`); not written when nothing changes (the caller then decides)."""
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
                if with_rows:
                    self._write_with(
                        table, pk, rk, updated, extra(updated), with_rows, insert=current is None
                    )
                    return updated, True
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
                # A transaction's 404 (`_write_with`): the row was deleted since we read it.
                gone = exc.status_code == 404 and bool(with_rows) and current is not None
                if exc.status_code not in (409, 412) and not gone:
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
