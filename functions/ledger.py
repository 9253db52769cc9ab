"""The impact ledger (issue 33): per event and VM, what Azure advertised beside what happened.

Azure's Resource Graph keeps only the advertised fields (NotBefore, DurationInSeconds);
what a live migration really cost a VM is known only inside it. Its relay measures its
polling (relay/watcher.py `_clocks`) and each document carries it (`Envelope.polls`,
contract §10); ingest keeps, in the reporter row writes it makes anyway, what the
documents that show an event Started and gone say (`measured`). This module puts
them beside the event row's facts (advertised times, the approval) and derives the rest:
- `start_delay_s`: from the approval (or NotBefore, when the event was not approved) to
  when the VM's relay first saw it Started;
- `started_for_s`: from then until the event left the VM's IMDS;
- `max_poll_gap_s` and `wall_jump_s`, as the relay measured them.
Shown on the event page, in `/api/status` and the demo report; exported as JSON or CSV
(`python -m functions ledger EVENT_ID [--csv]`, `GET /api/events/{id}/ledger`).
"""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any, Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict

from functions.model.envelope import LedgerEntry, PollClocks
from functions.store.records import EventRecord


class LedgerLine(BaseModel):
    """One VM's line of an event's ledger; None where nothing was measured or derivable."""

    model_config = ConfigDict(frozen=True)

    event_id: str
    event_type: str
    vm: str
    # What Azure advertised (the event row: the last NotBefore before it started).
    not_before: AwareDatetime | None = None
    duration_s: int | None = None
    # What the bridge did and what the VM's relay saw (guest wall clock).
    approved_at: AwareDatetime | None = None
    approved_by: str | None = None
    started_seen: AwareDatetime | None = None
    left_at: AwareDatetime | None = None
    # Derived and measured, in seconds.
    start_delay_s: float | None = None
    start_delay_from: Literal["approval", "NotBefore"] | None = None
    started_for_s: float | None = None
    max_poll_gap_s: float | None = None
    wall_jump_s: float | None = None
    measured: bool = False  # False: this VM's relay sent no measurements (old relay, none)
    # Why what its row holds cannot be read (out of bounds, or made up); None when it can.
    unreadable: str | None = None


FIELDS = tuple(LedgerLine.model_fields)


def measured(
    event_id: str,
    observed_at: datetime,
    polls: PollClocks | None,
    *,
    started: bool = False,
    left: bool = False,
    new: bool = False,
) -> LedgerEntry | None:
    """What one document says of one event, for its VM's reporter row: the document that
    shows it Started (`started_seen`) or the one without it (`left_at`), each with the
    relay's polling since its previous document (that interval belongs to the events the
    previous one listed; none for an event `new` to this VM). None for any other document
    or a relay that sends no clocks (before issue 33). `observed_at`, `polls`: the
    document's."""
    if polls is None or not (started or left):
        return None
    return LedgerEntry(
        event_id=event_id,
        started_seen=observed_at if started else None,
        left_at=observed_at if left else None,
        max_poll_gap_s=0.0 if new else polls.max_gap_s,
        wall_jump_s=0.0 if new else polls.wall_jump_s,
    )


def combined(parts: list[LedgerEntry]) -> LedgerEntry | None:
    """The reporter row's two parts (as it Started, as it left) as one: the longest gap of
    either period, the jumps added up."""
    if len(parts) < 2:
        return parts[0] if parts else None
    start, end = parts
    return LedgerEntry(
        event_id=start.event_id,
        started_seen=start.started_seen,
        left_at=end.left_at,
        max_poll_gap_s=max(start.max_poll_gap_s, end.max_poll_gap_s),
        wall_jump_s=round(start.wall_jump_s + end.wall_jump_s, 3),
    )


