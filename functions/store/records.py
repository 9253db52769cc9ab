"""The rows the function app keeps, one pydantic model each.

Each record is stored as JSON in one `data` column (plus a few plain columns for people
browsing the tables), so the schema lives here and nowhere else.
"""

from __future__ import annotations

from typing import Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, field_validator

from functions.model.envelope import LedgerEntry
from functions.model.event import Decision, EventSnapshot
from functions.model.view import VmView

MAX_ATTEMPTS_KEPT = 50
MAX_TEXT = 2000  # Description, reasons: far below the 64 KiB property limit
MAX_OUTCOME = 300  # one approval attempt's outcome text
MAX_RESOURCES = 2000  # VM names kept on an event row (IMDS names far fewer per event)
MAX_SETS = 200  # scale sets / availability sets kept on an event row
MAX_NAME_CHARS = 150_000  # characters of names in one such list (the row stays < 1 MiB)
MAX_REPORTED_BY = 100  # names in a notification's ReportedBy (Resources has them all)
MAX_VIEWS = 8  # distinct views of one event kept on its row (genuine reporters share one)

ApprovalState = Literal["", "pending", "in_progress", "approved", "failed"]
EndState = Literal["", "completed", "cancelled"]


class Record(BaseModel):
    model_config = ConfigDict(validate_assignment=False)

    etag: str | None = Field(default=None, exclude=True)


class VmRecord(Record):
    name: str  # Azure's name for the VM (Resource Graph), never the relay's claim
    vm_id: str | None = None  # Azure's vmId, from the attested document; keys its identity
    last_sequence: int = -1
    last_observed_at: AwareDatetime | None = None
    last_incarnation: int | None = None
    last_seen: AwareDatetime | None = None  # when we last received anything from it
    callback_url: str | None = None
    scale_set: str | None = None
    availability_set: str | None = None
    resource_id: str | None = None
    relay_version: str | None = None
    event_ids: list[str] = Field(default_factory=list)  # in its latest document
    # EventId (case-folded) -> the status this VM last reported, so a document that
    # repeats it writes no reporter row again.
    event_statuses: dict[str, str] = Field(default_factory=dict)
    # EventIds (case-folded) this VM first listed after the event had ended: its reporter
    # row says past reporter once, and ending is final, so its later documents that list
    # the event (or stop listing it) write nothing more for it.
    late_event_ids: list[str] = Field(default_factory=list)
    silent_announced_for: str | None = None  # the last_seen whose silence was announced
    silence_claim: str = ""  # its announcement's claim (functions.store.claims)
    # The silence (its `silent_announced_for`) whose end is being announced as
    # relay_recovered, and that announcement's claim; cleared once published (the watchdog
    # republishes one left behind by a crash).
    recovery_pending: str | None = None
    recovery_claim: str = ""
    # What this VM sent in its current hour (functions.pipeline.ingest.over_rate): one VM
    # may not create rows without bound.
    window_start: AwareDatetime | None = None
    window_messages: int = 0
    window_new_events: int = 0
    # The EventId of an event approved through this VM's relay that its own document
    # still listed as Scheduled after the start grace (Azure starts an approved event at
    # once): its relay is suspect, so it is not asked to approve its later events until
    # UNSTARTED_FOR after `unstarted_at` (functions.pipeline.relay_phase.suspect). Its own
    # documents cannot clear it: a Started it lists may be made up as well.
    unstarted: str | None = None
    unstarted_at: AwareDatetime | None = None
    # EventId (case-folded) -> the key of this VM's view of it (functions.pipeline.decide),
    # so a document that repeats the same view writes no reporter row again.
    event_views: dict[str, str] = Field(default_factory=dict)


class ViewDecision(BaseModel):
    """One distinct view of an event (functions.model.view) and the decision made on it.

    Genuine reporters of one EventId see the same event, so they share one entry; a VM
    whose IMDS shows something else (or that lies) gets an entry of its own, decided on
    its own view. `first_vm` reported it first: a VM whose own view moves (Azure
    rescheduled its event) replaces the entry it made instead of adding one."""

    key: str
    view: VmView  # Resources left out when long (functions.pipeline.decide.kept_view)
    resources_digest: str = ""
    resources_count: int = 0
    scale_set: str | None = None  # Azure's scale set of `first_vm`, which rules may match
    # The tags of `first_vm` that the policy's rules name (Azure's, functions.model.policy
    # rule_tags: only those, so the row stays small); None: not known when it was decided.
    tags: dict[str, str] | None = None
    decision: Decision
    decided_at: AwareDatetime
    first_vm: str


