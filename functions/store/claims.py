"""One claim primitive for everything done once fleet-wide: claim, act, mark done.

Announcements, approvals, the silence of a relay and its recovery are each acted on by
exactly one of many racing invocations (200 reporters of an event, two overlapping
sweeps, a redelivery). Each keeps a *mark* in the row it is about, changed only inside
that row's ETag-guarded write, so of all racing writers exactly one claims:

- `""` (or absent): nobody has claimed it;
- `"pending:<taken>|<expires>|<holder>"`: claimed; the claimer is acting until it expires;
- `"done"`: acted.

A claim is a value: whoever takes it writes who holds it and until when, and every reader
applies one rule, `is_free`: a claim is free when it has expired or is mine. Nobody picks
a staleness of their own. The claimer acts after its write succeeded, then marks it done;
if the act fails it releases the claim. A claim that expired was left behind by a crash
between claim and done: anyone may take it over and redo the act, so every act must be
safe to repeat (a notification's MessageId that the topic dedupes, an approval's AttemptId
that the relay remembers).

These functions only compute on marks; the caller writes the row.
"""

from __future__ import annotations

from datetime import datetime, timedelta

PENDING = "pending:"
DONE = "done"
SEP = "|"


def pending(now: datetime, lease: timedelta, holder: str = "") -> str:
    """A claim taken `now` by `holder`, held until `now + lease`."""
    return f"{PENDING}{now.isoformat()}{SEP}{(now + lease).isoformat()}{SEP}{holder}"


def is_pending(mark: str | None) -> bool:
    return bool(mark) and mark.startswith(PENDING)  # type: ignore[union-attr]


def _parts(mark: str | None) -> tuple[datetime | None, datetime | None, str]:
    if not is_pending(mark):
        return None, None, ""
    fields = mark.removeprefix(PENDING).split(SEP, 2)  # type: ignore[union-attr]
    try:
        taken = datetime.fromisoformat(fields[0])
    except ValueError:
        return None, None, ""
    if len(fields) < 3:
        # Written before claims carried their lease: its writer is gone, so it has expired.
        return taken, taken, ""
    try:
        expires = datetime.fromisoformat(fields[1])
    except ValueError:
        return taken, None, fields[2]
    return taken, expires, fields[2]


def since(mark: str | None) -> datetime | None:
    """When a pending mark was claimed (None if not pending or unreadable)."""
    return _parts(mark)[0]


def expires(mark: str | None) -> datetime | None:
    """When a pending mark's lease runs out (None if not pending or unreadable)."""
    return _parts(mark)[1]


def holder(mark: str | None) -> str:
    """Who took a pending mark ("" when it did not say)."""
    return _parts(mark)[2]


def is_expired(mark: str | None, now: datetime) -> bool:
    """Pending, and its lease has run out (an unreadable mark counts as expired)."""
    if not is_pending(mark):
        return False
    until = expires(mark)
    return until is None or now >= until


def is_free(mark: str | None, now: datetime, me: str = "") -> bool:
    """The one rule every reader applies: nobody holds it, its claim expired, or it is
    mine (`me` names the holder; "" is nobody's). A "done" mark is never free."""
    if not mark:
        return True
    if not is_pending(mark):
        return False
    return is_expired(mark, now) or (bool(me) and holder(mark) == me)


def take(
    marks: dict[str, str],
    key: str,
    now: datetime,
    lease: timedelta,
    holder: str = "",
    *,
    takeover: bool = False,
) -> bool:
    """Claim `key` in `marks` (in place) if nobody holds it; with `takeover`, also a pending
    claim that is free for `holder` (expired, or its own)."""
    mark = marks.get(key)
    if mark and not (takeover and is_pending(mark) and is_free(mark, now, holder)):
        return False
    marks[key] = pending(now, lease, holder)
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


def expired_keys(marks: dict[str, str], now: datetime) -> list[str]:
    return [key for key, mark in marks.items() if is_expired(mark, now)]
