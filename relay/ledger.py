"""The impact ledger's on-VM half: what only the relay can see of an event (issue 33).

Azure tells in advance what an event will cost (NotBefore, DurationInSeconds); only the
guest sees what it did cost. Per event this VM forwards, on every successful poll:
- when the relay first saw it Started and when it left IMDS (guest wall clock);
- the longest time between two successful polls while it was listed (a Freeze pauses
  the guest, so its relay sees a gap), as the larger of the monotonic and the wall-clock
  interval: a guest whose clocks ran during the pause shows it in both, one whose clocks
  stood still shows it once its wall clock is set right;
- the net wall-clock jump, (wall delta - monotonic delta) summed over those polls: what
  the guest's wall clock was stepped by across the event (time sync after a Freeze).
Kept in memory only (a restarted relay measures from its restart, and says so in
`first_seen`) and bounded; document envelopes carry it as `ledger` (docs/contract.md).
"""

from __future__ import annotations

from datetime import datetime, timezone

from relay.models import format_aware

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

MAX_TRACKED = 32  # events followed at once; IMDS lists a handful
MAX_ENTRIES = 16  # entries one envelope carries (the app's bound: functions/model/envelope.py)
MAX_SECONDS = 10 * 366 * 86400.0  # a clock set years off is clipped, never refused


def _iso(wall: float) -> str:
    return format_aware(datetime.fromtimestamp(wall, timezone.utc))


def _clip(seconds: float) -> float:
    return round(max(-MAX_SECONDS, min(MAX_SECONDS, seconds)), 3)


class _Track:
    __slots__ = ("entry", "jump", "mono", "wall")

    def __init__(self, item: dict[str, Any], mono: float, wall: float) -> None:
        self.entry: dict[str, Any] = {
            "event_id": str(item.get("EventId"))[:128],
            "event_type": str(item.get("EventType"))[:64],
            "not_before": "",
            "duration_s": None,
            "first_seen": _iso(wall),
            "started_seen": None,
            "left_at": None,
            "max_poll_gap_s": 0.0,
            "wall_jump_s": 0.0,
            "polls": 0,
        }
        self.mono, self.wall, self.jump = mono, wall, 0.0


class Ledger:
    """Per-event measurements across polls; `observe` once per successful poll."""

    def __init__(self) -> None:
        self._tracks: dict[str, _Track] = {}
        self._left: list[dict[str, Any]] = []  # ended, not yet in a queued envelope

    def observe(self, events: list[Any], mono: float, wall: float) -> None:
        """One successful poll at (monotonic, wall) time that listed `events` (the raw
        IMDS entries this relay forwards). Events absent now have left."""
        listed = {}
        for item in events:
            if isinstance(item, dict) and isinstance(item.get("EventId"), str):
                listed[item["EventId"].casefold()] = item
        for key, track in list(self._tracks.items()):
            entry = track.entry
            step_mono, step_wall = mono - track.mono, wall - track.wall
            entry["max_poll_gap_s"] = _clip(max(entry["max_poll_gap_s"], step_mono, step_wall))
            track.jump += step_wall - step_mono
            entry["wall_jump_s"] = _clip(track.jump)
            entry["polls"] += 1
            track.mono, track.wall = mono, wall
            if key not in listed:
                entry["left_at"] = _iso(wall)
                self._left = [*self._left, entry][-MAX_ENTRIES:]
                del self._tracks[key]
        for key, item in listed.items():
            track = self._tracks.get(key)
            if track is None:
                if len(self._tracks) >= MAX_TRACKED:
                    continue
                track = self._tracks[key] = _Track(item, mono, wall)
            entry = track.entry
            if item.get("EventStatus") == "Started":
                entry["started_seen"] = entry["started_seen"] or _iso(wall)
            elif isinstance(item.get("NotBefore"), str) and item["NotBefore"]:
                entry["not_before"] = item["NotBefore"][:64]
            duration = item.get("DurationInSeconds")
            if type(duration) is int and -1 <= duration <= 2**31:
                entry["duration_s"] = duration

    def entries(self) -> list[dict[str, Any]]:
        """What the next document envelope carries: the events that left since the last
        one was queued, then those listed now (copies, at most MAX_ENTRIES)."""
        current = [dict(t.entry) for t in self._tracks.values()]
        return [dict(e) for e in self._left + current][:MAX_ENTRIES]

    def queued(self) -> None:
        """A document envelope with `entries()` is in the outbox: the ended ones are told."""
        self._left = []
