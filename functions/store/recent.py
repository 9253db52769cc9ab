"""Rows a Store remembers as it last read or wrote them, with their ETags.

Why: one VM's documents, and one event's reports from them, usually come one after
another through the same worker (Service Bus sessions keep a VM on one instance while it
is busy), so the row this Store wrote last is very likely still the row in Table storage.
Starting the next write from it saves a read per document. A remembered row is never
trusted on its own: it is only the starting point of a conditional write (If-Match its
ETag), and each caller says which of its facts it may rely on before that write.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Generic, TypeVar

from functions.store.records import Record

R = TypeVar("R", bound=Record)


def copy_record(record: R) -> R:
    """A deep copy through the JSON the row is stored as: several times faster than
    `model_copy(deep=True)`, and exactly what a fresh read would give."""
    copied = type(record).model_validate_json(record.model_dump_json())
    copied.etag = record.etag
    return copied


class RecentRows(Generic[R]):
    """A bounded, thread-safe memo of rows by key; the least recently noted go first.

    Copies go in and out, so no caller ever shares a record with another thread."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._rows: OrderedDict[str, R] = OrderedDict()
        self._lock = threading.Lock()  # guards the dict only; never the Table rows

    def note(self, key: str, record: R | None) -> None:
        """Remember `record` as the row now stored under `key`; None (or a record without
        an ETag, which no write could be guarded with) forgets the key."""
        if record is None or record.etag is None:
            self.forget(key)
            return
        copied = copy_record(record)
        with self._lock:
            self._rows[key] = copied
            self._rows.move_to_end(key)
            while len(self._rows) > self.limit:
                self._rows.popitem(last=False)

    def recall(self, key: str) -> R | None:
        """A copy of the remembered row, or None if this Store does not remember one."""
        with self._lock:
            record = self._rows.get(key)
        return copy_record(record) if record is not None else None

    def forget(self, key: str) -> None:
        with self._lock:
            self._rows.pop(key, None)

    def __len__(self) -> int:
        return len(self._rows)
