"""One VM's view of one event: the fields a decision reads, as that VM's own IMDS showed them.

Azure lets any VM named in an event's `Resources` approve it for all of them, and every VM
of an availability set sees every other VM's events, so a VM's *description* of a shared
event is an attacker's input about every other VM. The bridge therefore stores each
reporting VM's view beside the event, decides each VM's approval on its own view only, and
sends that same view to the relay that is asked to approve: the relay approves only when its
own IMDS shows the event with these fields and naming itself (`Expect` in the callback body).

This module is the shared contract between ingest (which stores views), the approver (which
sends one) and the relay (which checks it): keep the wire form (`expect()`) stable.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, Field

# The policy-relevant fields, in the order the relay reports a difference.
VIEW_FIELDS = ("EventType", "EventSource", "DurationInSeconds", "NotBefore", "Resources")


class EventFields(Protocol):
    """The fields a view is made of, as an IMDS event (ScheduledEvent) or the event's row
    (EventRecord) carries them."""

    @property
    def event_type(self) -> str: ...
    @property
    def event_source(self) -> str | None: ...
    @property
    def duration_in_seconds(self) -> int | None: ...
    @property
    def not_before(self) -> datetime | None: ...
    @property
    def resources(self) -> Sequence[str]: ...


class VmView(BaseModel):
    """What `vm` (Azure's name for the reporting VM) saw of one EventId."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    vm: str
    event_type: str
    event_source: str | None = None
    duration_s: int | None = None  # -1 unknown, 0 no impact, None not given (old api-version)
    not_before: datetime | None = None  # aware UTC; None once Started (IMDS writes "")
    resources: tuple[str, ...] = Field(default_factory=tuple)  # sorted, casefolded

    @classmethod
    def of(cls, vm: str, event: EventFields) -> VmView:
        """`vm`'s view made of `event`'s fields: from its own IMDS event (ingest), or from
        the event's row for a named VM that has not reported it (the approver)."""
        return cls(
            vm=vm,
            event_type=event.event_type,
            event_source=event.event_source,
            duration_s=event.duration_in_seconds,
            not_before=event.not_before,
            resources=normalise_resources(tuple(event.resources)),
        )

    def expect(self) -> dict[str, Any]:
        """The callback's `Expect` entry for this event: what the relay must see in IMDS.

        NotBefore travels as ISO 8601 UTC (`2026-11-25T10:00:00Z`) or "" when Started; the
        relay compares instants, not spellings (IMDS writes RFC 1123)."""
        return {
            "EventType": self.event_type,
            "EventSource": self.event_source,
            "DurationInSeconds": self.duration_s,
            "NotBefore": _iso(self.not_before),
            "Resources": list(self.resources),
        }

    def digest(self) -> str:
        """A short stable digest of `expect()`: two VMs whose views agree have the same one,
        so 'views differ' is one comparison per reporter."""
        body = json.dumps(self.expect(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(body.encode()).hexdigest()[:16]


def _iso(moment: datetime | None) -> str:
    if moment is None:
        return ""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def normalise_resources(names: list[str] | tuple[str, ...]) -> tuple[str, ...]:
    return tuple(sorted({n.casefold() for n in names}))