class Attempt(BaseModel):
    at: AwareDatetime
    vm: str | None
    outcome: str  # "approved", "refused 409: ...", "error: ...", "503"
    by: str = "policy"

    @field_validator("outcome", "by")
    @classmethod
    def _bounded(cls, value: str) -> str:
        return clip(value, MAX_OUTCOME)


class EventRecord(Record):
    event_id: str
    event_type: str
    event_status: str
    event_source: str | None = None
    resource_type: str = "VirtualMachine"
    resources: list[str] = Field(default_factory=list)
    not_before: AwareDatetime | None = None
    description: str | None = None
    duration_in_seconds: int | None = None
    scale_sets: list[str] = Field(default_factory=list)
    availability_sets: list[str] = Field(default_factory=list)
    first_seen: AwareDatetime
    started: bool = False
    # Not stored in the event row: each reporter is its own row in the event's partition
    # (functions.store.events), filled in by `Store.load_reporters` when needed.
    reporters: dict[str, str] = Field(default_factory=dict, exclude=True)  # VM -> status
    past_reporters: list[str] = Field(default_factory=list, exclude=True)
    # ... and when each reporter's relay saw what its status says (its `seen`, else `at`).
    reporter_seen: dict[str, AwareDatetime] = Field(default_factory=dict, exclude=True)
    # Not stored either: each reporting VM's own view (case-folded name -> VmView), from
    # its reporter row, filled by the approver (functions.pipeline.views.own_views).
    reporter_views: dict[str, VmView] = Field(default_factory=dict, exclude=True)
    # Not stored either: each reporter's relay measurements (the impact ledger, VM ->
    # entry), from its reporter row, filled by `Store.load_reporters(ledger=True)`.
    ledger: dict[str, LedgerEntry] = Field(default_factory=dict, exclude=True)
    # ... and for each reporter whose measurements cannot be read, why (VM -> reason).
    ledger_unreadable: dict[str, str] = Field(default_factory=dict, exclude=True)
    resources_dropped: int = 0  # names beyond MAX_RESOURCES, not kept
    ended: EndState = ""
    ended_at: AwareDatetime | None = None
    # Who ended it: "reporters" (every VM that reported it stopped listing it, or went
    # silent) or "azure" (Event Grid said so, or never said more). An end the reporters
    # made is theirs alone: a VM that had not reported the event and lists it afterwards
    # reopens it for itself (issue 31), so a set-mate that listed and dropped a victim's
    # event cannot end it for the victim. `reopened` counts those, and gives the next end
    # announcement its own MessageId.
    ended_by: Literal["", "reporters", "azure"] = ""
    end_detail: str = ""  # why, when it ended without a word from Azure or a relay
    reopened: int = 0
    decision: Decision | None = None
    decided_at: AwareDatetime | None = None
    # When a valid policy replaced a fail-closed decision (functions.pipeline.redecide); also what
    # tells that second `decided` announcement apart from a first one.
    redecided_at: AwareDatetime | None = None
    approval: ApprovalState = ""
    approval_reason: str = ""
    # The claim (functions.store.claims) of whoever is approving it right now: its holder
    # names the message or work item that took it ("doc:<vm>:<sequence>", "grid:<id>"),
    # so the same one delivered again (its host died) takes it over at once, and its
    # expiry says when anyone else may.
    approval_claim: str = ""
    approve_after: AwareDatetime | None = None
    approved_by: str | None = None
    approval_attempts: list[Attempt] = Field(default_factory=list)
    # transition key -> "pending:<iso time>" while being published, "done" after.
    announced: dict[str, str] = Field(default_factory=dict)
    # When the ARM approver first sent an acknowledge (written before the call): ARM's
    # acknowledge takes no dedupe key, so a takeover whose repeat gets 409 asks Azure
    # whether that earlier acknowledge landed (functions.pipeline.approve_arm).
    arm_sent_at: AwareDatetime | None = None
    # The same for the relay path: when the first StartRequests call went to which VM's
    # relay (written before the call). A claim left in progress by a host that died after
    # the relay's IMDS took it is settled from these once the VM reports Started before
    # NotBefore (functions.pipeline.due.settled_path).
    relay_sent_at: AwareDatetime | None = None
    relay_sent_to: str | None = None
    # When a reporter (its relay's observation, bounded by the app's clock) or Azure first
    # said Started: how long a Started event keeps its capacity slots.
    started_at: AwareDatetime | None = None
    # A person's approval (the pages, the JSON API): who asked ("manual:<who>") and when.
    # Recorded by the request, carried out by the decider like any approval: it is due
    # until an attempt of that person's at or after `asked_at` is recorded.
    asked_by: str = ""
    asked_at: AwareDatetime | None = None
    # What the drain workflow last returned for it from a reconcile ("approved",
    # "approval_failed", "held", "skipped"): the drain is due from the row until then.
    drain_outcome: str = ""
    # What the approval waits for ("waiting for budget checkout-web (1 of 1: vm-a)"), shown
    # on the cards and the pages; "" when it waits for nothing.
    waiting_for: str = ""
    # Azure started it: counted in its disruption budgets' groups (over the limit if full,
    # and shown so), once.
    budget_counted: bool = False
    # ARM id of the VM / scale set / availability set that owns the event, as Event Grid
    # named it (functions.pipeline.sources): where the ARM approver acknowledges it.
    arm_resource: str | None = None
    # Whose words the event's text (type, description, duration) is: "azure" once Event
    # Grid described it, else the VM whose report created the row. Shown attributed, and
    # where reporters' views differ, as a conflict (`snapshot`): one VM's words are never
    # the event's text for everyone.
    described_by: str = ""
    # The distinct views reporters gave of this event, each with the decision made on it
    # (functions.pipeline.decide). `decision` above is the strictest of them: it is what
    # an action taken for the whole event follows. `views_differ` names the fields that
    # differ between them (empty: every reporter agrees), `views_dropped` counts views
    # beyond MAX_VIEWS, decided for their VM alone (its reporter row keeps that decision).
    views: list[ViewDecision] = Field(default_factory=list)
    views_differ: list[str] = Field(default_factory=list)
    views_dropped: int = 0

    @field_validator("approval_reason")
    @classmethod
    def _short_reason(cls, value: str) -> str:
        return clip(value, MAX_TEXT)

    def shown_text(self) -> tuple[str, str | None]:
        """(EventType, Description) as operators read them (cards, PagerDuty, the pages).
        Azure's words where Event Grid described the event; else, where reporters' views
        differ in what an operator decides on (type, source, duration), the conflict, each
        view attributed to the VM that showed it first, and the first reporter's words
        attributed to it: one VM's words are never the event's text for everyone."""
        kinds = {"EventType", "EventSource", "DurationInSeconds"}
        if self.described_by == "azure" or not kinds & set(self.views_differ):
            return self.event_type, self.description
        types: dict[str, list[str]] = {}
        for entry in self.views:
            types.setdefault(entry.view.event_type, []).append(entry.first_vm)
        shown = " / ".join(f"{kind} ({', '.join(vms)})" for kind, vms in types.items())
        each = "; ".join(
            f"{e.first_vm}: {e.view.event_type}, {e.view.event_source or '?'}, "
            f"{_duration(e.view.duration_s)}"
            for e in self.views
        )
        text = f"reporters' views differ ({', '.join(self.views_differ)}): {each}"
        if self.description:
            text += f". {self.described_by or 'the first reporter'} said: {self.description}"
        return clip(shown, 300), clip(text, MAX_TEXT)

    def snapshot(self) -> EventSnapshot:
        event_type, description = self.shown_text()
        return EventSnapshot(
            event_id=self.event_id,
            event_type=event_type,
            event_status=self.event_status,
            event_source=self.event_source,
            resource_type=self.resource_type,
            resources=tuple(self.resources),
            not_before=self.not_before,
            description=description,
            duration_in_seconds=self.duration_in_seconds,
            scale_sets=tuple(self.scale_sets),
            availability_sets=tuple(self.availability_sets),
            reported_by=tuple(sorted({*self.past_reporters, *self.reporters}))[:MAX_REPORTED_BY],
            first_seen=self.first_seen,
            views_differ=tuple(self.views_differ),
        )


def _duration(seconds: int | None) -> str:
    if seconds is None or seconds < 0:
        return "duration unknown"
    return f"{seconds} s"


def clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


MAX_WAITING = 500  # events one slot row lists as waiting (the rest wait unlisted)


class CapacityRecord(Record):
    key: str
    holders: list[str] = Field(default_factory=list)
    # Written by older versions (a lapse per holder); whether a holder still holds is now
    # read from its own row (functions.pipeline.slot_rules.holds_slot).
    until: dict[str, AwareDatetime] = Field(default_factory=dict)
    # EventId -> when it took its slot (functions.pipeline.slot_rules.TAKE_GRACE).
    taken: dict[str, AwareDatetime] = Field(default_factory=dict)
    # EventId -> its NotBefore, for events waiting for a slot here: admitted earliest
    # NotBefore first, and woken when a slot is given back.
    waiting: dict[str, AwareDatetime | None] = Field(default_factory=dict)
