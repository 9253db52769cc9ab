"""The IMDS Scheduled Events document and the relay envelope, shared by relay and functions.

Defined once here because the relay (which writes envelopes) and the functions (which read
them) must never disagree on the wire format. The relay package is deliberately light
(pydantic only), so the function app imports it rather than the other way round.

Azure adds fields and event types over time, so unknown ones are kept, never rejected: an
old relay must still forward a document from a newer IMDS, and the functions must still
announce an event type they have no rule for.
"""

from __future__ import annotations

import hashlib
import json
import re
from datetime import UTC, datetime
from email.utils import format_datetime, parsedate_to_datetime
from typing import Annotated, Any, Final, Literal

from pydantic import (
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_serializer,
    field_validator,
    model_validator,
)

SCHEDULED_EVENTS_API_VERSION = "2020-07-01"
"""The version the relay pins; the newest one Microsoft publishes (see SPEC.md)."""

# The published versions, oldest first, and what each one added to the document.
API_VERSIONS: tuple[str, ...] = (
    "2017-03-01",
    "2017-08-01",
    "2017-11-01",
    "2019-01-01",
    "2019-04-01",
    "2019-08-01",
    "2020-07-01",
)

# Known values. Fields are plain strings so that values Azure adds later pass through.
FREEZE, REBOOT, REDEPLOY, PREEMPT, TERMINATE = (
    "Freeze",
    "Reboot",
    "Redeploy",
    "Preempt",
    "Terminate",
)
KNOWN_EVENT_TYPES = frozenset({FREEZE, REBOOT, REDEPLOY, PREEMPT, TERMINATE})
SCHEDULED, STARTED = "Scheduled", "Started"
PLATFORM, USER = "Platform", "User"


# Bounds that keep one message inside what Table storage can hold (a string property is at
# most 32 K UTF-16 characters; an entity at most 1 MiB) with room to spare, and inside what
# a real IMDS document ever carries: a handful of events, short descriptions. A message
# beyond them is broken or hostile; it is rejected with the reason (or, for descriptive
# text, shortened with a marker) instead of failing every write and being redelivered.
MAX_EVENTS = 100
MAX_RESOURCES = 1000
MAX_EVENT_ID_CHARS = 128
MAX_NAME_CHARS = 128  # EventType, EventStatus, EventSource, ResourceType, VM and set names
MAX_URL_CHARS = 2048
MAX_DESCRIPTION_CHARS = 2000
MAX_ATTESTATION_CHARS = 32_768  # IMDS's PKCS#7 is about 5 KB of base64 with its chain
TRUNCATED_MARK = " … [truncated: {} more characters]"

# Times that datetime can hold *and* do arithmetic on (deadlines, budgets, margins):
# IMDS writes times close to now; anything outside these is a broken document.
EARLIEST = datetime(1970, 1, 1, tzinfo=UTC)
LATEST = datetime(9000, 1, 1, tzinfo=UTC)

# Numbers get bounds of the same kind: every one a relay sends is read, added up, shown and
# stored, so one out of range (1.7e308 twice is inf; 10**30 seconds is no timedelta) would
# fail every reader of a row that other VMs' events share. Counters stay within a signed
# 64-bit integer (Table storage's Int64); a clock interval within the span of times
# accepted above (no two readings of a clock the app believes can differ by more); an
# advertised duration within a year (Azure's are seconds to hours), so NotBefore plus it is
# still a time.
MAX_COUNTER = 2**63 - 1
MAX_CLOCK_SECONDS = (LATEST - EARLIEST).total_seconds()
MAX_DURATION_SECONDS = 366 * 24 * 3600


def shorten(text: str, limit: int = MAX_DESCRIPTION_CHARS) -> str:
    """Descriptive text cut to `limit` characters, saying how much was cut (never silently)."""
    if len(text) <= limit:
        return text
    return text[:limit] + TRUNCATED_MARK.format(len(text) - limit)


def _unicode(value: Any) -> Any:
    """A name must be encodable: a lone surrogate (JSON "\\ud800") cannot be sent to Table
    storage at all, so every write of a row keyed or holding it would fail."""
    for text in value if isinstance(value, tuple) else (value,):
        if isinstance(text, str):
            try:
                text.encode("utf-8")
            except UnicodeEncodeError:
                raise ValueError("must be valid Unicode (a lone surrogate is not)") from None
    return value


