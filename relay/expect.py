"""`Expect`: the view of an event the app decided on, checked against this VM's own IMDS.

Azure lets any VM named in an event approve it for all of them, and every VM of a set sees
its set-mates' events, so what one VM *reports* about a shared event is an attacker's input
about every other VM. The app therefore sends, with each /v1/start, the view its decision
rests on (functions/model/view.py `VmView.expect()`):

    "Expect": {EventId: {"EventType": TEXT, "EventSource": TEXT,
                         "DurationInSeconds": INT or null, "NotBefore": TEXT,
                         "Resources": [NAME, ...]}}

and this relay approves only when its own fresh IMDS shows the event with the same fields:
EventType and EventSource case-insensitively (an IMDS event without `EventSource` has ""),
DurationInSeconds exactly (null: IMDS gives none), NotBefore as an instant to the second
(the app writes ISO 8601 UTC, IMDS RFC 1123; "" for none), Resources as a set of names,
case-insensitively. Every key is optional: an older app sends only EventType and
EventSource, and those are still checked (and still enough to approve). A difference
refuses the whole request with 409 naming the field.

Standard library only, Python 3.9 (the relay's floor).
"""

from __future__ import annotations

from relay.models import parse_not_before

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from relay.models import ScheduledEvent

# The fields an `Expect` entry may name, in the order a difference is reported.
EXPECTED_FIELDS = ("EventType", "EventSource", "DurationInSeconds", "NotBefore", "Resources")
MAX_EXPECTED_LENGTH = 64  # EventType, EventSource, NotBefore
MAX_EXPECTED_RESOURCES = 1000  # names in one entry (the body's 16 KiB bound comes first)
MAX_NAME_LENGTH = 128  # one name in Resources
SHAPE = (
    'expected "Expect": {EventId: {"EventType": TEXT, "EventSource": TEXT, '
    '"DurationInSeconds": INT or null, "NotBefore": TEXT, "Resources": [NAME, ...]}} '
    f"(each key optional, texts at most {MAX_EXPECTED_LENGTH} characters)"
)


class BadExpect(ValueError):
    """An `Expect` that is not the documented shape (the caller answers 400)."""


def parse_expect(value: Any) -> dict[str, dict[str, Any]]:
    """`Expect` of a /v1/start body: casefolded EventId -> {field: expected value}."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise BadExpect(SHAPE)
    found: dict[str, dict[str, Any]] = {}
    for event_id, entry in value.items():
        if not isinstance(entry, dict) or not 0 < len(event_id) <= 128:
            raise BadExpect(SHAPE)
        fields = {name: _field(name, entry[name]) for name in EXPECTED_FIELDS if name in entry}
        if event_id.casefold() in found:
            raise BadExpect("duplicate EventIds in Expect")
        found[event_id.casefold()] = fields
    return found


def _field(name: str, value: Any) -> Any:
    if name == "DurationInSeconds":
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise BadExpect(SHAPE)
        return value
    if name == "Resources":
        if (
            not isinstance(value, list)
            or len(value) > MAX_EXPECTED_RESOURCES
            or not all(isinstance(n, str) and len(n) <= MAX_NAME_LENGTH for n in value)
        ):
            raise BadExpect(SHAPE)
        return value
    if not isinstance(value, str) or len(value) > MAX_EXPECTED_LENGTH:
        raise BadExpect(SHAPE)
    if name == "NotBefore":
        try:
            parse_not_before(value)
        except ValueError:
            raise BadExpect(f"Expect: NotBefore {value[:64]!r} is not a time") from None
    return value


def differences(expected: dict[str, Any] | None, scheduled: ScheduledEvent) -> list[str]:
    """What differs between the app's view of an event and this VM's IMDS view, in
    EXPECTED_FIELDS order; empty when they agree on every field the app named."""
    if not expected:
        return []
    raw = scheduled.raw
    found = []
    for name in EXPECTED_FIELDS:
        if name not in expected:
            continue
        wanted: Any = expected[name]
        if name in ("EventType", "EventSource"):
            value = raw.get(name)
            text = value if isinstance(value, str) else ""
            if wanted.casefold() != text.casefold():
                found.append(f"{name} '{wanted}' expected, IMDS says '{text[:64]}'")
        elif name == "DurationInSeconds":
            actual = raw.get(name)
            if actual != wanted or isinstance(actual, bool):
                found.append(f"{name} {_json(wanted)} expected, IMDS says {_json(actual)}")
        elif name == "NotBefore":
            if not _same_instant(wanted, raw.get(name)):
                value = raw.get(name)
                shown = value if isinstance(value, str) else ""
                found.append(f"{name} '{wanted}' expected, IMDS says '{shown[:64]}'")
        else:  # Resources
            value = raw.get(name)
            listed = value if isinstance(value, list) else []
            actual_names = {str(n).casefold() for n in listed}
            wanted_names = {n.casefold() for n in wanted}
            if actual_names != wanted_names:
                found.append(_resources_difference(wanted_names, actual_names))
    return found


def _same_instant(wanted: str, actual: Any) -> bool:
    try:
        mine = parse_not_before(actual if isinstance(actual, str) else None)
        theirs = parse_not_before(wanted)
    except ValueError:
        return False
    if mine is None or theirs is None:
        return mine is None and theirs is None
    return int(mine.timestamp()) == int(theirs.timestamp())


def _resources_difference(wanted: set[str], actual: set[str]) -> str:
    extra = sorted(wanted - actual)[:5]
    missing = sorted(actual - wanted)[:5]
    parts = []
    if extra:
        parts.append(f"not named here: {', '.join(n[:64] for n in extra)}")
    if missing:
        parts.append(f"also named here: {', '.join(n[:64] for n in missing)}")
    return f"Resources differ ({'; '.join(parts)})"


def _json(value: Any) -> str:
    if value is None:
        return "none"
    return str(value)[:32]
