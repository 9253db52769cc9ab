"""Ground truth for the demo: every VM's Scheduled Events document and every StartRequests
IMDS received, read from the simulator itself (not through a relay)."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from functions.model.envelope import STARTED, parse_document, parse_not_before
from local.plan import Step
from local.report import Timeline, short_id


@dataclass
class EventTrack:
    """One EventId as the simulator's documents showed it, fleet-wide."""

    event_id: str
    event_type: str
    source: str | None
    duration: int | None
    resources: tuple[str, ...]
    description: str | None
    first_seen: float  # seconds since the demo started
    first_seen_wall: datetime
    first_status: str
    not_before: datetime | None
    reported_by: set[str] = field(default_factory=set)
    started_at: float | None = None  # seconds
    started_wall: datetime | None = None
    removed_at: float | None = None
    step: Step | None = None

    @property
    def what(self) -> str:
        if self.event_type == "Freeze" and self.duration is not None and self.duration >= 0:
            return f"Freeze {self.duration} s"
        return self.event_type


class FleetWatcher:
    """Follows every VM's Scheduled Events document and the StartRequests IMDS received.

    It listens to the simulator itself (not through a relay), so what it prints is the
    ground truth the relays and functions are judged against, timed to the moment each
    document changed.
    """

    def __init__(
        self,
        sim: Any,
        timeline: Timeline,
        on_new: Callable[[EventTrack], None] | None = None,
    ) -> None:
        self.sim = sim
        self.timeline = timeline
        self.on_new = on_new
        self.events: dict[str, EventTrack] = {}
        self.approvals: list[Any] = []
        self._documents: dict[str, dict[str, Any]] = {}
        self._changes: queue.SimpleQueue[tuple[str, dict[str, Any]]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fleet-watcher", daemon=True)

    def start(self) -> FleetWatcher:
        for vm in self.sim.vm_names:
            self._documents[vm] = self.sim.document(vm)
        # Called under the simulator's lock: only queue, never block.
        self.sim.subscribe(lambda vm, _incarnation, doc: self._changes.put((vm, doc)))
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def active(self) -> list[EventTrack]:
        with self._lock:
            return [e for e in self.events.values() if e.removed_at is None]

    def snapshot(self) -> dict[str, EventTrack]:
        with self._lock:
            return dict(self.events)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                vm, document = self._changes.get(timeout=0.05)
            except queue.Empty:
                self._approvals()
                continue
            # One simulator tick changes several VMs' documents back to back: take them all
            # before comparing, so an event moving between VMs is not reported as removed.
            self._documents[vm] = document
            time.sleep(0.005)
            while True:
                try:
                    vm, document = self._changes.get_nowait()
                except queue.Empty:
                    break
                self._documents[vm] = document
            self._approvals()  # an approval is what made an event start: tell it first
            try:
                self._update()
            except Exception as exc:  # keep watching; a malformed document is itself news
                self.timeline.add("demo", "watcher", f"cannot read a document: {exc}", ok=False)

    def _approvals(self) -> None:
        known = len(self.approvals)
        fresh = self.sim.approvals[known:]
        for approval in fresh:
            self.approvals.append(approval)
            track = self.events.get(approval.event_id)
            when = ""
            if track is not None and track.not_before is not None:
                lead = (track.not_before - approval.at).total_seconds()
                when = f", {lead:.1f} s before NotBefore"
            counted = "" if approval.counted else " (not named in the event: does not count)"
            self.timeline.add(
                "approve",
                short_id(approval.event_id),
                (
                    f"Resource Manager acknowledged it on {approval.vm.removeprefix('arm:')}{when}"
                    if approval.vm.startswith("arm:")
                    else f"IMDS received StartRequests from {approval.vm}{when}{counted}"
                ),
            )

    def _update(self) -> None:
        now, wall = self.timeline.seconds(), datetime.now(UTC)
        seen: dict[str, dict[str, Any]] = {}
        reporters: dict[str, set[str]] = {}
        for vm, raw in self._documents.items():
            for event in parse_document(raw).events:
                entry = next(e for e in raw["Events"] if e.get("EventId") == event.event_id)
                if event.event_id not in seen or event.is_started:
                    seen[event.event_id] = entry
                reporters.setdefault(event.event_id, set()).add(vm)
        for event_id, raw in seen.items():
            status = raw.get("EventStatus", "?")
            with self._lock:
                track = self.events.get(event_id)
                new = track is None
                if track is None:
                    track = EventTrack(
                        event_id=event_id,
                        event_type=raw.get("EventType", "?"),
                        source=raw.get("EventSource"),
                        duration=raw.get("DurationInSeconds"),
                        resources=tuple(raw.get("Resources") or ()),
                        description=raw.get("Description"),
                        first_seen=now,
                        first_seen_wall=wall,
                        first_status=status,
                        not_before=parse_not_before(raw.get("NotBefore")),
                    )
                    self.events[event_id] = track
                track.reported_by |= reporters[event_id]
                started_now = status == STARTED and track.started_at is None
                if started_now:
                    track.started_at, track.started_wall = now, wall
            if new:
                if self.on_new is not None:
                    self.on_new(track)
                self.timeline.add("imds", short_id(event_id), describe_new(track))
            elif started_now:
                self.timeline.add("imds", short_id(event_id), f"{track.what} is now Started")
        for track in self.active():
            if track.event_id not in seen:
                with self._lock:
                    track.removed_at = now
                ending = "it is over" if track.started_at is not None else "it never started"
                self.timeline.add(
                    "imds",
                    short_id(track.event_id),
                    f"{track.what} removed from the documents: {ending}",
                )


def describe_new(track: EventTrack) -> str:
    parts = [f"{track.what} ({track.source or 'unknown source'}) {track.first_status}"]
    parts.append(f"for {', '.join(track.resources) or 'no VM named'}")
    if track.not_before is not None:
        left = (track.not_before - track.first_seen_wall).total_seconds()
        parts.append(f"NotBefore in {left:.1f} s")
    others = sorted(track.reported_by - set(track.resources))
    if others:
        parts.append(f"also in the documents of {', '.join(others)}")
    return ", ".join(parts)