class DocumentError(ValueError):
    """An IMDS answer that is not a Scheduled Events document.

    One exception type with one readable message, so the relay can log it once per streak
    and the functions can record it as the reason a message was rejected.
    """


def parse_not_before(value: Any) -> datetime | None:
    """Parse `NotBefore` as IMDS writes it (RFC 1123) or as Microsoft's mock does (ISO 8601).

    An empty string (the event has Started) and None both mean "no time".
    """
    if value is None or isinstance(value, datetime):
        return _as_utc(value) if value is not None else None
    if not isinstance(value, str):
        raise ValueError(f"NotBefore must be a string, got {type(value).__name__}")
    text = value.strip()
    if not text:
        return None
    try:
        parsed = parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError, OverflowError):
        parsed = None
    if parsed is not None:
        written = _FOUR_DIGIT_YEAR.search(text)
        if written is not None and int(written.group(1)) != parsed.year:
            # email.utils reads any year below 100 as 19xx/20xx, even written with four
            # digits: "0001" would become 2001. A year written in full is that year.
            raise ValueError(
                f"time {value!r}: year {written.group(1)} is outside "
                f"{EARLIEST.year}..{LATEST.year - 1}"
            )
        return _as_utc(parsed)
    try:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except (ValueError, OverflowError):
        raise ValueError(
            f"NotBefore {value!r} is neither RFC 1123 ('Mon, 11 Apr 2022 22:26:58 GMT') "
            "nor ISO 8601 ('2025-07-01T12:00:00Z')"
        ) from None
    return _as_utc(parsed)


_FOUR_DIGIT_YEAR = re.compile(r"\b(\d{4})\s+\d{1,2}:\d{2}")


def _as_utc(moment: datetime) -> datetime:
    """UTC, within EARLIEST..LATEST; ValueError (never OverflowError, which pydantic would
    not turn into a validation error) for a time outside them."""
    # IMDS times are GMT; a naive time can only have meant UTC.
    try:
        utc = moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)
    except OverflowError:
        raise ValueError(
            f"time {moment.isoformat()} is out of range once converted to UTC"
        ) from None
    if not EARLIEST <= utc < LATEST:
        raise ValueError(f"time {utc.isoformat()} is outside {EARLIEST.year}..{LATEST.year - 1}")
    return utc


def format_not_before(moment: datetime | None) -> str:
    """Write a time the way IMDS does: RFC 1123 in GMT, or "" for no time."""
    if moment is None:
        return ""
    return format_datetime(_as_utc(moment).replace(microsecond=0), usegmt=True)


class ScheduledEvent(BaseModel):
    """One entry of `Events`. Python names are snake_case; the wire names are IMDS's."""

    model_config = ConfigDict(extra="allow", populate_by_name=True, frozen=True)

    event_id: str = Field(alias="EventId", min_length=1, max_length=MAX_EVENT_ID_CHARS)
    event_status: str = Field(alias="EventStatus", max_length=MAX_NAME_CHARS)
    event_type: str = Field(alias="EventType", max_length=MAX_NAME_CHARS)
    resource_type: str = Field(
        default="VirtualMachine", alias="ResourceType", max_length=MAX_NAME_CHARS
    )
    resources: tuple[str, ...] = Field(default=(), alias="Resources", max_length=MAX_RESOURCES)
    not_before: datetime | None = Field(default=None, alias="NotBefore")
    description: str | None = Field(default=None, alias="Description")
    event_source: str | None = Field(default=None, alias="EventSource", max_length=MAX_NAME_CHARS)
    # -1: unknown (Learn); a real one is seconds to hours.
    duration_in_seconds: int | None = Field(
        default=None, alias="DurationInSeconds", ge=-1, le=MAX_DURATION_SECONDS
    )

    @field_validator("not_before", mode="before")
    @classmethod
    def _parse_not_before(cls, value: Any) -> datetime | None:
        return parse_not_before(value)

    _encodable = field_validator("event_id", "resources", "event_type", "event_status")(
        classmethod(lambda cls, value: _unicode(value))
    )

    @field_validator("description")
    @classmethod
    def _short_description(cls, value: str | None) -> str | None:
        # Free text only people read: shortened with a marker rather than rejected, so a
        # verbose (or hostile) Description never costs the event its decision.
        return shorten(value) if value is not None else None

    @field_serializer("not_before")
    def _write_not_before(self, value: datetime | None) -> str:
        return format_not_before(value)

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