def approval_of(record: EventRecord) -> tuple[datetime | None, str | None]:
    """When (and by whom) the event was approved: its last attempt, the one that succeeded
    (nothing is tried after an approval; a relay's says "approved", Resource Manager's
    its answer), as the event page's timeline marks it."""
    if record.approval != "approved":
        return None, None
    if not record.approval_attempts:
        return None, record.approved_by
    last = record.approval_attempts[-1]
    return last.at, record.approved_by or last.by


def _seconds(later: datetime | None, earlier: datetime | None) -> float | None:
    if later is None or earlier is None:
        return None
    return round((later - earlier).total_seconds(), 3)


def ledger_line(
    record: EventRecord, vm: str, entry: LedgerEntry | None, unreadable: str | None = None
) -> LedgerLine:
    """One VM's line: the event row's facts, its relay's measurements (or why they cannot
    be read), what follows."""
    approved_at, approved_by = approval_of(record)
    not_before = record.not_before
    started = entry.started_seen if entry else None
    origin = approved_at or not_before
    return LedgerLine(
        event_id=record.event_id,
        event_type=record.event_type,
        vm=vm,
        not_before=not_before,
        duration_s=record.duration_in_seconds,
        approved_at=approved_at,
        approved_by=approved_by,
        started_seen=started,
        left_at=entry.left_at if entry else None,
        start_delay_s=_seconds(started, origin),
        start_delay_from=(
            ("approval" if approved_at else "NotBefore") if origin and started else None
        ),
        started_for_s=_seconds(entry.left_at if entry else None, started),
        max_poll_gap_s=entry.max_poll_gap_s if entry else None,
        wall_jump_s=entry.wall_jump_s if entry else None,
        measured=entry is not None,
        unreadable=unreadable if entry is None else None,
    )


def ledger_lines(
    record: EventRecord,
    entries: Mapping[str, LedgerEntry],
    vms: Iterable[str] = (),
    unreadable: Mapping[str, str] | None = None,
) -> list[LedgerLine]:
    """The event's ledger: a line per VM that measured it or reported it (`vms`), by name;
    a VM whose measurements cannot be read (`unreadable`: VM -> why) has a line saying so."""
    unreadable = unreadable or {}
    names = {vm.casefold(): vm for vm in [*vms, *entries, *unreadable]}
    by_fold = {vm.casefold(): entry for vm, entry in entries.items()}
    why = {vm.casefold(): text for vm, text in unreadable.items()}
    return [ledger_line(record, names[k], by_fold.get(k), why.get(k)) for k in sorted(names)]


def read_ledger(
    store: Any, event_id: str, skipped: list[Any] | None = None
) -> tuple[EventRecord | None, list[LedgerLine]]:
    """The event row and its ledger: one point read and one partition query. An event row
    that cannot be read raises the store's BadRow (naming it); reporter rows that cannot
    be read are skipped and added to `skipped`."""
    record = store.get_event(event_id)
    return (record, lines_of(store, record, skipped)) if record is not None else (None, [])


def lines_of(store: Any, record: EventRecord, skipped: list[Any] | None = None) -> list[LedgerLine]:
    """The ledger of an event row already read: one partition query (its reporter rows)."""
    reporters = store.reporter_rows(record.event_id, skipped)
    entries = {r.vm: r.ledger for r in reporters if r.ledger is not None}
    unreadable = {r.vm: r.ledger_unreadable for r in reporters if r.ledger_unreadable}
    return ledger_lines(record, entries, [r.vm for r in reporters], unreadable)


def as_json(record: EventRecord, lines: list[LedgerLine], skipped: list[Any] | None = None) -> str:
    """The export for a support case: the event's advertised facts and every VM's line,
    and the reporter rows left out because they cannot be read (`skipped`), if any."""
    left_out = [str(s) for s in skipped or []]
    return json.dumps(
        {
            "event_id": record.event_id,
            "event_type": record.event_type,
            "event_source": record.event_source,
            "description": record.description,
            "ended": record.ended or None,
            "ended_at": record.ended_at.isoformat() if record.ended_at else None,
            "vms": [line.model_dump(mode="json") for line in lines],
            **({"unreadable_rows": left_out} if left_out else {}),
        },
        indent=2,
    )


