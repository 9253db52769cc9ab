"""Run the function app's core without Azure: a file inbox instead of the documents queue.

The relay's `--forward file:DIR` writes each message as its own JSON file, names sorting
in send order. This host reads them with Service Bus's rules: one VM's messages in order
(like a session), a message is removed only after it was processed (moved to
`processed/`), a failure is retried on the next pass and after `max_delivery_count`
deliveries moved to `deadletter/` with the reason next to it. A message that does not
validate is recorded in the rejected table and completed, as in Azure.

Everything else is the real thing: the same `ingest_message`, the same Table store (on
Azurite), and a `LocalPublisher` whose subscribers stand in for the topic subscriptions.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import requests
from pydantic import BaseModel, Field

from functions.clock import Clock, SystemClock
from functions.pipeline.context import Pipeline
from functions.pipeline.ingest import IngestResult, ingest_message
from functions.pipeline.publish import LocalPublisher, Publisher
from functions.pipeline.watchdog import WatchdogReport, run_watchdog
from functions.settings import Settings
from functions.store.tables import Store

log = logging.getLogger(__name__)

UNKNOWN_SESSION = "\0unparsable"


class RunReport(BaseModel):
    processed: int = 0
    stale: int = 0
    rejected: int = 0
    failed: int = 0  # will be retried
    dead_lettered: int = 0
    results: list[IngestResult] = Field(default_factory=list)


class LocalHost:
    """`LocalHost(inbox_dir, settings, store, publisher).run_once()` or `.run_forever(stop)`."""

    def __init__(
        self,
        inbox_dir: str | Path,
        settings: Settings,
        store: Store,
        publisher: Publisher | None = None,
        *,
        session: requests.Session | None = None,
        clock: Clock | None = None,
        max_delivery_count: int = 10,
        watchdog_interval_seconds: float = 60.0,
    ) -> None:
        self.inbox = Path(inbox_dir)
        self.processed_dir = self.inbox / "processed"
        self.deadletter_dir = self.inbox / "deadletter"
        for folder in (self.inbox, self.processed_dir, self.deadletter_dir):
            folder.mkdir(parents=True, exist_ok=True)
        self.publisher = publisher if publisher is not None else LocalPublisher()
        self.pipeline = Pipeline(
            store=store,
            settings=settings,
            publisher=self.publisher,
            session=session or requests.Session(),
            clock=clock or SystemClock(),
        )
        self.max_delivery_count = max_delivery_count
        self.watchdog_interval = watchdog_interval_seconds
        self.deliveries: dict[str, int] = defaultdict(int)

    # ---------------------------------------------------------------- one pass

    def pending(self) -> list[Path]:
        """Complete message files in send order (a writer's temp files are skipped)."""
        return sorted(
            p
            for p in self.inbox.iterdir()
            if p.is_file() and p.suffix == ".json" and not p.name.startswith(".")
        )

    def run_once(self) -> RunReport:
        """Process every message present now, one VM's messages in order."""
        report = RunReport()
        sessions: dict[str, list[tuple[Path, bytes]]] = defaultdict(list)
        for path in self.pending():
            try:
                raw = path.read_bytes()
            except FileNotFoundError:
                continue
            body = unwrap(raw)
            sessions[session_of(body)].append((path, body))
        for messages in sessions.values():
            for path, body in messages:
                if not self._deliver(path, body, report):
                    break  # keep this VM's order: later messages wait for this one
        return report

    def _deliver(self, path: Path, body: bytes, report: RunReport) -> bool:
        self.deliveries[path.name] += 1
        try:
            result = ingest_message(body, self.pipeline, message_id=path.stem)
        except Exception as exc:
            count = self.deliveries[path.name]
            log.warning("delivery %d of %s failed: %s", count, path.name, exc)
            if count >= self.max_delivery_count:
                self._move(path, self.deadletter_dir)
                reason = f"{type(exc).__name__}: {exc}\n"
                (self.deadletter_dir / f"{path.name}.reason.txt").write_text(reason)
                report.dead_lettered += 1
                return True  # dead-lettered: the session moves on, as in Service Bus
            report.failed += 1
            return False
        self._move(path, self.processed_dir)
        self.deliveries.pop(path.name, None)
        report.results.append(result)
        if result.outcome == "processed":
            report.processed += 1
        elif result.outcome == "stale":
            report.stale += 1
        else:
            report.rejected += 1
        return True

    @staticmethod
    def _move(path: Path, folder: Path) -> None:
        with contextlib.suppress(FileNotFoundError):
            path.replace(folder / path.name)

    def watchdog(self) -> WatchdogReport:
        return run_watchdog(self.pipeline)

    # ---------------------------------------------------------------- forever

    def run_forever(self, stop: threading.Event, poll_seconds: float = 0.2) -> None:
        """Poll the inbox until `stop` is set; run the watchdog every interval."""
        next_watchdog = time.monotonic() + self.watchdog_interval
        while not stop.is_set():
            try:
                self.run_once()
                if time.monotonic() >= next_watchdog:
                    next_watchdog = time.monotonic() + self.watchdog_interval
                    self.watchdog()
            except Exception:  # storage down for a moment: log, keep going
                log.exception("local host pass failed; retrying")
            stop.wait(poll_seconds)


def unwrap(raw: bytes) -> bytes:
    """The message body. A file is the envelope itself; a file holding a wrapper
    {"body": ..., "message_id"/"session_id"/...} (Service Bus style) is unwrapped."""
    try:
        data: Any = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError):
        return raw
    if isinstance(data, dict) and "body" in data and "kind" not in data:
        inner = data["body"]
        return inner.encode() if isinstance(inner, str) else json.dumps(inner).encode()
    return raw


def session_of(body: bytes) -> str:
    try:
        data = json.loads(body)
        return str(data["vm"]["name"]).casefold()
    except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError):
        return UNKNOWN_SESSION


__all__ = ["LocalHost", "LocalPublisher", "RunReport"]
