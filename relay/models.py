"""The IMDS Scheduled Events document and the relay envelope, as the relay reads and writes them.

Standard library only: the relay runs on a VM's own Python (3.9 and newer) with nothing
installed. The function app keeps its own pydantic model of the same wire format
(functions/model/envelope.py); tests check the relay's output against that model and the
JSON Schema generated from it, so the two cannot drift apart.

Azure adds fields and event types over time, so unknown ones are kept, never rejected: an
old relay must still forward a document from a newer IMDS. Times are kept as IMDS wrote
them and only interpreted on demand: a `NotBefore` that Python cannot represent (year 9999
with a negative offset) must not stop the relay from forwarding the document.
"""

from __future__ import annotations

import json
import re
from datetime import datetime, timedelta, timezone

from relay.record import Factory, Record

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

SCHEDULED_EVENTS_API_VERSION = "2020-07-01"
"""The version the relay pins; the newest one Microsoft publishes (see SPEC.md)."""

SCHEDULED, STARTED = "Scheduled", "Started"
ENVELOPE_SCHEMA = 1
ENVELOPE_KINDS = ("document", "heartbeat", "unforwardable", "preflight")
EVENT_SCOPES = ("own", "all")


class DocumentError(ValueError):
    """An IMDS answer (or an envelope) that is not what it should be; one readable message."""


# --------------------------------------------------------------------------- times


def parse_not_before(value: Any) -> datetime | None:
    """`NotBefore` as an aware UTC time; None for "" (Started) or None.

    IMDS writes RFC 1123 (`Mon, 11 Apr 2022 22:26:58 GMT`); Microsoft's mock writes
    ISO 8601. Raises ValueError for anything else, including a time Python cannot hold
    (OverflowError is folded in so one except clause covers every bad value).
    """
    if value is None:
        return None
    if isinstance(value, datetime):
        return _as_utc(value)
    if not isinstance(value, str):
        raise ValueError(f"NotBefore must be a string, got {type(value).__name__}")
    text = value.strip()
    if not text:
        return None
    try:
        moment = _parse_rfc1123(text)
        if moment is not None:
            return _as_utc(moment)
    except OverflowError:
        raise ValueError(f"NotBefore {value!r} is outside the times Python can hold") from None
    except ValueError:
        pass
    iso = text[:-1] + "+00:00" if text.endswith(("Z", "z")) else text
    try:
        return _as_utc(datetime.fromisoformat(iso))
    except OverflowError:
        raise ValueError(f"NotBefore {value!r} is outside the times Python can hold") from None
    except ValueError:
        raise ValueError(
            f"NotBefore {value!r} is neither RFC 1123 ('Mon, 11 Apr 2022 22:26:58 GMT') "
            "nor ISO 8601 ('2025-07-01T12:00:00Z')"
        ) from None


_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")
_DAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
_RFC1123 = re.compile(
    r"(?:[A-Za-z]{3},\s*)?(\d{1,2})\s+([A-Za-z]{3})\s+(\d{2,4})\s+"
    r"(\d{1,2}):(\d{2})(?::(\d{2}))?\s*(GMT|UTC?|Z|[+-]\d{4})?"
)


def _parse_rfc1123(text: str) -> datetime | None:
    """`Mon, 11 Apr 2022 22:26:58 GMT` (or a numeric offset); None if it is not that form.

    Written out rather than email.utils, which would load the email package into every
    relay for one date format.
    """
    match = _RFC1123.fullmatch(text)
    if match is None:
        return None
    day, month, year, hour, minute, second, zone = match.groups()
    if month.title() not in _MONTHS:
        return None
    number = int(year)
    if len(year) == 2:  # RFC 2822's rule for two-digit years
        number += 2000 if number < 50 else 1900
    offset = timezone.utc
    if zone and zone[0] in "+-":
        minutes = int(zone[1:3]) * 60 + int(zone[3:5])
        offset = timezone((-1 if zone[0] == "-" else 1) * timedelta(minutes=minutes))
    return datetime(
        number,
        _MONTHS.index(month.title()) + 1,
        int(day),
        int(hour),
        int(minute),
        int(second or 0),
        tzinfo=offset,
    )