class ScheduledEventsDocument(BaseModel):
    """The whole answer of `GET /metadata/scheduledevents`."""

    model_config = ConfigDict(extra="allow", populate_by_name=True, frozen=True)

    document_incarnation: int = Field(alias="DocumentIncarnation", ge=0, le=MAX_COUNTER)
    events: tuple[ScheduledEvent, ...] = Field(alias="Events", max_length=MAX_EVENTS)

    @field_validator("document_incarnation", mode="before")
    @classmethod
    def _strict_incarnation(cls, value: Any) -> Any:
        # Lax mode would turn True into 1 and "2" into 2; a document like that is broken.
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError("DocumentIncarnation must be an integer")
        return value

    def event(self, event_id: str) -> ScheduledEvent | None:
        wanted = event_id.casefold()
        return next((e for e in self.events if e.event_id.casefold() == wanted), None)

    def to_wire(self) -> dict[str, Any]:
        """The document with IMDS's field names, as IMDS would write it."""
        return self.model_dump(mode="json", by_alias=True)


def parse_document(data: bytes | str | dict[str, Any]) -> ScheduledEventsDocument:
    """Validate an IMDS answer; raise one DocumentError that says what is wrong."""
    if isinstance(data, bytes | str):
        try:
            data = json.loads(data)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise DocumentError(f"not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise DocumentError(f"not a Scheduled Events document: a JSON {type(data).__name__}")
    try:
        return ScheduledEventsDocument.model_validate(data)
    except ValidationError as exc:
        raise DocumentError(f"not a Scheduled Events document: {summarize(exc)}") from None


def summarize(exc: ValidationError) -> str:
    """Each error as `field.path: message`, on one line: the reason a row or message is
    refused, naming the field."""
    parts = []
    for error in exc.errors(include_url=False):
        where = ".".join(str(p) for p in error["loc"]) or "document"
        parts.append(f"{where}: {error['msg']}")
    return "; ".join(parts)


def content_hash(document: dict[str, Any]) -> str:
    """A stable hash of a raw document, independent of key order and white space."""
    canonical = json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


# --------------------------------------------------------------------------- envelope

ENVELOPE_SCHEMA: Final = 1


VM_ID_PATTERN = r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"


class CallbackKeyRef(BaseModel):
    """The relay's own callback secret, sent to the app (the only reader of message bodies)
    so it can sign callbacks that this VM alone accepts. `id` = sha256(secret)[:16]."""

    model_config = ConfigDict(frozen=True)

    id: str = Field(pattern=r"^[0-9a-f]{16}$")
    secret: str = Field(pattern=r"^[0-9a-f]{64}$", repr=False)
    # A relay that rotated its key: the previous key's id and its proof that this key is
    # its successor (HMAC-SHA256(previous secret, "key-proof/v1\n" + id), hex). A proved
    # rotation is not counted against MAX_NEW_KEYS_PER_VM_DAY (functions.identity.keys).
    prev: str | None = Field(default=None, pattern=r"^[0-9a-f]{16}$")
    proof: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$", repr=False)

    @model_validator(mode="after")
    def _id_names_secret(self) -> CallbackKeyRef:
        if hashlib.sha256(bytes.fromhex(self.secret)).hexdigest()[:16] != self.id:
            raise ValueError("callback_key.id is not the first 16 hex of sha256(secret)")
        if (self.prev is None) != (self.proof is None):
            raise ValueError("callback_key.prev and callback_key.proof come together")
        return self


class Attestation(BaseModel):
    """IMDS's attested document for this message (nonce = the message's binding hash)."""

    model_config = ConfigDict(frozen=True)

    signature: str = Field(min_length=1, max_length=MAX_ATTESTATION_CHARS)
    nonce: str = Field(pattern=r"^[0-9A-Za-z]{1,32}$")


class Unforwardable(BaseModel):
    """What a relay sends instead of a document too large to forward: it is then known."""

    model_config = ConfigDict(extra="allow", frozen=True)

    incarnation: int | None = Field(default=None, ge=0, le=MAX_COUNTER)
    bytes: int = Field(ge=0, le=MAX_COUNTER)
    reason: str = Field(default="", max_length=MAX_DESCRIPTION_CHARS)


class PollClocks(BaseModel):
    """A relay's polling since its previous document (relay/watcher.py `_clocks`): the
    longest time between two successful IMDS polls (the larger of the monotonic and the
    wall-clock interval) and the net jump of the guest's wall clock against its monotonic
    clock. The on-VM half of the impact ledger (functions/ledger.py)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    max_gap_s: float = Field(ge=0, le=MAX_CLOCK_SECONDS, allow_inf_nan=False)
    # A clock stepped a year is what it saw; one stepped past the times the app accepts is not.
    wall_jump_s: float = Field(ge=-MAX_CLOCK_SECONDS, le=MAX_CLOCK_SECONDS, allow_inf_nan=False)


class LedgerEntry(BaseModel):
    """One VM's measurements of one event, as its reporter row keeps them (functions/
    ledger.py): when its relay saw it Started and gone (the documents' `observed_at`,
    the guest's wall clock), the longest polling gap and the net wall-clock jump."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    event_id: str = Field(min_length=1, max_length=MAX_EVENT_ID_CHARS)
    started_seen: AwareDatetime | None = None
    left_at: AwareDatetime | None = None
    max_poll_gap_s: float = Field(default=0.0, ge=0, le=MAX_CLOCK_SECONDS, allow_inf_nan=False)
    # Two periods' jumps added up (functions/ledger.py `combined`): twice one's bound.
    wall_jump_s: float = Field(
        default=0.0, ge=-2 * MAX_CLOCK_SECONDS, le=2 * MAX_CLOCK_SECONDS, allow_inf_nan=False
    )


class VmRef(BaseModel):
    """Who sent an envelope and how to call its relay back."""

    model_config = ConfigDict(extra="allow", frozen=True)

    name: str = Field(min_length=1, max_length=MAX_NAME_CHARS)
    callback_url: str | None = Field(default=None, max_length=MAX_URL_CHARS)
    scale_set: str | None = Field(default=None, max_length=MAX_NAME_CHARS)
    availability_set: str | None = Field(default=None, max_length=MAX_NAME_CHARS)
    resource_id: str | None = Field(default=None, max_length=MAX_URL_CHARS)
    # Contract C3: from IMDS compute metadata (subscriptionId, resourceGroupName).
    subscription_id: str | None = Field(default=None, max_length=MAX_NAME_CHARS)
    resource_group: str | None = Field(default=None, max_length=MAX_NAME_CHARS)
    # The VM's vmId (IMDS compute metadata): a claim until the attested document, signed by
    # Azure, says the same. Everything else above is a claim the app never acts on.
    vm_id: str | None = Field(default=None, pattern=VM_ID_PATTERN)
    # Azure's tags on the VM, from the identity sync's facts (functions.pipeline.admission
    # sets them; a relay's own `tags`, if it sends any, are replaced with Azure's before
    # ingest reads them). Policy rules match them as budgets do; None: not known.
    tags: dict[str, str] | None = None

    _encodable = field_validator("name", "scale_set", "availability_set")(
        classmethod(lambda cls, value: _unicode(value))
    )

    @field_validator("callback_url")
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("http://", "https://")):
            raise ValueError("callback_url must be an http(s) URL")
        return value.rstrip("/") if value else value


