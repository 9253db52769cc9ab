"""The poll loop: read IMDS about once a second and queue every changed document.

Change detection is two-step to stay cheap at one poll a second: identical bytes mean
nothing changed (no JSON parsing at all); different bytes are parsed and compared on
`DocumentIncarnation` and a content hash, so a re-serialised but equal document is not
forwarded twice, while a content change under the same incarnation still is.

By default only the events naming this VM are forwarded (contract C2): every VM of an
availability set sees its neighbours' events, and forwarding those from each VM multiplies
messages by the set's size. Change detection then ignores `DocumentIncarnation`, so a
change to another VM's event sends nothing.

Nothing IMDS sends may stop the loop: an answer that is not a document is an error kind
logged once per streak, a time Python cannot represent is forwarded as written and
logged, and any unexpected failure is logged and the next poll goes on.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import datetime, timezone

from relay import __version__
from relay.attest import MAX_MESSAGE_BYTES
from relay.imds import ImdsClient, ImdsError, parse_events
from relay.logs import ErrorStreak, event, jitter
from relay.models import Envelope, VmRef, content_hash, only_events_for
from relay.outbox import Outbox, OutboxError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from relay.keystore import KeyStore

# A document whose envelope is larger cannot go out with its attestation and key (§8).
MAX_DOCUMENT_ENVELOPE = MAX_MESSAGE_BYTES - 16 * 1024

log = logging.getLogger("relay.watcher")


class Watcher:
    def __init__(
        self,
        imds: ImdsClient,
        outbox: Outbox,
        vm: VmRef,
        poll_interval: float = 1.0,
        heartbeat_interval: float = 300.0,
        timeout: float = 5.0,
        first_timeout: float = 120.0,
        max_backoff: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
        stop: threading.Event | None = None,
        forward_all_events: bool = False,
        keys: KeyStore | None = None,
    ) -> None:
        self.forward_all_events = forward_all_events
        self.keys = keys
        self._unforwardable: tuple[Any, ...] | None = None
        self.imds = imds
        self.outbox = outbox
        self.vm = vm
        self.poll_interval = poll_interval
        self.heartbeat_interval = heartbeat_interval
        self.timeout = timeout
        self.first_timeout = first_timeout
        self.max_backoff = max_backoff
        self._clock = clock
        self._stop = stop or threading.Event()
        self.streak = ErrorStreak(log, "IMDS")
        self._outbox_streak = ErrorStreak(log, "outbox")
        self._ever_answered = False
        self._last_raw: bytes | None = None
        self._last_key: tuple[int | None, str] | None = None
        self._unreadable_times: set[str] = set()
        self._failures = 0
        self._next_heartbeat = clock() + heartbeat_interval
        self.last_success: float | None = None
        # The impact ledger's on-VM half (issue 33, docs/contract.md §10): the (monotonic,
        # wall) time of the last successful poll, and since the last document the longest
        # time between two successful polls and the net wall-clock jump (see _clocks).
        self._polled: tuple[float, float] | None = None
        self._gap = self._jump = 0.0
        self.documents = 0
        self.heartbeats = 0
        self.started: tuple[str, ...] = ()  # EventIds naming this VM that are Started

    @property
    def healthy(self) -> bool:
        return self._ever_answered and not self.streak.failing

    def stop(self) -> None:
        self._stop.set()

    def run(self) -> None:
        event(
            log,
            logging.INFO,
            "watching IMDS scheduled events",
            vm=self.vm.name,
            url=self.imds.events_url,
            poll_interval=self.poll_interval,
        )
        while not self._stop.is_set():
            started = self._clock()
            delay = self.poll_once()
            self._heartbeat_if_due()
            remaining = delay - (self._clock() - started)
            remaining = min(remaining, max(self._next_heartbeat - self._clock(), 0.0))
            if remaining > 0:
                self._stop.wait(remaining)

    def poll_once(self) -> float:
        """One poll; returns how long after its start the next one should begin."""
        timeout = self.timeout if self._ever_answered else self.first_timeout
        if self.keys is not None and self.keys.rotate_if_due():
            # The app learns a new key from the next message: send the document again now
            # (its MessageId names the key, so it is not taken for a duplicate).
            self._last_raw = self._last_key = None
        try:
            raw = self.imds.get_events_raw(timeout=timeout)
            self._clocks(self._clock(), time.time())
            if raw != self._last_raw:
                data, document = parse_events(raw)
                self._note_unreadable_times(document)
                self.started = tuple(  # for the readiness probe (relay.ready)
                    e.event_id for e in document.events if e.is_started and e.affects(self.vm.name)
                )
                if self.forward_all_events:
                    key: tuple[int | None, str] = (
                        document.document_incarnation,
                        content_hash(data),
                    )
                else:
                    data = only_events_for(data, self.vm.name)
                    key = (None, content_hash({**data, "DocumentIncarnation": None}))
                if key != self._last_key:
                    self._queue_document(data)
                    self._last_key = key
                self._last_raw = raw
        except ImdsError as exc:
            self._failures += 1
            self.streak.error(exc.kind, str(exc))
            if exc.kind == "too-large":
                self._queue_unforwardable(None, exc.size, "IMDS answer over the relay's read limit")
            backoff = min(self.max_backoff, self.poll_interval * 2 ** min(self._failures - 1, 10))
            return backoff * jitter(0.75, 1.25)
        except OutboxError as exc:
            # The document stays unqueued; the next poll sees it as new and tries again.
            self._outbox_streak.error("write", str(exc), level=logging.ERROR)
            return self.poll_interval
        except Exception as exc:  # never let one odd answer end the relay
            self._failures += 1
            log.debug("unexpected failure in a poll", exc_info=True)
            self.streak.error("internal", f"{type(exc).__name__}: {exc}", level=logging.ERROR)
            return min(self.max_backoff, self.poll_interval * 2 ** min(self._failures - 1, 10))
        self._ever_answered = True
        self._failures = 0
        self.last_success = self._clock()
        self.streak.ok()
        self._outbox_streak.ok()
        return self.poll_interval

    def _clocks(self, mono: float, wall: float) -> None:
        """A successful poll at (monotonic, wall) time. What only the guest sees of an
        event: a Freeze pauses it, so its relay sees a gap between two polls, the larger of
        the monotonic and the wall-clock interval (a guest whose clocks ran during the
        pause shows it in both; one whose clocks stood still shows it once its wall clock
        is set right); the wall clock's jump against the monotonic one is how far time sync
        stepped it. The next document carries both, since the document before it, so every
        interval belongs to the events the previous document listed (the app keeps them
        per event and VM, functions/ledger.py). Written small: every byte of the relay is
        in each VM's customData."""
        if self._polled:
            step_mono, step_wall = mono - self._polled[0], wall - self._polled[1]
            self._gap = max(self._gap, step_mono, step_wall)
            self._jump += step_wall - step_mono
        self._polled = mono, wall

    def _note_unreadable_times(self, document: Any) -> None:
        """Log (once per event) a time Python cannot represent; the document still goes."""
        for event_id in document.unreadable_times():
            if event_id not in self._unreadable_times:
                self._unreadable_times.add(event_id)
                event(
                    log,
                    logging.WARNING,
                    "an event's NotBefore is not a time this relay can read; "
                    "forwarding the document as IMDS wrote it",
                    event_id=event_id,
                )

    def _envelope(self, kind: str, document: dict[str, Any] | None, **extra: Any) -> Envelope:
        return Envelope(
            kind=kind,
            vm=self.vm,
            relay_version=__version__,
            sequence=0,  # the outbox stamps the real one
            observed_at=datetime.now(timezone.utc),
            document=document,
            events=None if document is None else ("all" if self.forward_all_events else "own"),
            extra=extra,
        )

    def _queue_unforwardable(self, incarnation: Any, size: int | None, reason: str) -> None:
        """Contract §8: say (attested) what could not be forwarded, once per case."""
        case = (incarnation, size, reason)
        if case == self._unforwardable:
            return
        detail = {"incarnation": incarnation, "bytes": size, "reason": reason}
        event(log, logging.ERROR, "a document cannot be forwarded; sending a notice", **detail)
        try:
            self.outbox.append(self._envelope("unforwardable", None, unforwardable=detail))
        except OutboxError as exc:
            self._outbox_streak.error("write", str(exc), level=logging.ERROR)
            return
        self._unforwardable = case

    def _queue_document(self, data: dict[str, Any]) -> None:
        polls = {"max_gap_s": round(self._gap, 3), "wall_jump_s": round(self._jump, 3)}
        envelope = self._envelope("document", data, polls=polls)
        size = len(envelope.to_json().encode())
        if size > MAX_DOCUMENT_ENVELOPE:
            incarnation = data.get("DocumentIncarnation")
            self._queue_unforwardable(incarnation, size, "too large for a Service Bus message")
            return
        message = self.outbox.append(envelope)
        self._gap = self._jump = 0.0
        self.documents += 1
        events = data.get("Events") or []
        event(
            log,
            logging.INFO,
            "document changed",
            incarnation=data.get("DocumentIncarnation"),
            events=len(events),
            sequence=message.sequence if message else None,
        )

    def _heartbeat_if_due(self) -> None:
        now = self._clock()
        if now < self._next_heartbeat:
            return
        self._next_heartbeat += self.heartbeat_interval
        if self._next_heartbeat <= now:  # fell behind (suspended VM): no burst of catch-ups
            self._next_heartbeat = now + self.heartbeat_interval
        try:
            self.outbox.append(
                self._envelope(
                    "heartbeat",
                    None,
                    imds_healthy=self.healthy,
                    imds_error=self.streak.last_error,
                    outbox_pending=len(self.outbox),
                )
            )
            self.heartbeats += 1
        except OutboxError as exc:
            self._outbox_streak.error("write", f"heartbeat: {exc}", level=logging.ERROR)
