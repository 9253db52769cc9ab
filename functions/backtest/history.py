"""What happened to each past event, read from one of three sources, as `Past` records.

Each source knows different things, and a `Past` says which it knew (None = unknown):

- the events table (functions.store): the bridge's record of every event still kept
  (ended events until retention deletes them): first seen, the decision and when it was
  made, the approval attempts, the end; the fields are the event's first view, as decided;
- Resource Graph `maintenanceresources` (Microsoft's "Scheduled Events in Azure Resource
  Graph"): one row per event with its latest state (EventStatus Scheduled, Started,
  Completed or Canceled; NotBefore blank once Started), owner in the row's ARM id; no
  decision and no first-seen time, so such an event is decided as at its NotBefore;
- the relays' envelopes (relay/outbox, the demo's inbox/processed): every document each VM
  saw with its time, so first seen, Started and gone are known to the poll; the outcome
  is read from the documents (started before NotBefore = somebody approved it).

A record a loader cannot use is never dropped silently: it becomes a `Skipped` with the
reason, which the command prints (and counts in its exit code).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from functions.model.envelope import (
    SCHEDULED,
    STARTED,
    DocumentError,
    ScheduledEvent,
    parse_envelope,
)

GRAPH_TYPE = "microsoft.maintenance/scheduledevents"
_OWNER = re.compile(
    r"/providers/microsoft\.compute/(?P<kind>virtualmachines|virtualmachinescalesets|"
    r"availabilitysets)/(?P<name>[^/]+)/providers/microsoft\.maintenance/scheduledevents/",
    re.IGNORECASE,
)
MAX_INPUT_BYTES = 256 * 1024 * 1024  # one export or envelope file; bigger is a mistake


class HistoryError(ValueError):
    """The input as a whole cannot be read (not JSON, wrong shape, unreachable table)."""


@dataclass(frozen=True)
class Skipped:
    where: str  # a file, a row index, an EventId
    reason: str
    error: bool = True  # False: left out on purpose (rows of another type), said all the same


@dataclass(frozen=True)
class View:
    """One distinct view of an event (functions.store.records.ViewDecision) as the policy
    reads it, with the scale set of the VM that first reported it (Azure's fact)."""

    event: ScheduledEvent
    scale_sets: tuple[str, ...]
    first_vm: str


@dataclass(frozen=True)
class Past:
    """One past event: what a decision reads, and what really happened."""

    event: ScheduledEvent  # as first seen Scheduled (the view the bridge decided on)
    source: str  # "table", "graph", "documents"
    first_seen: datetime | None  # None: the source does not say (Resource Graph)
    scale_sets: tuple[str, ...] = ()
    availability_sets: tuple[str, ...] = ()
    no_notice: bool = False  # first seen already Started: nothing to decide
    started_at: datetime | None = None  # when its impact began, if known
    ended_at: datetime | None = None  # when it left IMDS (or Azure said it ended)
    end: str = ""  # "completed", "cancelled", "" (open, or not known)
    actual_action: str | None = None  # the bridge's decision (table only)
    actual_rule: str | None = None
    actual: str = ""  # in words: what was decided, or what the record shows happened
    decided_at: datetime | None = None  # when the bridge decided (table only)
    # The events table's distinct views of the event, each as its reporters saw it: the
    # bridge decides each and acts on the strictest, and so does the replay.
    views: tuple[View, ...] = ()

    @property
    def event_id(self) -> str:
        return self.event.event_id


def scheduled_copy(event: ScheduledEvent, **changes: Any) -> ScheduledEvent:
    """`event` as it was while Scheduled (the status rules may match on)."""
    return event.model_copy(update={"event_status": SCHEDULED, **changes})


def span(seconds: float) -> str:
    """A duration as an operator reads it (s, min or h), in the history and the report."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


# --------------------------------------------------------------------------- Resource Graph


def read_json(path: str, what: str) -> Any:
    """JSON from a file (or - for stdin), with an error that names the file and the cause."""
    import sys

    try:
        if path == "-":
            raw = sys.stdin.read(MAX_INPUT_BYTES + 1)
        else:
            file = Path(path)
            if file.is_dir():
                raise HistoryError(f"{path}: a directory; {what} is one JSON file")
            if file.stat().st_size > MAX_INPUT_BYTES:
                raise HistoryError(f"{path}: larger than {MAX_INPUT_BYTES >> 20} MiB")
            raw = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise HistoryError(f"{path}: {exc}") from None
    if len(raw) > MAX_INPUT_BYTES:
        raise HistoryError(f"{path}: larger than {MAX_INPUT_BYTES >> 20} MiB")
    try:
        return json.loads(raw)
    except json.JSONDecodeError as exc:
        raise HistoryError(f"{path}: not JSON: {exc}") from None


def graph_rows(data: Any, path: str) -> list[Any]:
    """The rows of an export: `az graph query` writes {"count", "data": [rows], ...}; the
    REST API's table format {"data": {"columns", "rows"}}; a bare list of rows too."""
    if isinstance(data, dict) and "data" in data:
        data = data["data"]
        if isinstance(data, dict) and isinstance(data.get("columns"), list):
            names = [c.get("name") if isinstance(c, dict) else None for c in data["columns"]]
            rows = data.get("rows")
            if not isinstance(rows, list) or any(not isinstance(r, list) for r in rows):
                raise HistoryError(f"{path}: table format without a list of rows")
            return [dict(zip(names, row, strict=False)) for row in rows]
    if not isinstance(data, list):
        raise HistoryError(
            f"{path}: not a Resource Graph result: expected `az graph query` output "
            '({"data": [...]}) or a list of rows'
        )
    return data


def from_graph(path: str, since: datetime) -> tuple[list[Past], list[Skipped]]:
    """Each `microsoft.maintenance/scheduledevents` row of an exported query result."""
    rows = graph_rows(read_json(path, "a Resource Graph result"), path)
    pasts: list[Past] = []
    skipped: list[Skipped] = []
    others = 0
    for index, row in enumerate(rows):
        where = f"{path} row {index}"
        if not isinstance(row, dict):
            skipped.append(Skipped(where, "not a JSON object"))
            continue
        kind = row.get("type")
        if not isinstance(kind, str) or kind.casefold() != GRAPH_TYPE:
            others += 1
            continue
        try:
            past = _from_graph_row(row)
        except (ValidationError, ValueError, TypeError) as exc:
            skipped.append(Skipped(where, f"not a scheduled event row: {_short(exc)}"))
            continue
        moment = past.event.not_before
        if moment is not None and moment < since:
            continue
        pasts.append(past)
    if others:
        note = f"{others} row(s) of another type than {GRAPH_TYPE}, left out"
        skipped.append(Skipped(path, note, error=False))
    return pasts, skipped


def _from_graph_row(row: dict[str, Any]) -> Past:
    props = row.get("properties")
    if not isinstance(props, dict):
        raise ValueError("no `properties` object")
    status = props.get("EventStatus")
    event = ScheduledEvent.model_validate(props)
    given = row.get("id")
    arm_id = given if isinstance(given, str) else ""
    owner = _OWNER.search(arm_id)
    scale_sets: tuple[str, ...] = ()
    availability_sets: tuple[str, ...] = ()
    if owner is not None:
        kind = owner["kind"].casefold()
        if kind == "virtualmachinescalesets":
            scale_sets = (owner["name"],)
        elif kind == "availabilitysets":
            availability_sets = (owner["name"],)
    end = {"completed": "completed", "canceled": "cancelled"}.get(str(status).casefold(), "")
    return Past(
        event=scheduled_copy(event),
        source="graph",
        first_seen=None,
        scale_sets=scale_sets,
        availability_sets=availability_sets,
        no_notice=str(status) == STARTED and event.not_before is None,
        end=end,
        actual=f"Azure's record: {status} (Resource Graph keeps no decision)",
    )


def _short(exc: Exception) -> str:
    text = str(exc).splitlines()
    return "; ".join(line.strip() for line in text[:3])[:300]


# --------------------------------------------------------------------------- relay envelopes


def envelope_objects(paths: Iterable[str]) -> Iterator[tuple[str, Any]]:
    """(where, object) for each JSON object in the files: a directory's *.json files (all
    levels, sorted), each a JSON object, a list of them, or JSON Lines."""
    for given in paths:
        root = Path(given)
        if not root.exists():
            raise HistoryError(f"{given}: no such file or directory")
        files = sorted(root.rglob("*.json")) if root.is_dir() else [root]
        if root.is_dir() and not files:
            raise HistoryError(f"{given}: no *.json files in this directory")
        for file in files:
            yield from _objects_of(file)


def _objects_of(file: Path) -> Iterator[tuple[str, Any]]:
    try:
        if file.stat().st_size > MAX_INPUT_BYTES:
            raise HistoryError(f"{file}: larger than {MAX_INPUT_BYTES >> 20} MiB")
        raw = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise HistoryError(f"{file}: {exc}") from None
    try:
        data = json.loads(raw)
    except json.JSONDecodeError:
        for number, line in enumerate(raw.splitlines(), 1):
            if not line.strip():
                continue
            try:
                yield f"{file}:{number}", json.loads(line)
            except json.JSONDecodeError as exc:
                yield f"{file}:{number}", HistoryError(f"not JSON: {exc}")
        return
    if isinstance(data, list):
        for index, item in enumerate(data):
            yield f"{file}[{index}]", item
    else:
        yield str(file), data


def _event_grid(item: Any) -> bool:
    """An Event Grid notification (either schema), or a batch of them."""
    if isinstance(item, list):
        return bool(item) and all(_event_grid(i) for i in item)
    return isinstance(item, dict) and ("eventType" in item or "specversion" in item)


@dataclass
class _Seen:
    """One event as the envelopes show it, built up document by document."""

    first: ScheduledEvent
    first_seen: datetime
    scheduled: ScheduledEvent | None
    started_at: datetime | None = None
    last_listed: dict[str, datetime] | None = None  # VM -> last document listing it
    gone: dict[str, datetime] | None = None  # VM -> first later document without it


def from_documents(paths: Iterable[str], since: datetime) -> tuple[list[Past], list[Skipped]]:
    """Events from relay envelopes (kind `document`); heartbeats and the like are ignored.
    A bare IMDS document is refused: without its envelope it has no time and no VM."""
    skipped: list[Skipped] = []
    envelopes = []
    for where, item in envelope_objects(paths):
        if isinstance(item, HistoryError):
            skipped.append(Skipped(where, str(item)))
            continue
        if _event_grid(item):
            note = (
                "an Event Grid notification, not a relay envelope: left out (the events "
                "table has what the bridge made of it)"
            )
            skipped.append(Skipped(where, note, error=False))
            continue
        if isinstance(item, dict) and "Events" in item and "kind" not in item:
            skipped.append(
                Skipped(
                    where,
                    "a bare IMDS document has no time and no VM: give the relay's envelopes "
                    "(its outbox files, or the demo's inbox/processed)",
                )
            )
            continue
        try:
            envelope = parse_envelope(item if isinstance(item, dict) else {"": item})
        except DocumentError as exc:
            skipped.append(Skipped(where, str(exc)[:300]))
            continue
        if envelope.kind == "document" and envelope.scheduled_events is not None:
            envelopes.append(envelope)
    envelopes.sort(key=lambda e: (e.observed_at, e.vm.name, e.sequence))
    seen: dict[str, _Seen] = {}
    sets: dict[str, tuple[str | None, str | None]] = {}  # VM (folded) -> its sets
    for envelope in envelopes:
        vm = envelope.vm.name.casefold()
        sets[vm] = (envelope.vm.scale_set, envelope.vm.availability_set)
        listed = set()
        document = envelope.scheduled_events
        assert document is not None
        for event in document.events:
            key = event.event_id.casefold()
            listed.add(key)
            track = seen.get(key)
            if track is None:
                first = event
                scheduled = event if event.event_status == SCHEDULED else None
                track = seen[key] = _Seen(first, envelope.observed_at, scheduled, None, {}, {})
            elif track.scheduled is None and event.event_status == SCHEDULED:
                track.scheduled = event
            if event.event_status == STARTED and track.started_at is None:
                track.started_at = envelope.observed_at
            assert track.last_listed is not None and track.gone is not None
            track.last_listed[vm] = envelope.observed_at
            track.gone.pop(vm, None)
        for key, track in seen.items():
            assert track.last_listed is not None and track.gone is not None
            if key not in listed and vm in track.last_listed and vm not in track.gone:
                track.gone[vm] = envelope.observed_at
    pasts = []
    for track in seen.values():
        if track.first_seen < since:
            continue
        pasts.append(_from_seen(track, sets))
    return pasts, skipped


def _from_seen(track: _Seen, sets: dict[str, tuple[str | None, str | None]]) -> Past:
    assert track.last_listed is not None and track.gone is not None
    event = track.scheduled or track.first
    named = {name.casefold() for name in event.resources}
    reporters = [vm for vm in track.last_listed if vm in named] or list(track.last_listed)
    scale_sets = sorted({s for vm in reporters if (s := sets.get(vm, (None, None))[0])})
    availability_sets = sorted({a for vm in reporters if (a := sets.get(vm, (None, None))[1])})
    over = all(vm in track.gone for vm in track.last_listed)
    ended_at = max(track.gone.values()) if over and track.gone else None
    end = ""
    if ended_at is not None:
        end = "completed" if track.started_at is not None else "cancelled"
    not_before = event.not_before
    if track.scheduled is None:
        actual = "first seen Started: no notice, nothing to decide"
    elif track.started_at is not None and not_before is not None:
        early = (not_before - track.started_at).total_seconds()
        if early > 1:
            actual = f"started {span(early)} before NotBefore: approved"
        else:
            actual = "started at NotBefore: not approved (held, or nobody acted)"
    elif end == "cancelled":
        actual = "cancelled: Azure withdrew it before it started"
    else:
        actual = "still Scheduled at the end of the record"
    if end and track.started_at is not None:
        actual += f", over {span((ended_at - track.started_at).total_seconds())} later"  # type: ignore[operator]
    return Past(
        event=scheduled_copy(event) if track.scheduled is None else event,
        source="documents",
        first_seen=track.first_seen,
        scale_sets=tuple(scale_sets),
        availability_sets=tuple(availability_sets),
        no_notice=track.scheduled is None,
        started_at=track.started_at,
        ended_at=ended_at,
        end=end,
        actual=actual,
    )


def parse_since(text: str, now: datetime) -> datetime:
    """`30d`, `12h`, `90m` before `now`, or an ISO date/time (UTC unless it says)."""
    match = re.fullmatch(r"\s*(\d{1,6})\s*([dhm])\s*", text)
    if match:
        amount, unit = int(match[1]), match[2]
        delta = {"d": timedelta(days=amount), "h": timedelta(hours=amount)}.get(
            unit, timedelta(minutes=amount)
        )
        return now - delta
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise HistoryError(
            f"--since {text!r}: not a span like 30d, 12h or 90m, nor an ISO date like 2026-11-01"
        ) from None
    if moment.tzinfo is None:
        from datetime import UTC

        moment = moment.replace(tzinfo=UTC)
    return moment
