"""The on-disk outbox: every envelope is on disk (written atomically, fsynced) before sending.

A crash or `kill -9` at any moment leaves either the whole message file or none of it, so
a restarted relay resends what was not confirmed, in the same order; Service Bus duplicate
detection (the MessageId) drops what had in fact been sent.

Layout: `DIR/outbox/<sequence:012d>-<kind>.json`; names sort in send order. The sequence
is also kept in `DIR/sequence` so it keeps increasing after the outbox drains and the relay
restarts (the functions use it to spot gaps and order).

Bound (a soft one, by design): heartbeats carry nothing once a newer message exists, so a
new heartbeat replaces any pending one, and while the outbox holds `max_messages` or more,
heartbeats are not queued at all and pending ones are deleted. Documents are never dropped
and never merged: even an "older" document can be the only record that an event was
Scheduled (or Started) before it changed, and the lifecycle needs every step. When
documents alone exceed the bound, they are still written and an error is logged (once per
crossing, then at every doubling) so an operator hears that Service Bus is unreachable long
before the disk fills. A failed write (disk full) raises `OutboxError`; the watcher keeps
the document and retries, so it is never lost silently.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import threading
import time
from pathlib import Path

from relay.logs import event
from relay.models import Envelope
from relay.record import Record

log = logging.getLogger("relay.outbox")

_NAME = re.compile(r"^(\d{12})-(document|heartbeat)\.json$")


class OutboxError(Exception):
    """A message could not be made durable; the caller must keep it and retry."""


class OutboxMessage(Record):
    sequence: int
    kind: str
    path: Path

    def read(self) -> str:
        return self.path.read_text(encoding="utf-8")


def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, data: bytes, mode: int = 0o640) -> None:
    """Write to a temporary name, fsync, rename over, fsync the directory."""
    tmp = path.with_name(f".tmp-{path.name}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.fchmod(fd, mode)  # a leftover temporary file keeps its old mode otherwise
        view = memoryview(data)
        while view:
            written = os.write(fd, view)
            view = view[written:]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(path.parent)


class Outbox:
    def __init__(self, state_dir: Path, max_messages: int = 10000) -> None:
        self.directory = state_dir / "outbox"
        self.rejected = state_dir / "outbox-rejected"
        self._sequence_file = state_dir / "sequence"
        self._max = max_messages
        self._cond = threading.Condition()
        self.directory.mkdir(parents=True, exist_ok=True)
        for leftover in self.directory.glob(".tmp-*"):
            leftover.unlink(missing_ok=True)  # a write a crash interrupted; never renamed
        self._messages: list[OutboxMessage] = self._scan()
        self._sequence = max(
            self._read_sequence(), self._messages[-1].sequence if self._messages else 0
        )
        self._alarm_at = self._max  # next document count that logs an error

    def _scan(self) -> list[OutboxMessage]:
        found = []
        for path in self.directory.iterdir():
            match = _NAME.match(path.name)
            if match:
                found.append(OutboxMessage(int(match[1]), match[2], path))
        return sorted(found)

    def _read_sequence(self) -> int:
        try:
            return int(self._sequence_file.read_text().strip() or 0)
        except FileNotFoundError:
            return 0
        except ValueError:
            # Never reuse a sequence: a damaged file is replaced by the outbox's own maximum.
            event(log, logging.ERROR, "sequence file is damaged; continuing from the outbox")
            return 0

    @property
    def sequence(self) -> int:
        return self._sequence

    def __len__(self) -> int:
        with self._cond:
            return len(self._messages)

    def counts(self) -> dict[str, int]:
        with self._cond:
            documents = sum(1 for m in self._messages if m.kind == "document")
            return {"documents": documents, "heartbeats": len(self._messages) - documents}

    def append(self, envelope: Envelope) -> OutboxMessage | None:
        """Make one envelope durable; its `sequence` is replaced by the next number.

        Returns None when a heartbeat was not queued because the outbox is full.
        """
        with self._cond:
            if envelope.kind == "heartbeat":
                self._drop_heartbeats(reason="superseded by a newer heartbeat")
                if len(self._messages) >= self._max:
                    event(
                        log,
                        logging.WARNING,
                        "outbox full: heartbeat not queued",
                        pending=len(self._messages),
                        bound=self._max,
                    )
                    return None
            else:
                if len(self._messages) >= self._max:
                    self._drop_heartbeats(reason="outbox full, documents come first")
                documents = sum(1 for m in self._messages if m.kind == "document") + 1
                if documents >= self._alarm_at:
                    event(
                        log,
                        logging.ERROR,
                        "outbox holds more documents than its bound; still keeping every one "
                        "- is the forward target reachable?",
                        documents=documents,
                        bound=self._max,
                    )
                    self._alarm_at *= 2
            sequence = self._sequence + 1
            stamped = envelope.with_sequence(sequence)
            path = self.directory / f"{sequence:012d}-{envelope.kind}.json"
            try:
                atomic_write(path, stamped.to_json().encode())
                atomic_write(self._sequence_file, f"{sequence}\n".encode())
            except OSError as exc:
                raise OutboxError(f"cannot write {path}: {exc.strerror or exc}") from exc
            self._sequence = sequence
            message = OutboxMessage(sequence, envelope.kind, path)
            self._messages.append(message)
            if len(self._messages) < self._max:
                self._alarm_at = self._max
            self._cond.notify_all()
            return message

    def _drop_heartbeats(self, reason: str) -> None:
        kept = []
        for message in self._messages:
            if message.kind == "heartbeat":
                message.path.unlink(missing_ok=True)
                event(
                    log, logging.DEBUG, "heartbeat dropped", sequence=message.sequence, why=reason
                )
            else:
                kept.append(message)
        self._messages = kept

    def oldest(self, timeout: float | None = None) -> OutboxMessage | None:
        """The next message to send, waiting up to `timeout` for one to arrive."""
        with self._cond:
            if not self._messages and timeout:
                self._cond.wait(timeout)
            return self._messages[0] if self._messages else None

    def remove(self, message: OutboxMessage) -> None:
        """Forget a message the forward target confirmed."""
        with self._cond:
            if message in self._messages:
                self._messages.remove(message)
            message.path.unlink(missing_ok=True)

    def reject(self, message: OutboxMessage, reason: str) -> None:
        """Move an unreadable message aside (kept for people, never sent, never deleted)."""
        with self._cond:
            self.rejected.mkdir(exist_ok=True)
            with contextlib.suppress(FileNotFoundError):
                os.replace(message.path, self.rejected / message.path.name)
            if message in self._messages:
                self._messages.remove(message)
        event(
            log,
            logging.ERROR,
            "outbox message is unreadable; moved aside",
            file=str(self.rejected / message.path.name),
            reason=reason,
        )

    def wait_while_size(self, size: int, timeout: float, stop: threading.Event) -> None:
        """Wait up to `timeout` while the outbox holds exactly `size` messages."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while len(self._messages) == size and not stop.is_set():
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                self._cond.wait(left)

    def wake(self) -> None:
        with self._cond:
            self._cond.notify_all()