def _as_utc(moment: datetime) -> datetime:
    # IMDS times are GMT; a naive time can only have meant UTC.
    if moment.tzinfo is None:
        return moment.replace(tzinfo=timezone.utc)
    return moment.astimezone(timezone.utc)


def format_not_before(moment: datetime | None) -> str:
    """Write a time the way IMDS does: RFC 1123 in GMT, or "" for no time."""
    if moment is None:
        return ""
    utc = _as_utc(moment)
    return (
        f"{_DAYS[utc.weekday()]}, {utc.day:02d} {_MONTHS[utc.month - 1]} {utc.year:04d} "
        f"{utc.hour:02d}:{utc.minute:02d}:{utc.second:02d} GMT"
    )


def http_date(epoch: float) -> str:
    """RFC 1123 in English whatever the locale: x-ms-date, the callback's `Date`."""
    return format_not_before(datetime.fromtimestamp(epoch, timezone.utc))


def parse_http_date(value: str) -> float | None:
    """Epoch seconds of an RFC 1123 `Date` header, or None if it is not one."""
    try:
        return _parse_rfc1123(value).timestamp()  # type: ignore[union-attr]
    except (AttributeError, ValueError, OverflowError):
        return None


def parse_aware(value: Any, name: str) -> datetime:
    """An ISO 8601 time with an offset (what envelopes carry), on any Python >= 3.9."""
    if isinstance(value, datetime):
        moment = value
    elif isinstance(value, str):
        text = value[:-1] + "+00:00" if value.endswith(("Z", "z")) else value
        try:
            moment = datetime.fromisoformat(text)
        except ValueError:
            raise DocumentError(f"{name}: not an ISO 8601 time: {value!r}") from None
    else:
        raise DocumentError(f"{name}: must be an ISO 8601 string")
    if moment.tzinfo is None:
        raise DocumentError(f"{name}: needs a time zone offset")
    try:
        return moment.astimezone(timezone.utc)
    except OverflowError:
        raise DocumentError(f"{name}: outside the times Python can hold") from None


def format_aware(moment: datetime) -> str:
    """UTC with microseconds and a `Z`, as pydantic writes an aware datetime."""
    text = moment.astimezone(timezone.utc).replace(tzinfo=None).isoformat()
    return text + "Z"


# --------------------------------------------------------------------------- document


class ScheduledEvent(Record):
    """One entry of `Events`; `raw` is the entry exactly as IMDS wrote it."""

    event_id: str
    event_status: str
    event_type: str
    resources: tuple[str, ...] = ()
    raw: dict[str, Any] = Factory(dict, compare=False)

    @property
    def not_before_text(self) -> str:
        value = self.raw.get("NotBefore")
        return value if isinstance(value, str) else ""

    @property
    def not_before(self) -> datetime | None:
        """Parsed on demand; None when empty or not representable (see not_before_text)."""
        try:
            return parse_not_before(self.raw.get("NotBefore"))
        except ValueError:
            return None

    @property
    def is_scheduled(self) -> bool:
        return self.event_status == SCHEDULED

    @property
    def is_started(self) -> bool:
        return self.event_status == STARTED

    def affects(self, vm_name: str) -> bool:
        """Whether this VM is named in `Resources`.

        Every VM of an availability set sees the events of all the others; only the named
        ones are affected. Azure compares names case-insensitively, so do we.
        """
        wanted = vm_name.casefold()
        return any(name.casefold() == wanted for name in self.resources)


