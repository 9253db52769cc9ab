"""The policy's rule order, checked: rules no event reaches, rules an earlier one overrides.

Rules are tried in order and the first match decides, so an ordering mistake passes every
field check and still changes what happens to VMs: a `User -> approve` rule above
`terminate-drain` approves every scale-in at once and the instance is deleted undrained.

What is refused (an error: the app fails closed on it, `settings check` exits 2):
- an earlier rule that does not drain takes events a later `drain` rule matches (all of
  them, or some, unless the earlier rule is a narrower carve-out of the later one, e.g.
  "approve Terminate in set `batch`" above "drain every Terminate"): the drain the
  operator wrote never runs for those events.
What is reported (a warning; `settings check --strict` makes it an error):
- a rule no event can reach: an empty list, only `Completed`/`Canceled` (an ended event is
  never decided), or every event it matches is matched by an earlier rule;
- an earlier `approve` takes some events a later `hold` rule matches, unless it is a
  narrower carve-out of it (a fallback after a carve-out, like `default-hold`, is the usual
  shape).

The analysis is exact where the criteria are closed sets (types, sources, statuses) or
intervals (durations), and conservative on names and tags: two globs are said to overlap or cover
only when that is certain, so a warning is never a guess.

It works on any objects with the fields of functions.model.policy's Rule and Match (that
module imports this one).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence
from typing import Any

EVENT_TYPES = ("Freeze", "Reboot", "Redeploy", "Preempt", "Terminate")
SOURCES = ("Platform", "User")
DECIDED_STATUSES = ("Scheduled", "Started")  # Completed/Canceled events are never decided
CARE = {"approve": 0, "hold": 1, "drain": 2}
UNKNOWN_DURATION = -1  # IMDS's DurationInSeconds when it does not know


def _fold(values: Sequence[str] | None) -> frozenset[str] | None:
    return None if values is None else frozenset(v.casefold() for v in values)


def _universe(values: Sequence[str]) -> frozenset[str]:
    return frozenset(v.casefold() for v in values)


def _closed(match: Any, name: str, universe: Sequence[str]) -> frozenset[str]:
    """The values of one closed-set criterion an event can have and still match."""
    given = _fold(getattr(match, name))
    every = _universe(universe)
    return every if given is None else given & every


def _duration(match: Any) -> tuple[bool, int, int | None]:
    """(has a criterion, lowest duration matched, exclusive upper bound or None)."""
    low, high = match.duration_at_least, match.duration_below
    if low is None and high is None:
        return False, UNKNOWN_DURATION, None
    return True, max(UNKNOWN_DURATION, low if low is not None else UNKNOWN_DURATION), high


def _durations_cover(a: Any, b: Any) -> bool:
    has_a, low_a, high_a = _duration(a)
    has_b, low_b, high_b = _duration(b)
    if not has_a:
        return True
    if not has_b:
        return False  # b also matches events without a duration; a does not
    return low_b >= low_a and (high_a is None or (high_b is not None and high_b <= high_a))


def _durations_overlap(a: Any, b: Any) -> bool:
    has_a, low_a, high_a = _duration(a)
    has_b, low_b, high_b = _duration(b)
    if not (has_a or has_b):
        return True
    low = max(low_a, low_b)
    highs = [h for h in (high_a, high_b) if h is not None]
    return not highs or low < min(highs)


def _glob_covers(pattern: str, name: str) -> bool:
    """Certain that every name (of a VM or a scale set) `name` matches also matches
    `pattern`."""
    pattern, name = pattern.casefold(), name.casefold()
    if pattern == name or pattern == "*":
        return True
    literal = not any(c in name for c in "*?[")
    return literal and fnmatch.fnmatchcase(name, pattern)


def _names_cover(a: Sequence[str] | None, b: Sequence[str] | None) -> bool:
    if a is None:
        return True
    if b is None:
        return False
    return all(any(_glob_covers(p, q) for p in a) for q in b)


def _names_overlap(a: Sequence[str] | None, b: Sequence[str] | None) -> bool:
    """Certain that some VM name matches both (unknown counts as no)."""
    if a is None or b is None:
        return True  # empty lists were reported as unreachable before
    return any(_glob_covers(p, q) or _glob_covers(q, p) for p in a for q in b)


def _tags_cover(a: Any, b: Any) -> bool:
    """Certain that every VM `b`'s tags criterion matches also matches `a`'s: each tag
    `a` asks for, `b` asks for too, with values all covered by `a`'s globs (values are
    case-sensitive, so compared as written)."""
    wanted_a, wanted_b = getattr(a, "tags", None), getattr(b, "tags", None)
    if wanted_a is None:
        return True
    if wanted_b is None:
        return False
    folded_b = {k.casefold(): v for k, v in wanted_b.items()}
    for name, globs in wanted_a.items():
        theirs = folded_b.get(name.casefold())
        if theirs is None or not all(any(_value_covers(p, q) for p in globs) for q in theirs):
            return False
    return True


def _value_covers(pattern: str, value: str) -> bool:
    if pattern == value or pattern == "*":
        return True
    return not any(c in value for c in "*?[") and fnmatch.fnmatchcase(value, pattern)


def _tags_overlap(a: Any, b: Any) -> bool:
    """Certain that some VM's tags match both (a tag only one asks for can be on it)."""
    wanted_a, wanted_b = getattr(a, "tags", None) or {}, getattr(b, "tags", None) or {}
    folded_b = {k.casefold(): v for k, v in wanted_b.items()}
    for name, globs in wanted_a.items():
        theirs = folded_b.get(name.casefold())
        if theirs is not None and not any(
            _value_covers(p, q) or _value_covers(q, p) for p in globs for q in theirs
        ):
            return False
    return True


