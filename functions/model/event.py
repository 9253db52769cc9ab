"""The message on the `notifications` topic: one announced transition of one event.

Ingest, the approver, the terminate workflow and the watchdog publish these; each channel
(Teams, Slack, PagerDuty, webhook) consumes them on its own subscription. Keeping one typed model
here means a channel never has to know how the lifecycle was computed.
"""

from __future__ import annotations

import hashlib
from datetime import datetime
from enum import StrEnum
from typing import Any, Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field

from functions.model.envelope import format_not_before

MESSAGE_ID_LIMIT = 128  # Service Bus's MessageId


class Transition(StrEnum):
    SCHEDULED = "scheduled"  # first seen, Scheduled
    DECIDED = "decided"  # the policy's decision (action, rule) is known
    APPROVED = "approved"  # StartRequests accepted by IMDS through a relay
    APPROVAL_FAILED = "approval_failed"  # no relay could approve; it starts at NotBefore
    DRAIN_STARTED = "drain_started"
    DRAIN_FAILED = "drain_failed"  # a drain step failed or ran out of time
    STARTED = "started"  # EventStatus Started (also directly, hardware failure)
    COMPLETED = "completed"  # no VM reports it any more, and it had started
    CANCELLED = "cancelled"  # no VM reports it any more, and it never started
    OVERDUE = "overdue"  # still Scheduled after NotBefore (watchdog)
    RELAY_SILENT = "relay_silent"  # a relay stopped reporting (watchdog)
    RELAY_RECOVERED = "relay_recovered"  # a relay announced silent reports again (ingest)
    POLICY_INVALID = "policy_invalid"  # the policy did not validate: failing closed
    POLICY_VALID = "policy_valid"  # a host started with a valid policy after an invalid one
    # Azure refused the app's own request for a reason asking again cannot fix (Resource
    # Graph 4xx: a query it rejects, a missing role): functions.identity.graph_state.
    CONFIG_INVALID = "config_invalid"
    CONFIG_VALID = "config_valid"  # ... and answers it again
    UNDRAINED = "undrained"  # a drained Terminate was cancelled: the instance is back
    UNDRAIN_FAILED = "undrain_failed"  # ... and undoing the drain failed (or is not set up)


Severity = Literal["critical", "error", "warning", "info"]
Action = Literal["approve", "drain", "hold"]


class Decision(BaseModel):
    """What the policy decided for an event, and why."""

    model_config = ConfigDict(frozen=True)

    action: Action
    rule: str  # the rule's name, e.g. "user-initiated" or "default-hold"
    reason: str = ""
    channels: tuple[str, ...] = ("teams", "pagerduty", "webhook", "slack")
    severity: Severity = "warning"
    page: bool = False  # PagerDuty trigger
    approve_after: AwareDatetime | None = None  # maintenance window opens
    dry_run: bool = False
    policy_error: str | None = None  # set when failing closed on an invalid policy


class EventSnapshot(BaseModel):
    """The fleet-wide view of one event at the time of the transition."""

    model_config = ConfigDict(frozen=True)

    event_id: str
    event_type: str
    event_status: str
    event_source: str | None = None
    resource_type: str = "VirtualMachine"
    resources: tuple[str, ...] = ()
    not_before: AwareDatetime | None = None
    description: str | None = None
    duration_in_seconds: int | None = None
    scale_sets: tuple[str, ...] = ()  # scale sets of the named VMs
    availability_sets: tuple[str, ...] = ()
    reported_by: tuple[str, ...] = ()  # VMs whose documents contained it
    first_seen: AwareDatetime | None = None
    # The fields in which reporters' views of this event differ (empty: they agree); the
    # decision shown is then the strictest of the decisions made on each view.
    views_differ: tuple[str, ...] = ()
    # VMs of Resources (of ReportedBy when Resources is empty) not listed here: a post cut
    # to fit the row it is kept in through a channel's outage (functions.notify.kept).
    unlisted: int = 0

    def imds_fields(self) -> dict[str, Any]:
        """The event with IMDS's own field names, for custom details and webhooks."""
        return {
            "EventId": self.event_id,
            "EventType": self.event_type,
            "EventStatus": self.event_status,
            "EventSource": self.event_source,
            "ResourceType": self.resource_type,
            "Resources": list(self.resources),
            "NotBefore": format_not_before(self.not_before),
            "Description": self.description,
            "DurationInSeconds": self.duration_in_seconds,
        }


class Links(BaseModel):
    model_config = ConfigDict(frozen=True)

    status_url: str | None = None
    approve_url: str | None = None


class Notification(BaseModel):
    """One announcement. `message_id()` makes a republish of the same transition a no-op."""

    model_config = ConfigDict(frozen=True, extra="allow")

    schema_version: Literal[1] = Field(default=1, alias="schema")
    transition: Transition
    occurred_at: AwareDatetime
    event: EventSnapshot | None = None  # None for relay_silent/_recovered, policy_invalid
    vm: str | None = None  # for relay_silent/_recovered, or the VM the transition concerns
    decision: Decision | None = None
    detail: str = ""  # human text: an error, a drain outcome, a relay's last-seen time
    # Why the event's approval waits, when it does: a disruption budget's words,
    # "waiting for budget checkout-web (1 of 1: vm-a)" (functions.model.budgets.waiting_text).
    waiting: str = ""
    # A post its channel could not deliver while it was down, kept and sent once it was
    # back (functions.notify.kept): how late, and why, e.g. "sent 2 h 5 min after it
    # happened: the channel could not be reached (HTTP 503)". Set only on that late send.
    late: str = ""
    links: Links = Links()
    # For transitions that can recur (a relay silent again later, a policy invalid again
    # after an edit, a decision made again once a fixed policy replaced a fail-closed one):
    # what tells this occurrence apart, e.g. the relay's last-seen time.
    occurrence: str | None = None
    # A relay_silent for the relays of several VMs found silent together in one sweep
    # (functions.pipeline.silence_groups): their common-cause group (scale set, else
    # subscription), in words, the VMs (up to 1,000) and how many.
    silent_group: str | None = None
    silent_label: str = ""
    silent_vms: list[str] = Field(default_factory=list)
    silent_count: int = 0

    def message_id(self) -> str:
        """The announcement's id (Service Bus MessageId, the deliveries table's key, the
        webhook's `webhook-id`), namespaced by kind: `event:<EventId>:…`, `vm:<name>:…` or
        `fleet:…`, so no EventId or name a VM chooses can be another kind's id. Within
        Service Bus's 128 characters; a longer one keeps its start and a hash of the
        whole, so two announcements never share an id by being cut at the same place."""
        if self.event is not None:
            subject = f"event:{self.event.event_id}"
        else:
            subject = f"vm:{self.vm}" if self.vm else "fleet"
        suffix = f":{self.occurrence}" if self.occurrence else ""
        whole = f"{subject}:{self.transition.value}{suffix}"
        if len(whole) <= MESSAGE_ID_LIMIT:
            return whole
        digest = hashlib.sha256(whole.encode("utf-8", "surrogatepass")).hexdigest()[:32]
        return f"{whole[: MESSAGE_ID_LIMIT - 33]}#{digest}"

    def to_json(self) -> str:
        return self.model_dump_json(by_alias=True)

    @classmethod
    def from_json(cls, data: str | bytes) -> Notification:
        return cls.model_validate_json(data)


def utc_text(moment: datetime | None) -> str:
    return moment.strftime("%Y-%m-%d %H:%M:%S UTC") if moment else "—"
