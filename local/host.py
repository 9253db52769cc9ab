"""Run the function app's core without Azure: a file inbox instead of the queues.

The relay's `--forward file:DIR` writes each message as its own JSON file, names sorting
in send order: documents to `DIR/`, heartbeats to `DIR/heartbeats/` (contract C1). This
host reads them with Service Bus's rules and the function app's own trigger settings
(`TriggerConfig`, read from host.json): documents one VM's messages in order (a session),
at most `maxConcurrentSessions` VMs at once; heartbeats in batches of at most
`maxMessageBatchSize`, waiting for `minMessageBatchSize` up to `maxBatchWaitTime`. A
message is removed only after it was processed (moved to `processed/`), a failure is
retried on the next pass and after `max_delivery_count` deliveries moved to `deadletter/`
with the reason next to it. A message that does not validate is recorded in the rejected
table and completed, as in Azure.

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
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path
from typing import Any

import requests
from pydantic import BaseModel, Field

from functions.clock import Clock, SystemClock
from functions.pipeline.admission import Admission
from functions.pipeline.context import Pipeline
from functions.pipeline.coverage import run_coverage
from functions.pipeline.guest_time import utc
from functions.pipeline.heartbeats import HeartbeatResult, ingest_heartbeats
from functions.pipeline.ingest import ingest_message
from functions.pipeline.publish import LocalPublisher, Publisher
from functions.pipeline.results import IngestResult
from functions.pipeline.sources.eventgrid_ingest import ingest_event_grid
from functions.pipeline.watchdog import WatchdogReport, run_watchdog
from functions.settings import Settings
from functions.store.state import Store
from functions.terminate.settings import DrainSettings
from functions.triggers.later import MAX_RETRIES, delay, is_outage
from local.stopping import Stopped
from simulator.eventgrid import EVENT_GRID_SUFFIX

log = logging.getLogger(__name__)

UNKNOWN_SESSION = "\0unparsable"
HOST_JSON = Path(__file__).resolve().parent.parent / "host.json"


class TriggerConfig(BaseModel):
    """What host.json tells the Functions host about delivering Service Bus messages."""

    max_concurrent_sessions: int = 8  # the extension's defaults, where host.json is silent
    max_concurrent_calls: int = 16  # a non-session queue's concurrency (the work queue)
    max_message_batch_size: int = 1000
    min_message_batch_size: int = 1
    max_batch_wait_seconds: float = 30.0

    @classmethod
    def from_host_json(cls, path: Path = HOST_JSON) -> TriggerConfig:
        bus = json.loads(path.read_text()).get("extensions", {}).get("serviceBus", {})
        values: dict[str, Any] = {}
        for key, field in (
            ("maxConcurrentSessions", "max_concurrent_sessions"),
            ("maxConcurrentCalls", "max_concurrent_calls"),
            ("maxMessageBatchSize", "max_message_batch_size"),
            ("minMessageBatchSize", "min_message_batch_size"),
        ):
            if key in bus:
                values[field] = int(bus[key])
        if "maxBatchWaitTime" in bus:
            hours, minutes, seconds = bus["maxBatchWaitTime"].split(":")
            values["max_batch_wait_seconds"] = (
                int(hours) * 3600 + int(minutes) * 60 + float(seconds)
            )
        return cls(**values)


class RunReport(BaseModel):
    processed: int = 0
    stale: int = 0
    rejected: int = 0
    failed: int = 0  # will be retried
    later: int = 0  # failed on an outage: a copy scheduled for later (functions.triggers.later)
    dead_lettered: int = 0
    results: list[IngestResult] = Field(default_factory=list)
    heartbeat_batches: list[HeartbeatResult] = Field(default_factory=list)


class LocalWorkQueue:
    """The `reconcile` queue and function, locally (functions.pipeline.workqueue): the
    app's own ServiceBusWorkQueue builds each item as a real ServiceBusMessage and sends it
    to a stand-in of the queue that checks what Service Bus checks (local/bus.py: sizes,
    duplicate detection on the MessageId for an hour, one call on a sender at a time); each
    accepted item is reconciled on its own by one of `maxConcurrentCalls` workers, its
    claims held as `work:<MessageId>` as in Azure. A work item that fails is left to the
    next sweep (its reconcile set it due again). `done` and `failed` count them."""

    def __init__(self, pipeline: Pipeline, workers: int) -> None:
        from functions.pipeline.workqueue import ServiceBusWorkQueue
        from local.bus import LocalQueue

        self.pipeline = pipeline
        self.pool = ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="work")
        self.queue = LocalQueue("reconcile")
        self.queue.on_message(self._accept)
        self.sender = ServiceBusWorkQueue(self.queue)
        self.lock = threading.Lock()
        self.pending = 0  # accepted and not finished
        self.done = 0
        self.failed = 0
        self.closed = threading.Event()

    def enqueue(self, keys: list[str], now: Any, *, sweep: bool = False) -> int:
        return self.sender.enqueue(keys, now, sweep=sweep)

    def _accept(self, message: Any) -> None:
        from local.bus import body_of

        with self.lock:
            self.pending += 1
        try:
            self.pool.submit(self._work, body_of(message).decode(), str(message.message_id))
        except RuntimeError:  # the pool was shut down: nothing runs it (as a stopped host)
            with self.lock:
                self.pending -= 1

    def _work(self, key: str, message_id: str) -> None:
        from functions.pipeline.reconcile import reconcile_key

        try:
            if self.closed.is_set():
                return  # the host is stopping: the item is left, as a stopped host leaves it
            reconcile_key(self.pipeline, key, me=f"work:{message_id}")
            with self.lock:
                self.done += 1
        except Exception:
            log.exception("work item %.200r failed; the next sweep finds it again", key)
            with self.lock:
                self.failed += 1
        finally:
            with self.lock:
                self.pending -= 1

    def idle(self) -> bool:
        with self.lock:
            return self.pending == 0

    def close(self, wait: bool = False) -> None:
        """No item starts any more and those queued are dropped (the next sweep finds
        them again); `wait`: until the items running have ended too (the demo's stop,
        whose clock and session end them: local/stopping.py)."""
        self.closed.set()
        self.pool.shutdown(wait=wait, cancel_futures=True)


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
        triggers: TriggerConfig | None = None,
        admission: Admission | None = None,
        credential: Any = None,
        later_scale: float = 1.0,
    ) -> None:
        """`admission`: who sent each relay message (functions.pipeline.admission); without
        it every relay message is refused, as the app refuses them without its identity
        settings. `credential`: the app's identity for Resource Manager (ARM approvals)."""
        self.inbox = Path(inbox_dir)
        self.processed_dir = self.inbox / "processed"
        self.deadletter_dir = self.inbox / "deadletter"
        self.heartbeats_dir = self.inbox / "heartbeats"
        for folder in (
            self.inbox,
            self.processed_dir,
            self.deadletter_dir,
            self.heartbeats_dir,
            self.heartbeats_dir / "processed",
        ):
            folder.mkdir(parents=True, exist_ok=True)
        self.triggers = triggers or TriggerConfig.from_host_json()
        self._report_lock = threading.Lock()
        self.publisher = publisher if publisher is not None else LocalPublisher()
        self.pipeline = Pipeline(
            store=store,
            settings=settings,
            publisher=self.publisher,
            session=session or requests.Session(),
            clock=clock or SystemClock(),
            credential=credential,
            admission=admission,
        )
        self.work = LocalWorkQueue(self.pipeline, self.triggers.max_concurrent_calls)
        self.pipeline.work_queue = self.work
        self.later_scale = later_scale  # the delays of copies for later, scaled
        self.max_delivery_count = max_delivery_count
        self.watchdog_interval = watchdog_interval_seconds
        # The drain workflow's settings where the caller gives them (the demo's, scaled):
        # the coverage pass says which drain each VM has under them, not the process's.
        self.drain_settings: DrainSettings | None = None
        self.deliveries: dict[str, int] = defaultdict(int)
        # When each document file was first seen: Service Bus's EnqueuedTimeUtc here (a
        # copy for later carries its original's), so a relay's clock is judged by it.
        self.enqueued: dict[str, datetime] = {}

    # ---------------------------------------------------------------- one pass

    def pending(self, folder: Path | None = None) -> list[Path]:
        """Complete message files in send order (a writer's temp files are skipped)."""
        return sorted(
            p
            for p in (folder or self.inbox).iterdir()
            if p.is_file() and p.suffix == ".json" and not p.name.startswith(".")
        )

    def run_once(self, *, wait_for_batches: bool = True) -> RunReport:
        """Process every document present now, one VM's messages in order and at most
        `maxConcurrentSessions` VMs at once, then the heartbeats that make up a batch
        (all of them with `wait_for_batches=False`)."""
        report = RunReport()
        sessions: dict[str, list[tuple[Path, bytes, int, datetime]]] = defaultdict(list)
        now = time.time()
        for path in self.pending():
            try:
                raw = path.read_bytes()
            except FileNotFoundError:
                continue
            at, retry = scheduled(raw)
            if at is not None and at > now:
                continue  # a copy scheduled for later: invisible until then, as in Service Bus
            body = unwrap(raw)
            with self._report_lock:
                enqueued = self.enqueued.setdefault(
                    path.name, enqueued_in(raw) or self.pipeline.clock.now()
                )
            sessions[session_of(body)].append((path, body, retry, enqueued))

        def run_session(messages: list[tuple[Path, bytes, int, datetime]]) -> None:
            for path, body, retry, enqueued in messages:
                if not self._deliver(path, body, report, retry, enqueued):
                    break  # keep this VM's order: later messages wait for this one

        workers = max(1, min(self.triggers.max_concurrent_sessions, len(sessions)))
        if workers == 1:
            for messages in sessions.values():
                run_session(messages)
        else:
            with ThreadPoolExecutor(max_workers=workers) as pool:
                list(pool.map(run_session, sessions.values()))
        self.run_heartbeats(report, wait_for_batches=wait_for_batches)
        return report

    def heartbeat_batches(self, *, wait_for_batches: bool = True) -> list[list[Path]]:
        """The heartbeat files the trigger would hand over now, batch by batch: at most
        `maxMessageBatchSize` each, in send order; a last batch smaller than
        `minMessageBatchSize` waits until its oldest message waited `maxBatchWaitTime`."""
        files = self.pending(self.heartbeats_dir)
        size = self.triggers.max_message_batch_size
        batches = [files[i : i + size] for i in range(0, len(files), size)]
        if wait_for_batches and batches and len(batches[-1]) < self.triggers.min_message_batch_size:
            try:
                waited = time.time() - batches[-1][0].stat().st_mtime
            except FileNotFoundError:
                waited = 0.0
            if waited < self.triggers.max_batch_wait_seconds:
                batches.pop()
        return batches

    def run_heartbeats(self, report: RunReport, *, wait_for_batches: bool = True) -> None:
        for batch in self.heartbeat_batches(wait_for_batches=wait_for_batches):
            bodies = []
            for path in batch:
                with contextlib.suppress(FileNotFoundError):
                    bodies.append((path, unwrap(path.read_bytes())))
            try:
                result = ingest_heartbeats(
                    [b for _, b in bodies], self.pipeline, [p.stem for p, _ in bodies]
                )
            except Exception as exc:  # the whole batch is abandoned, as in Azure
                log.warning("heartbeat batch of %d failed: %s", len(bodies), exc)
                for path, _ in bodies:
                    self.deliveries[path.name] += 1
                    if self.deliveries[path.name] >= self.max_delivery_count:
                        self._move(path, self.deadletter_dir)
                        reason = f"{type(exc).__name__}: {exc}\n"
                        (self.deadletter_dir / f"{path.name}.reason.txt").write_text(reason)
                        report.dead_lettered += 1
                    else:
                        report.failed += 1
                continue
            for path, _ in bodies:
                self._move(path, self.heartbeats_dir / "processed")
                self.deliveries.pop(path.name, None)
            report.heartbeat_batches.append(result)

    def _deliver(
        self,
        path: Path,
        body: bytes,
        report: RunReport,
        retry: int = 0,
        enqueued: datetime | None = None,
    ) -> bool:
        with self._report_lock:
            self.deliveries[path.name] += 1
            count = self.deliveries[path.name]
        try:
            # The Event Grid stand-in's files play EVENTGRID_QUEUE (only the system topic
            # sends there); everything else is the documents queue, where relays send.
            if path.name.endswith(EVENT_GRID_SUFFIX):
                result = ingest_event_grid(body, self.pipeline, message_id=path.stem)
            else:
                result = ingest_message(
                    body, self.pipeline, message_id=path.stem, enqueued_at=enqueued
                )
        except Exception as exc:
            log.warning("delivery %d of %s failed: %s", count, path.name, exc)
            if is_outage(exc) and retry < MAX_RETRIES:
                # As functions.triggers.later does on Service Bus: a copy for later, the
                # original completed; an outage burns no deliveries.
                self._later(path, body, retry + 1, enqueued)
                with self._report_lock:
                    report.later += 1
                return True
            with self._report_lock:
                if count >= self.max_delivery_count:
                    self._move(path, self.deadletter_dir)
                    reason = f"{type(exc).__name__}: {exc}\n"
                    (self.deadletter_dir / f"{path.name}.reason.txt").write_text(reason)
                    report.dead_lettered += 1
                    # A message sent again under the same name (a relay's resend) is a
                    # new message: its deliveries count from one, as in Service Bus.
                    self.deliveries.pop(path.name, None)
                    self.enqueued.pop(path.name, None)
                    return True  # dead-lettered: the session moves on, as in Service Bus
                report.failed += 1
            return False
        self._move(path, self.processed_dir)
        with self._report_lock:
            self.deliveries.pop(path.name, None)
            self.enqueued.pop(path.name, None)
            report.results.append(result)
            if result.outcome == "processed":
                report.processed += 1
            elif result.outcome == "stale":
                report.stale += 1
            else:
                report.rejected += 1
        return True

    def _later(self, path: Path, body: bytes, retry: int, enqueued: datetime | None = None) -> None:
        """Write the `retry`-th copy of a message, visible after functions.triggers.later's
        delay (times `later_scale`: the demo's time runs faster), and complete the
        original. The copy is dated as the original was (`enqueued`)."""
        name = path.name
        suffix = EVENT_GRID_SUFFIX if name.endswith(EVENT_GRID_SUFFIX) else ".json"
        base = name[: -len(suffix)].split("~r", 1)[0]
        at = time.time() + delay(retry).total_seconds() * self.later_scale
        copy: dict[str, Any] = {
            "body": body.decode("utf-8", "replace"),
            "scheduled_at": at,
            "retry": retry,
        }
        if enqueued is not None:
            copy["enqueued_at"] = enqueued.isoformat()
        target = self.inbox / f"{base}~r{retry}{suffix}"
        temporary = self.inbox / f".{target.name}.tmp"
        temporary.write_text(json.dumps(copy))
        temporary.replace(target)
        self._move(path, self.processed_dir)
        with self._report_lock:
            self.deliveries.pop(path.name, None)
            self.enqueued.pop(path.name, None)

    @staticmethod
    def _move(path: Path, folder: Path) -> None:
        with contextlib.suppress(FileNotFoundError):
            path.replace(folder / path.name)

    def watchdog(self, wait_seconds: float = 0.0) -> WatchdogReport:
        """One sweep; its due events go to the workers. `wait_seconds`: wait that long at
        most for the workers to finish them (a test or the demo reading what they did)."""
        report = run_watchdog(self.pipeline)
        deadline = time.monotonic() + wait_seconds
        while wait_seconds and not self.work.idle() and time.monotonic() < deadline:
            time.sleep(0.02)
        return report

    # ---------------------------------------------------------------- forever

    def close(self, wait: bool = False) -> None:
        """Stop the work queue's workers (items running finish; `wait`: joined)."""
        self.work.close(wait=wait)

    def run_forever(self, stop: threading.Event, poll_seconds: float = 0.2) -> None:
        """Poll the inbox until `stop` is set; run the watchdog every interval."""
        next_watchdog = time.monotonic() + self.watchdog_interval
        while not stop.is_set():
            try:
                self.run_once()
                if time.monotonic() >= next_watchdog:
                    next_watchdog = time.monotonic() + self.watchdog_interval
                    self.watchdog()
                    # The identity sync timer's coverage pass (at most every 10 minutes;
                    # otherwise one point read): the fleet page's Coverage section.
                    run_coverage(self.pipeline, drain=self.drain_settings)
            except Stopped:  # its clock or session said the demo is stopping
                break
            except Exception:  # storage down for a moment: log, keep going
                log.exception("local host pass failed; retrying")
            stop.wait(poll_seconds)
        self.close()  # its workers go with it (a long-lived process starts many hosts)


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