class ScheduledEventsDocument(Record):
    """The whole answer of `GET /metadata/scheduledevents`."""

    document_incarnation: int
    events: tuple[ScheduledEvent, ...]
    raw: dict[str, Any] = Factory(dict, compare=False)

    def event(self, event_id: str) -> ScheduledEvent | None:
        wanted = event_id.casefold()
        return next((e for e in self.events if e.event_id.casefold() == wanted), None)

    def unreadable_times(self) -> list[str]:
        """EventIds whose `NotBefore` is not a time Python can read (logged, not fatal)."""
        bad = []
        for item in self.events:
            try:
                parse_not_before(item.raw.get("NotBefore"))
            except ValueError:
                bad.append(item.event_id)
        return bad


def _event(index: int, item: Any) -> ScheduledEvent:
    where = f"Events.{index}"
    if not isinstance(item, dict):
        raise DocumentError(f"not a Scheduled Events document: {where}: must be an object")
    values = {}
    for key in ("EventId", "EventStatus", "EventType"):
        value = item.get(key)
        if not isinstance(value, str) or (key == "EventId" and not value):
            raise DocumentError(
                f"not a Scheduled Events document: {where}.{key}: must be a non-empty string"
            )
        values[key] = value
    resources = item.get("Resources", [])
    if not isinstance(resources, list) or not all(isinstance(r, str) for r in resources):
        raise DocumentError(
            f"not a Scheduled Events document: {where}.Resources: must be a list of strings"
        )
    for key in ("ResourceType", "Description", "EventSource"):
        if item.get(key) is not None and not isinstance(item[key], str):
            raise DocumentError(f"not a Scheduled Events document: {where}.{key}: not a string")
    duration = item.get("DurationInSeconds")
    if duration is not None and (isinstance(duration, bool) or not isinstance(duration, int)):
        raise DocumentError(
            f"not a Scheduled Events document: {where}.DurationInSeconds: not an integer"
        )
    not_before = item.get("NotBefore")
    if not_before is not None and not isinstance(not_before, str):
        raise DocumentError(f"not a Scheduled Events document: {where}.NotBefore: not a string")
    return ScheduledEvent(
        values["EventId"], values["EventStatus"], values["EventType"], tuple(resources), item
    )