CLOSED = (("event_types", EVENT_TYPES), ("sources", SOURCES), ("statuses", DECIDED_STATUSES))


def covers(a: Any, b: Any) -> bool:
    """Every event `b` matches, `a` matches too."""
    return (
        all(_closed(b, n, u) <= _closed(a, n, u) for n, u in CLOSED)
        and _durations_cover(a, b)
        and _names_cover(a.resources, b.resources)
        and _names_cover(a.scale_sets, b.scale_sets)
        and _tags_cover(a, b)
    )


def overlap(a: Any, b: Any) -> bool:
    """Some event (certainly) matches both."""
    return (
        all(_closed(a, n, u) & _closed(b, n, u) for n, u in CLOSED)
        and _durations_overlap(a, b)
        and _names_overlap(a.resources, b.resources)
        and _names_overlap(a.scale_sets, b.scale_sets)
        and _tags_overlap(a, b)
    )


def unreachable(match: Any) -> str | None:
    """Why no event can match `match` on its own, or None."""
    for name in ("event_types", "sources", "statuses", "resources", "scale_sets"):
        if getattr(match, name) == ():
            return f"its {name} list is empty"
    if match.statuses is not None and not _closed(match, "statuses", DECIDED_STATUSES):
        return "it matches only Completed/Canceled, and an ended event is never decided"
    return None


def _shared(a: Any, b: Any) -> str:
    """The events two matches share, in words: 'Terminate events from User'."""
    types = [t for t in EVENT_TYPES if t.casefold() in _closed(a, "event_types", EVENT_TYPES)]
    types = [t for t in types if t.casefold() in _closed(b, "event_types", EVENT_TYPES)]
    sources = [s for s in SOURCES if s.casefold() in _closed(a, "sources", SOURCES)]
    sources = [s for s in sources if s.casefold() in _closed(b, "sources", SOURCES)]
    text = "/".join(types) + " events" if len(types) < len(EVENT_TYPES) else "events"
    if len(sources) < len(SOURCES):
        text += f" from {'/'.join(sources)}"
    return text


def lint_rules(rules: Sequence[Any]) -> tuple[list[str], list[str]]:
    """(errors, warnings) about the rules' order; see the module docstring."""
    errors: list[str] = []
    warnings: list[str] = []
    for j, later in enumerate(rules):
        why = unreachable(later.match)
        if why:
            warnings.append(f"rule {later.name!r} can never match: {why}")
            continue
        for earlier in rules[:j]:
            if unreachable(earlier.match):
                continue
            less_careful = CARE[earlier.action] < CARE[later.action]
            if covers(earlier.match, later.match):
                text = (
                    f"rule {later.name!r} ({later.action}) can never match: every event it "
                    f"matches is matched first by rule {earlier.name!r} ({earlier.action})"
                )
                (errors if less_careful and later.action == "drain" else warnings).append(text)
                break
            if less_careful and overlap(earlier.match, later.match):
                if covers(later.match, earlier.match):
                    continue  # a carve-out above a broader rule: written on purpose
                text = (
                    f"rule {earlier.name!r} ({earlier.action}) comes before rule "
                    f"{later.name!r} ({later.action}) and takes the "
                    f"{_shared(earlier.match, later.match)} both match: put "
                    f"{later.name!r} above {earlier.name!r}, or narrow {earlier.name!r}"
                )
                (errors if later.action == "drain" else warnings).append(text)
    return errors, warnings