class Envelope(BaseModel):
    """What the relay sends to Service Bus: one IMDS document (or a heartbeat) and its context.

    `document` is the IMDS answer exactly as received (a dict), so nothing the functions
    might need is lost in translation; it is validated as a document all the same.
    """

    model_config = ConfigDict(extra="allow", populate_by_name=True, frozen=True)

    schema_version: Literal[1] = Field(default=ENVELOPE_SCHEMA, alias="schema")
    # "preflight": the relay's `check` command's one test message (relay/preflight.py),
    # admitted like any other (attestation, Resource Graph), then recorded as nothing.
    kind: Literal["document", "heartbeat", "unforwardable", "preflight"]
    vm: VmRef
    relay_version: str = Field(default="unknown", max_length=MAX_NAME_CHARS)
    sequence: int = Field(ge=0, le=MAX_COUNTER)
    observed_at: AwareDatetime
    document: dict[str, Any] | None = None
    # Contract C2: "own" when the relay kept only the events naming its VM; relays from
    # before the field forwarded everything.
    events: Literal["own", "all"] = "all"
    # Per-VM identity (issue 22): the relay's callback secret and Azure's word for the VM.
    callback_key: CallbackKeyRef | None = None
    attestation: Attestation | None = None
    unforwardable: Unforwardable | None = None
    # The impact ledger (issue 33, contract §10): the relay's polling since its previous
    # document. Relays before it send none.
    polls: PollClocks | None = None
    # Contract §11 (issue 40): the relay's pending rows this document answers for (its own
    # sequence, and earlier documents' not yet seen acknowledged), which the app deletes
    # once it has the document; and how many times it was sent again for want of that.
    acks: list[Annotated[int, Field(ge=0)]] | None = Field(default=None, max_length=8)
    resent: int | None = Field(default=None, ge=1)

    @field_validator("observed_at")
    @classmethod
    def _utc(cls, value: datetime) -> datetime:
        return _as_utc(value)

    @model_validator(mode="after")
    def _document_is_a_document(self) -> Envelope:
        if self.kind == "unforwardable":
            if self.unforwardable is None:
                raise ValueError("an unforwardable envelope needs its `unforwardable` facts")
        elif self.kind == "document":
            if self.document is None:
                raise ValueError("a document envelope needs a document")
            parse_document(self.document)
        elif self.document is not None:
            parse_document(self.document)
        return self

    @property
    def scheduled_events(self) -> ScheduledEventsDocument | None:
        return parse_document(self.document) if self.document is not None else None

    def message_id(self) -> str:
        """Service Bus MessageId: equal for resends of the same document, so they are dropped.

        VM + incarnation + content hash (+ the callback key id, so a rotated key re-sends
        the current document instead of being dropped) for documents (≤ 128 characters,
        the Service Bus limit). Heartbeats use the observation time, not the sequence: a
        reimaged VM whose state directory was wiped restarts its sequence, and its new
        heartbeats must not be dropped as duplicates of the old ones. A document sent again
        for want of an acknowledgement (contract §11) adds `:r{sequence}.{resent}`.
        """
        who = self.vm.vm_id or self.vm.name[:80]
        if self.kind == "document" and self.document is not None:
            incarnation = self.document.get("DocumentIncarnation")
            key = f":{self.callback_key.id}" if self.callback_key else ""
            again = f":r{self.sequence}.{self.resent}" if self.resent else ""
            return f"{who}:{incarnation}:{content_hash(self.document)[:32]}{key}{again}"
        return f"{who}:hb:{self.observed_at.strftime('%Y%m%dT%H%M%S.%f')}"

    def to_json(self) -> str:
        return self.model_dump_json(by_alias=True)


def parse_envelope(data: bytes | str | dict[str, Any]) -> Envelope:
    """Validate an envelope; raise one DocumentError naming what is wrong."""
    try:
        if isinstance(data, dict):
            return Envelope.model_validate(data)
        return Envelope.model_validate_json(data)
    except ValidationError as exc:
        raise DocumentError(f"not a relay envelope: {summarize(exc)}") from None


def looks_like_event_grid(body: bytes | str) -> bool:
    """Cheap routing test for the documents queue, before any JSON parsing: relay envelopes
    (this module) are JSON objects with a `kind`; Event Grid bodies
    (functions.pipeline.sources.eventgrid) are arrays or carry `eventType` / `specversion`.
    A wrong guess is harmless: the chosen parser rejects it with a reason."""
    head = body.lstrip()[:1] if isinstance(body, bytes) else body.lstrip()[:1].encode()
    if head == b"[":
        return True
    text = body if isinstance(body, bytes) else body.encode()
    return b'"eventType"' in text or b'"specversion"' in text