def parse_document(data: Any) -> ScheduledEventsDocument:
    """Check an IMDS answer's shape; raise one DocumentError that says what is wrong.

    Times are not interpreted here (see `ScheduledEvent.not_before`): a document whose
    NotBefore Python cannot represent is still a document, and is still forwarded.
    """
    if isinstance(data, (bytes, str)):
        try:
            data = json.loads(data)
        except (UnicodeDecodeError, ValueError, RecursionError) as exc:
            raise DocumentError(f"not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise DocumentError(f"not a Scheduled Events document: a JSON {type(data).__name__}")
    incarnation = data.get("DocumentIncarnation")
    if isinstance(incarnation, bool) or not isinstance(incarnation, int) or incarnation < 0:
        raise DocumentError(
            "not a Scheduled Events document: DocumentIncarnation must be an integer >= 0"
        )
    events = data.get("Events")
    if not isinstance(events, list):
        raise DocumentError("not a Scheduled Events document: Events must be a list")
    parsed = tuple(_event(i, item) for i, item in enumerate(events))
    return ScheduledEventsDocument(incarnation, parsed, data)


def only_events_for(document: dict[str, Any], vm_name: str) -> dict[str, Any]:
    """The document with `Events` cut to those naming this VM in `Resources` (contract C2).

    Every VM of an availability set or scale set placement group sees the others' events;
    forwarding them from every VM multiplies messages by the set's size, and each VM's own
    relay reports its own events anyway. Everything else in the document is kept.
    """
    wanted = vm_name.casefold()
    events = [
        item
        for item in document.get("Events") or []
        if isinstance(item, dict)
        and any(isinstance(r, str) and r.casefold() == wanted for r in item.get("Resources") or [])
    ]
    return {**document, "Events": events}


def content_hash(document: dict[str, Any]) -> str:
    """A stable hash of a raw document, independent of key order and white space."""
    canonical = json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    from relay.signing import sha256

    return sha256(canonical.encode()).hexdigest()


# --------------------------------------------------------------------------- envelope


def _optional_str(data: dict[str, Any], key: str, where: str) -> str | None:
    value = data.get(key)
    if value is not None and not isinstance(value, str):
        raise DocumentError(f"not a relay envelope: {where}.{key}: must be a string or null")
    return value


class VmRef(Record):
    """Who sent an envelope, where it runs in Azure, and how to call its relay back."""

    name: str
    vm_id: str | None = None  # IMDS compute `vmId`, lower-case: the VM's identity (issue 22)
    callback_url: str | None = None
    scale_set: str | None = None
    availability_set: str | None = None
    resource_id: str | None = None
    subscription_id: str | None = None
    resource_group: str | None = None
    extra: dict[str, Any] = Factory(dict, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not 1 <= len(self.name) <= 128:
            raise DocumentError("not a relay envelope: vm.name: must be 1..128 characters")
        if self.vm_id is not None:
            object.__setattr__(self, "vm_id", self.vm_id.lower())
        url = self.callback_url
        if url is not None:
            if not isinstance(url, str) or not url.startswith(("http://", "https://")):
                raise DocumentError("not a relay envelope: vm.callback_url: must be http(s)")
            object.__setattr__(self, "callback_url", url.rstrip("/") or None)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": self.name,
            "vm_id": self.vm_id,
            "callback_url": self.callback_url,
            "scale_set": self.scale_set,
            "availability_set": self.availability_set,
            "resource_id": self.resource_id,
            "subscription_id": self.subscription_id,
            "resource_group": self.resource_group,
        }
        out.update({k: v for k, v in self.extra.items() if k not in out})
        return out

    @classmethod
    def from_dict(cls, data: Any) -> VmRef:
        if not isinstance(data, dict):
            raise DocumentError("not a relay envelope: vm: must be an object")
        known = set(cls._fields) - {"extra"}
        values = {k: _optional_str(data, k, "vm") for k in known if k != "name"}
        return cls(
            name=data.get("name"),  # checked in __post_init__
            extra={k: v for k, v in data.items() if k not in known},
            **values,
        )


_ENVELOPE_KEYS = (
    "schema",
    "kind",
    "vm",
    "relay_version",
    "sequence",
    "observed_at",
    "document",
    "events",
)


class Envelope(Record):
    """What the relay sends: one IMDS document (or a heartbeat) and its context.

    `document` is the IMDS answer exactly as received (or cut to this VM's events, see
    `events`), so nothing the functions might need is lost in translation. `extra` holds
    the heartbeat's fields (imds_healthy, imds_error, outbox_pending) and anything a newer
    relay adds; they travel as top-level keys.
    """

    kind: str
    vm: VmRef
    sequence: int
    observed_at: datetime
    document: dict[str, Any] | None = None
    relay_version: str = "unknown"
    events: str | None = None
    schema_version: int = ENVELOPE_SCHEMA
    extra: dict[str, Any] = Factory(dict)

    def __post_init__(self) -> None:
        if self.schema_version != ENVELOPE_SCHEMA:
            raise DocumentError(f"not a relay envelope: schema: must be {ENVELOPE_SCHEMA}")
        if self.kind not in ENVELOPE_KINDS:
            raise DocumentError(
                "not a relay envelope: kind: must be 'document', 'heartbeat', 'unforwardable' "
                "or 'preflight'"
            )
        if not isinstance(self.vm, VmRef):
            raise DocumentError("not a relay envelope: vm: must be a VmRef")
        seq = self.sequence
        if isinstance(seq, bool) or not isinstance(seq, int) or seq < 0:
            raise DocumentError("not a relay envelope: sequence: must be an integer >= 0")
        object.__setattr__(self, "observed_at", parse_aware(self.observed_at, "observed_at"))
        if not isinstance(self.relay_version, str):
            raise DocumentError("not a relay envelope: relay_version: must be a string")
        if self.events is not None and self.events not in EVENT_SCOPES:
            raise DocumentError("not a relay envelope: events: must be 'own' or 'all'")
        if self.kind == "document" and self.document is None:
            raise DocumentError("not a relay envelope: a document envelope needs a document")
        if self.document is not None:
            parse_document(self.document)

    def with_sequence(self, sequence: int) -> Envelope:
        return self.replace(sequence=sequence)

    @property
    def key_id(self) -> str:
        """The KID of the callback key this envelope carries ("" if none)."""
        key = self.extra.get("callback_key")
        return str(key.get("id") or "") if isinstance(key, dict) else ""

    @property
    def session_id(self) -> str:
        """Service Bus SessionId: the vmId (contract §1), the name for an old envelope."""
        return self.vm.vm_id or self.vm.name

    def message_id(self) -> str:
        """Service Bus MessageId: equal for resends of the same document, so they are dropped.

        vmId + incarnation + content hash + KID for documents (contract §1; <= 128
        characters, the Service Bus limit): a key rotation re-sends the current document
        and must not be taken for a duplicate. Heartbeats use the observation time, not the
        sequence: a reimaged VM whose state directory was wiped restarts its sequence, and
        its new heartbeats must not be dropped as duplicates of the old ones. A document
        sent again because the app never acknowledged it (contract §11) adds
        `:r{sequence}.{resent}`: Service Bus must not drop it as the original's duplicate.
        """
        who = (self.vm.vm_id or self.vm.name)[:80]
        if self.kind == "document" and self.document is not None:
            incarnation = self.document.get("DocumentIncarnation")
            digest = content_hash(self.document)[:32]
            resent = self.extra.get("resent")
            again = f":r{self.sequence}.{resent}" if resent else ""
            return f"{who}:{incarnation}:{digest}:{self.key_id}"[: 128 - len(again)] + again
        if self.kind == "unforwardable":
            detail = self.extra.get("unforwardable")
            incarnation = detail.get("incarnation") if isinstance(detail, dict) else None
            return f"{who}:unfwd:{incarnation}:{self.sequence}:{self.key_id}"[:128]
        kind = "pf" if self.kind == "preflight" else "hb"  # `check`: one test message
        return f"{who}:{kind}:{self.observed_at.strftime('%Y%m%dT%H%M%S.%f')}"

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "schema": self.schema_version,
            "kind": self.kind,
            "vm": self.vm.to_dict(),
            "relay_version": self.relay_version,
            "sequence": self.sequence,
            "observed_at": format_aware(self.observed_at),
            "document": self.document,
        }
        if self.events is not None:
            out["events"] = self.events
        out.update({k: v for k, v in self.extra.items() if k not in out})
        return out

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), separators=(",", ":"), ensure_ascii=False)


def parse_envelope(data: Any) -> Envelope:
    """Read an envelope back (the outbox's files); raise one DocumentError naming the problem."""
    if isinstance(data, (bytes, str)):
        try:
            data = json.loads(data)
        except (UnicodeDecodeError, ValueError, RecursionError) as exc:
            raise DocumentError(f"not a relay envelope: not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise DocumentError("not a relay envelope: not a JSON object")
    missing = [k for k in ("kind", "vm", "sequence", "observed_at") if k not in data]
    if missing:
        raise DocumentError(f"not a relay envelope: {', '.join(missing)}: required")
    relay_version = data.get("relay_version", "unknown")
    return Envelope(
        kind=data["kind"],
        vm=VmRef.from_dict(data["vm"]),
        sequence=data["sequence"],
        observed_at=data["observed_at"],
        document=data.get("document"),
        relay_version=relay_version,
        events=data.get("events"),
        schema_version=data.get("schema", ENVELOPE_SCHEMA),
        extra={k: v for k, v in data.items() if k not in _ENVELOPE_KEYS},
    )