def scheduled(raw: bytes) -> tuple[float | None, int]:
    """(when a copy scheduled for later becomes visible, its retry number); (None, 0) for a
    message as its sender wrote it."""
    if b"scheduled_at" not in raw:
        return None, 0
    try:
        data: Any = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None, 0
    if not isinstance(data, dict) or "kind" in data:
        return None, 0
    at = data.get("scheduled_at")
    retry = data.get("retry", 0)
    return (float(at) if isinstance(at, int | float) else None), (
        int(retry) if isinstance(retry, int) else 0
    )


def enqueued_in(raw: bytes) -> datetime | None:
    """When a wrapper says Service Bus first enqueued its message (a copy for later
    carries its original's: functions.triggers.later), else None."""
    if b"enqueued_at" not in raw:
        return None
    try:
        data: Any = json.loads(raw)
        value = data.get("enqueued_at") if isinstance(data, dict) and "kind" not in data else None
        return utc(datetime.fromisoformat(value)) if isinstance(value, str) else None
    except (UnicodeDecodeError, json.JSONDecodeError, ValueError):
        return None


def session_of(body: bytes) -> str:
    try:
        data = json.loads(body)
        vm = data["vm"]
        # Service Bus sessions are per vmId (the relay's SessionId); a name is only a claim.
        return str(vm.get("vm_id") or vm["name"]).casefold()
    except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError):
        return UNKNOWN_SESSION


__all__ = ["LocalHost", "LocalPublisher", "RunReport"]
