"""One claim primitive for everything done once fleet-wide: claim, act, mark done, redo
if stale.

Announcements, approvals, the silence of a relay and its recovery are each acted on by
exactly one of many racing invocations (200 reporters of an event, two overlapping
watchdog runs, a redelivery). Each keeps a *mark* in the row it is about, changed only
inside that row's ETag-guarded write, so of all racing writers exactly one claims:

- `""` (or absent): nobody has claimed it;
- `"pending:<ISO time>"`: claimed at that time, the claimer is acting;
- `"done"`: acted.

The claimer acts after its write succeeded, then marks it done. If the act fails it
releases the claim (the next trigger claims again). A pending mark older than the
caller's `stale_after` was left behind by a crash between claim and done: anyone may
claim it again and redo the act, so every act must be safe to repeat (a notification's
MessageId that the topic dedupes, an approval IMDS accepts twice).

These functions only compute on marks; the caller writes the row.
"""

from __future__ import annotations

from datetime import datetime, timedelta

PENDING = "pending:"
DONE = "done"


def pending(now: datetime) -> str:
    return f"{PENDING}{now.isoformat()}"


def is_pending(mark: str | None) -> bool:
    return bool(mark) and mark.startswith(PENDING)  # type: ignore[union-attr]


def since(mark: str | None) -> datetime | None:
    """When a pending mark was claimed (None if not pending or unreadable)."""
    if not is_pending(mark):
        return None
    try:
        return datetime.fromisoformat(mark.removeprefix(PENDING))  # type: ignore[union-attr]
    except ValueError:
        return None


def is_stale(mark: str | None, now: datetime, stale_after: timedelta) -> bool:
    """Pending for `stale_after` or longer (an unreadable time counts as stale)."""
    if not is_pending(mark):
        return False
    claimed = since(mark)
    return claimed is None or now - claimed >= stale_after


def can_claim(mark: str | None, now: datetime, stale_after: timedelta | None = None) -> bool:
    return not mark or (stale_after is not None and is_stale(mark, now, stale_after))


def take(
    marks: dict[str, str], key: str, now: datetime, stale_after: timedelta | None = None
) -> bool:
    """Claim `key` in `marks` (in place) if nobody holds it, or its holder is stale."""
    if not can_claim(marks.get(key), now, stale_after):
        return False
    marks[key] = pending(now)
    return True


def finish(marks: dict[str, str], keys: set[str] | list[str]) -> bool:
    """Mark done; False if they all were already (nothing to write)."""
    changed = False
    for key in keys:
        if marks.get(key) != DONE:
            marks[key] = DONE
            changed = True
    return changed


def release(marks: dict[str, str], keys: set[str] | list[str]) -> bool:
    """Give back claims whose act failed; False if none was pending."""
    changed = False
    for key in keys:
        if is_pending(marks.get(key)):
            del marks[key]
            changed = True
    return changed


def stale_keys(marks: dict[str, str], now: datetime, stale_after: timedelta) -> list[str]:
    return [key for key, mark in marks.items() if is_stale(mark, now, stale_after)]