# A text cell a spreadsheet would read as a formula (OWASP "CSV Injection"): = + - @, and
# tab and carriage return, which some spreadsheets strip before looking.
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


# Where a spreadsheet may split a line into cells: `,` here, but `;` in the locales that
# write decimals with a comma, and tab in some imports.
SEPARATORS = re.compile(r"[,;\t]")


def spreadsheet_safe(value: Any) -> Any:
    """A CSV cell that opens as text: a string that starts like a formula, or any part of
    which does after a separator some locale splits on (`Reboot;=cmd|...`), gets a leading
    `'` (OWASP's neutralisation; the VM's name and the event type are a VM's own words),
    and every string is quoted (`as_csv`), so no locale splits it. Numbers stay numbers:
    a negative jump is a number to a spreadsheet, not a formula."""
    if isinstance(value, str) and (
        value.startswith(FORMULA_START)
        or any(part.lstrip(" ").startswith(FORMULA_START) for part in SEPARATORS.split(value))
    ):
        return "'" + value
    return value


def as_csv(lines: list[LedgerLine]) -> str:
    """One row per VM, a header of the field names (times ISO 8601 UTC, seconds), safe to
    open in a spreadsheet (`spreadsheet_safe`)."""
    out = io.StringIO()
    writer = csv.DictWriter(
        out, fieldnames=FIELDS, lineterminator="\n", quoting=csv.QUOTE_NONNUMERIC
    )
    writer.writeheader()
    for line in lines:
        row = line.model_dump(mode="json")
        writer.writerow({k: "" if v is None else spreadsheet_safe(v) for k, v in row.items()})
    return out.getvalue()


def summary(line: LedgerLine) -> str:
    """One line in words, for the event page, the demo's log and its report."""
    if line.unreadable:
        return f"{line.vm}: its relay's measurements cannot be read ({line.unreadable})"
    if not line.measured:
        return f"{line.vm}: no measurements from its relay"
    parts = [f"advertised {line.duration_s if line.duration_s is not None else '?'} s"]
    if line.start_delay_s is not None:
        parts.append(f"Started {line.start_delay_s:g} s after {line.start_delay_from}")
    if line.started_for_s is not None:
        parts.append(f"left IMDS {line.started_for_s:g} s after Started")
    parts.append(f"longest poll gap {line.max_poll_gap_s:g} s")
    parts.append(f"wall clock jumped {line.wall_jump_s:+g} s")
    return f"{line.vm}: " + ", ".join(parts)


TABLE_HEADER = (
    "VM",
    "advertised NotBefore",
    "advertised duration",
    "to Started",
    "Started to gone",
    "longest poll gap",
    "wall-clock jump",
)


def table_rows(lines: list[LedgerLine]) -> list[list[str]]:
    """The ledger as text cells (TABLE_HEADER), for the event page and the demo report."""

    def secs(value: float | None, sign: bool = False) -> str:
        return "—" if value is None else (f"{value:+g} s" if sign else f"{value:g} s")

    rows = []
    for line in lines:
        delay = secs(line.start_delay_s)
        if line.start_delay_s is not None:
            delay += f" after {line.start_delay_from}"
        rows.append(
            [
                line.vm + _unmeasured(line),
                line.not_before.isoformat() if line.not_before else "—",
                "unknown" if line.duration_s in (None, -1) else f"{line.duration_s} s",
                delay,
                secs(line.started_for_s),
                secs(line.max_poll_gap_s),
                secs(line.wall_jump_s, sign=True),
            ]
        )
    return rows


def _unmeasured(line: LedgerLine) -> str:
    if line.unreadable:
        return " (measurements unreadable: skipped)"
    return "" if line.measured else " (no relay measurements)"
