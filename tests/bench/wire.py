"""What the cost model needs beyond request counts: entities, partitions and bytes on the wire.

`tests/tablecount.TableCounter` counts requests (what Table storage bills). The scalability
targets count entities (a batch of 100 is 100 against the 2,000/s of its partition), and
capacity is bytes stored, so this counter also looks into each request it forwards: the
partition key (from the path, the JSON body or the `$filter`), one entity per batch
sub-request, and the size of what each write sends.
"""

from __future__ import annotations

import re
import threading
from collections import Counter
from urllib.parse import unquote, urlsplit

from tests.tablecount import TableCounter

_ENTITY_PATH = re.compile(r"^/[^/]+/(?P<table>[^/(?]+)(?P<key>\([^)]*\))?")
_PK_IN_KEY = re.compile(r"PartitionKey='((?:[^']|'')*)'")
_RK_IN_KEY = re.compile(r"RowKey='((?:[^']|'')*)'")
_RK_IN_BODY = re.compile(rb'"RowKey"\s*:\s*"((?:[^"\\]|\\.)*)"')
_PK_IN_BODY = re.compile(rb'"PartitionKey"\s*:\s*"((?:[^"\\]|\\.)*)"')
_PK_IN_FILTER = re.compile(r"PartitionKey eq '((?:[^']|'')*)'")
_SUB_REQUEST = re.compile(rb"^(GET|POST|PUT|PATCH|MERGE|DELETE) (\S+) HTTP/1\.1\r?$", re.M)
_WRITES = ("POST", "PUT", "PATCH", "MERGE")


class WireCounter(TableCounter):
    """A TableCounter that also tallies entity operations per (table, partition)."""

    def __init__(self, connection_string: str) -> None:
        super().__init__(connection_string)
        self._entities: Counter[tuple[str, str]] = Counter()
        self._written: Counter[str] = Counter()  # bytes of entity bodies per table
        self._writes: Counter[str] = Counter()  # entity writes per table
        self._rows: dict[tuple[str, str, str], int] = {}  # row -> size of its last write
        self._wire_lock = threading.Lock()

    def _send(self, method, path, body, headers):  # type: ignore[no-untyped-def]
        self._note(method, path, body or b"")
        return super()._send(method, path, body, headers)

    def _note(self, method: str, path: str, body: bytes) -> None:
        parts = urlsplit(path)
        match = _ENTITY_PATH.match(unquote(parts.path))
        table = match.group("table") if match else ""
        if table == "$batch":
            found = list(_SUB_REQUEST.finditer(body))
            for i, sub in enumerate(found):
                end = found[i + 1].start() if i + 1 < len(found) else len(body)
                payload = body[sub.end() : end]
                json_start = payload.find(b"{")
                entity = payload[json_start:] if json_start >= 0 else b""
                self._tally(sub.group(1).decode(), sub.group(2).decode(), entity)
            return
        if table.startswith("Tables") or not table:
            return
        self._tally(method, path, body)

    def _tally(self, method: str, path: str, body: bytes) -> None:
        parts = urlsplit(path)
        target = unquote(parts.path)
        match = _ENTITY_PATH.match(target if target.startswith("/") else "/" + target)
        if match is None:
            return
        table = match.group("table")
        pk = ""
        key = match.group("key") or ""
        if found := _PK_IN_KEY.search(key):
            pk = found.group(1)
        elif found := _PK_IN_BODY.search(body):
            pk = found.group(1).decode("utf-8", "replace")
        elif found := _PK_IN_FILTER.search(unquote(parts.query).replace("+", " ")):
            pk = found.group(1)
        rk = ""
        if found := _RK_IN_KEY.search(key):
            rk = found.group(1)
        elif found := _RK_IN_BODY.search(body):
            rk = found.group(1).decode("utf-8", "replace")
        with self._wire_lock:
            self._entities[(table, pk)] += 1
            if method in _WRITES and body:
                self._written[table] += len(body)
                self._writes[table] += 1
                if rk:
                    self._rows[(table, pk, rk)] = len(body)
            elif method == "DELETE":
                self._rows.pop((table, pk, rk), None)

    def reset(self) -> None:
        super().reset()
        with self._wire_lock:
            self._entities.clear()
            self._written.clear()
            self._writes.clear()
            self._rows.clear()

    def entities_in(self, table_suffix: str) -> int:
        """Entity operations since the reset on tables whose name ends with the suffix."""
        with self._wire_lock:
            return sum(n for (t, _), n in self._entities.items() if t.endswith(table_suffix))

    def entities(self) -> int:
        """Entity operations since the reset: a batch counts each of its sub-requests."""
        with self._wire_lock:
            return sum(self._entities.values())

    def hottest_partition_share(self) -> float:
        """Share of entity operations on the busiest (table, partition)."""
        with self._wire_lock:
            total = sum(self._entities.values())
            return max(self._entities.values()) / total if total else 1.0

    def partitions(self) -> dict[tuple[str, str], int]:
        with self._wire_lock:
            return dict(self._entities)

    def stored(self, table_suffix: str) -> tuple[int, int]:
        """(bytes, rows) as left by the writes since the reset, in tables whose name ends
        with the suffix: each row's last write counts once, a deleted row not at all."""
        with self._wire_lock:
            sizes = [n for (t, _, _), n in self._rows.items() if t.endswith(table_suffix)]
            return sum(sizes), len(sizes)

    def bytes_written(self, table_suffix: str) -> tuple[int, int]:
        """(bytes, writes) of entity bodies sent to tables whose name ends with the suffix."""
        with self._wire_lock:
            size = sum(n for t, n in self._written.items() if t.endswith(table_suffix))
            count = sum(n for t, n in self._writes.items() if t.endswith(table_suffix))
            return size, count
