"""How the decisions on an event's views combine: pure helpers shared by ingest's decide
step (functions.pipeline.decide, which works out each VM's view), the re-decision of a
fail-closed event (functions.pipeline.redecide) and the approver."""

from __future__ import annotations

from datetime import UTC, datetime

from functions.model.envelope import ScheduledEvent
from functions.model.event import Decision
from functions.model.policy import PolicyLoad, decide
from functions.model.view import VIEW_FIELDS, VmView
from functions.store.events import Reporter
from functions.store.records import EventRecord, ViewDecision

# "Stricter" (the brief's rule, made explicit): an action that leaves the event to Azure
# beats one that acts on it, so hold > drain > approve. Between two approvals the later
# one is stricter (an approval waiting for a maintenance window beats an immediate one).
# Between equal actions, the one that pages beats the one that does not, then the higher
# severity. A fail-closed decision (invalid policy) is a hold and wins over any other
# hold, so the policy error stays visible. Ties keep the decision already made.
ACTION_RANK = {"approve": 0, "drain": 1, "hold": 2}
SEVERITY_RANK = {"info": 0, "warning": 1, "error": 2, "critical": 3}
TOO_MANY_VIEWS = "views"  # in `views_differ`: more distinct views than MAX_VIEWS
EARLIEST = datetime.min.replace(tzinfo=UTC)


def strictness(decision: Decision) -> tuple[int, int, datetime, int, int]:
    """A sort key: the larger, the stricter (see ACTION_RANK's comment)."""
    return (
        ACTION_RANK.get(decision.action, len(ACTION_RANK)),
        1 if decision.policy_error else 0,
        decision.approve_after or EARLIEST,
        1 if decision.page else 0,
        SEVERITY_RANK.get(decision.severity, 0),
    )


def stricter(current: Decision, other: Decision) -> Decision:
    """The stricter of two decisions; `current` on a tie."""
    return other if strictness(other) > strictness(current) else current


def differing_fields(entries: list[ViewDecision]) -> list[str]:
    """The policy-relevant fields (VIEW_FIELDS order) in which these views differ;
    Resources are compared by digest (an entry may keep only that)."""
    if len(entries) < 2:
        return []
    wires = [{**e.view.expect(), "Resources": e.resources_digest} for e in entries]
    return [name for name in VIEW_FIELDS if _differ(name, [w[name] for w in wires])]


def _differ(name: str, values: list[object]) -> bool:
    """IMDS blanks NotBefore once an event has Started, so a VM that saw it start and one
    that saw it scheduled do not disagree about it: NotBefore is compared only among the
    views that have one."""
    if name == "NotBefore":
        values = [v for v in values if v]
    return any(v != values[0] for v in values[1:])


def as_scheduled(view: VmView, status: str, event_id: str) -> ScheduledEvent:
    """A stored view as the event the policy reads (to decide it again)."""
    return ScheduledEvent(
        event_id=event_id,
        event_status=status,
        event_type=view.event_type,
        event_source=view.event_source,
        duration_in_seconds=view.duration_s,
        not_before=view.not_before,
        resources=view.resources,
    )


def strictest(decisions: list[Decision]) -> Decision:
    """The strictest of one or more decisions (the first on a tie)."""
    strict = decisions[0]
    for other in decisions[1:]:
        strict = stricter(strict, other)
    return strict


def redecide_views(record: EventRecord, load: PolicyLoad, now: datetime) -> list[ViewDecision]:
    """Each kept view decided afresh under `load` (for a fail-closed event once the
    policy is valid again); the caller stores them and takes their strictest. A view
    kept without its (long) Resources is decided on the event's names."""
    fresh = []
    for entry in record.views:
        view = entry.view
        if entry.resources_count and not view.resources:
            view = view.model_copy(update={"resources": tuple(record.resources)})
        seen = as_scheduled(view, record.event_status, record.event_id)
        sets = (entry.scale_set,) if entry.scale_set else ()
        decision = decide(load, seen, now, sets, tags=entry.tags)
        fresh.append(entry.model_copy(update={"decision": decision}))
    return fresh


def own_decision(record: EventRecord, key: str, kept_alone: Decision | None) -> Decision | None:
    """A VM's own decision: the one made on its view (`key`, from its reporter row) as the
    event row keeps it, else the one its reporter row kept (a view beyond MAX_VIEWS)."""
    found = next((e.decision for e in record.views if e.key == key), None)
    return found if found is not None else kept_alone


def own_views(reporters: list[Reporter], record: EventRecord) -> tuple[dict[str, VmView], set[str]]:
    """From the event's reporter rows (one partition query, `Store.reporter_rows`): each
    reporting VM's own view (by case-folded name), and the VMs whose own decision is
    stricter than the event's, whose relays the policy's approval must not use (the
    event's decision already folds every view in, so this only guards a view decided
    apart: beyond MAX_VIEWS, or after a race)."""
    views: dict[str, VmView] = {}
    stricter_own: set[str] = set()
    event = record.decision
    for reporter in reporters:
        if not reporter.status or reporter.view is None:
            continue
        views[reporter.vm.casefold()] = reporter.view
        own = own_decision(record, reporter.key, reporter.decision)
        if event is not None and own is not None and strictness(own) > strictness(event):
            stricter_own.add(reporter.vm)
    return views, stricter_own
