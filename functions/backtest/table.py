"""The events table as history: each event row (functions.store), with its distinct views.

An event row holds the event's fields, the decision (the strictest of the decisions made
on each distinct view), when it was made, the approval attempts and the end. Its `views`
keep up to MAX_VIEWS distinct views, each with the scale set of the VM that reported it;
a view beyond those is kept only in its reporter's row (with the decision made on it),
read here for the events that have such views.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import ValidationError

from functions.backtest.history import HistoryError, Past, Skipped, View, span
from functions.model.envelope import SCHEDULED, ScheduledEvent


def from_store(store: Any, since: datetime) -> tuple[list[Past], list[Skipped]]:
    """Every event row first seen at or after `since` (a scan of the event rows: the
    command's read, never the app's)."""
    from functions.store.rows import BadRow

    pasts: list[Past] = []
    skipped: list[Skipped] = []
    try:
        records = store.list_events(include_ended=True)
    except BadRow as exc:  # pragma: no cover - list_events skips bad rows itself
        raise HistoryError(f"events table: {exc}") from None
    for record in records:
        if record.first_seen < since:
            continue
        try:
            extra = _dropped_views(store, record) if record.views_dropped else ()
            pasts.append(_from_record(record, extra))
        except (ValidationError, ValueError) as exc:
            skipped.append(Skipped(record.event_id, f"unreadable event row: {exc}"))
    return pasts, skipped


def _views(record: Any) -> tuple[View, ...]:
    """The row's kept views as the policy reads them: a view kept without its (long)
    Resources, or without NotBefore (replaced once Started), takes the event's."""
    out = []
    for entry in record.views:
        out.append(_view(record, entry.view, entry.scale_set))
    return tuple(out)


def _view(record: Any, view: Any, scale_set: str | None) -> View:
    resources = view.resources or tuple(record.resources)
    event = ScheduledEvent(
        event_id=record.event_id,
        event_status=SCHEDULED,
        event_type=view.event_type,
        event_source=view.event_source,
        duration_in_seconds=view.duration_s,
        not_before=view.not_before or record.not_before,
        resources=resources,
        resource_type=record.resource_type,
    )
    return View(event, (scale_set,) if scale_set else (), view.vm)


def _dropped_views(store: Any, record: Any) -> tuple[View, ...]:
    """Views beyond MAX_VIEWS: only their reporters' rows keep them (one partition query).
    Their scale set is the VM row's (Azure's fact), as the bridge decided them."""
    kept = {entry.view.digest() for entry in record.views}
    out = []
    for reporter in store.reporter_rows(record.event_id):
        view = reporter.view
        if view is None or reporter.decision is None or view.digest() in kept:
            continue
        kept.add(view.digest())
        vm = store.get_vm(reporter.vm)
        out.append(_view(record, view, vm.scale_set if vm is not None else None))
    return tuple(out)


def _from_record(record: Any, dropped: tuple[View, ...] = ()) -> Past:
    event = ScheduledEvent(
        event_id=record.event_id,
        event_status=SCHEDULED,
        event_type=record.event_type,
        resource_type=record.resource_type,
        resources=tuple(record.resources),
        not_before=record.not_before,
        description=record.description,
        event_source=record.event_source,
        duration_in_seconds=record.duration_in_seconds,
    )
    decision = record.decision
    # The attempt that approved it is the last one (a relay's "approved", ARM's answer text).
    attempts = record.approval_attempts
    approved = attempts[-1] if record.approval == "approved" and attempts else None
    started_at = approved.at if approved is not None else None
    # IMDS gives NotBefore while an event is Scheduled: none at all means it was first
    # seen Started (a host failure), with nothing to decide whatever the row says.
    no_notice = record.started and (decision is None or record.not_before is None)
    if started_at is None and record.started:
        started_at = record.first_seen if no_notice else record.not_before
    words = []
    if no_notice:
        words.append("first seen Started: no notice")
        if decision is not None:
            words.append(f"recorded {decision.action} ({decision.rule})")
    elif decision is None:
        words.append("not decided")
    else:
        words.append(f"{decision.action} ({decision.rule})")
        if decision.dry_run:
            words.append("dry run")
    if record.approval == "approved" and approved is not None:
        lead = _lead(record.not_before, approved.at)
        words.append(f"approved by {record.approved_by or approved.by}{lead}")
    elif record.approval == "failed":
        words.append("approval failed: it started at NotBefore")
    elif decision is not None and record.started and not no_notice:
        words.append("started at NotBefore")
    if record.views_differ:
        words.append(f"views differ in {', '.join(record.views_differ)}")
    if record.ended:
        words.append(record.ended)
    return Past(
        event=event,
        source="table",
        first_seen=record.first_seen,
        scale_sets=tuple(record.scale_sets),
        availability_sets=tuple(record.availability_sets),
        no_notice=no_notice,
        started_at=started_at,
        ended_at=record.ended_at,
        end=record.ended,
        actual_action=decision.action if decision else None,
        actual_rule=decision.rule if decision else None,
        actual=", ".join(words),
        decided_at=record.decided_at,
        views=_views(record) + dropped,
    )


def _lead(not_before: datetime | None, at: datetime) -> str:
    if not_before is None:
        return ""
    seconds = (not_before - at).total_seconds()
    if seconds >= 0:
        return f", {span(seconds)} before NotBefore"
    return f", {span(-seconds)} after NotBefore"
