"""Decide each past event under a candidate policy, then ask what that would have done.

The decision is `functions.model.policy.decide` itself (the app's pure function), made at
the moment the bridge made (or would have made) it: the table's `decided_at`, else the
first time the event was seen, else (Resource Graph has neither) its NotBefore. The
capacity guard is left out on purpose: the peaks below are what it would have had to hold
back, reported against `max_concurrent_per_set`.

When each VM would have been taken away under the candidate (its impact interval):
- approve: from the decision (or from `approve_after`, the window's opening);
- drain: from the decision (the drain takes the VM out of service first); a drain with no
  drain step configured holds until NotBefore instead, as the app does;
- hold: from NotBefore, when Azure starts it anyway.
It lasts as long as it really did (started to gone, when the record knows both), else
`DurationInSeconds` when positive, else an instant. An event Azure cancelled counts only
if the candidate would have let it start before Azure withdrew it. Only impactful events
count (functions.model.policy.is_impactful: all but short Freezes), as for the guard.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from functions.backtest.history import Past, Skipped
from functions.model.event import Decision
from functions.model.policy import Policy, decide, is_impactful
from functions.pipeline.views import strictest


@dataclass(frozen=True)
class Replayed:
    """One event: the candidate's decision beside what was decided or happened."""

    past: Past
    decided_at: datetime | None  # when the candidate decides it (None: no notice)
    decision: Decision | None  # None: first seen Started, nothing to decide
    effective: str  # what the decision does: approve / drain / hold / "" (nothing to decide)
    impact_start: datetime | None
    impact_end: datetime | None
    impactful: bool
    note: str = ""  # e.g. "drain: no drain step configured, held until NotBefore"

    @property
    def changed(self) -> bool | None:
        """Whether the candidate decides otherwise than the bridge did (None: unknown)."""
        if self.past.actual_action is None or self.decision is None:
            return None
        return (self.decision.action, self.decision.rule) != (
            self.past.actual_action,
            self.past.actual_rule,
        )


@dataclass(frozen=True)
class Peak:
    """The worst moment of one scale set or availability set under the candidate."""

    kind: str  # "scale set" / "availability set"
    name: str
    peak: int
    at: datetime
    event_ids: tuple[str, ...]
    limit: int  # the candidate's max_concurrent_per_set

    @property
    def over(self) -> int:
        return max(0, self.peak - self.limit)


@dataclass(frozen=True)
class Hold:
    """A hold that would have run to NotBefore: how long the VM would have waited."""

    event_id: str
    event_type: str
    resources: tuple[str, ...]
    held_from: datetime
    not_before: datetime
    rule: str
    why: str

    @property
    def seconds(self) -> float:
        return (self.not_before - self.held_from).total_seconds()


@dataclass
class Backtest:
    source: str
    policy_source: str
    since: datetime
    now: datetime
    limit: int
    events: list[Replayed] = field(default_factory=list)
    peaks: list[Peak] = field(default_factory=list)
    holds: list[Hold] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)
    # The candidate's disruption budgets replayed (functions.backtest.budgets), when it
    # has any: each group's peak and the approvals that would have waited.
    budgets: Any = None

    @property
    def changed(self) -> list[Replayed]:
        return [r for r in self.events if r.changed]


def replay(
    policy: Policy,
    pasts: list[Past],
    *,
    source: str,
    policy_source: str,
    since: datetime,
    now: datetime,
    drain_configured: bool = True,
    skipped: list[Skipped] | None = None,
) -> Backtest:
    """The whole backtest: each event decided, then the peaks and the holds."""
    ordered = sorted(pasts, key=lambda p: (_moment(p) or now, p.event_id))
    result = Backtest(source, policy_source, since, now, policy.max_concurrent_per_set)
    result.skipped = list(skipped or [])
    for past in ordered:
        result.events.append(_replay_one(policy, past, now, drain_configured))
    result.peaks = peaks(result.events, policy.max_concurrent_per_set)
    result.holds = [hold for r in result.events if (hold := _hold(r)) is not None]
    return result


def _moment(past: Past) -> datetime | None:
    """When the bridge decided, or would have: decided_at, first seen, else NotBefore."""
    return past.decided_at or past.first_seen or past.event.not_before


def _replay_one(policy: Policy, past: Past, now: datetime, drain_configured: bool) -> Replayed:
    impactful = is_impactful(past.event)
    if past.no_notice:
        start = past.started_at or past.first_seen
        return Replayed(
            past,
            None,
            None,
            "",
            start,
            _end(past, start),
            impactful,
            "first seen Started: no notice, nothing to decide",
        )
    at = _moment(past) or now
    note = ""
    if past.views:
        # As the bridge does: each distinct view decided on its own, the strictest acts.
        decision = strictest([decide(policy, v.event, at, v.scale_sets) for v in past.views])
        if len(past.views) > 1:
            note = f"{len(past.views)} distinct views decided, the strictest acts"
    else:
        decision = decide(policy, past.event, at, past.scale_sets)
    effective = decision.action
    if decision.dry_run:
        effective, note = "hold", _join(note, "dry run: nothing is approved")
    elif decision.action == "drain" and not drain_configured:
        effective = "hold"
        note = _join(note, "drain: no drain step configured, held until NotBefore")
    not_before = past.event.not_before
    if effective == "hold":
        start = not_before
    elif effective == "approve" and decision.approve_after is not None:
        start = decision.approve_after
    else:
        start = at
    withdrawn = past.ended_at if past.end == "cancelled" else None
    if start is not None and withdrawn is not None and start >= withdrawn:
        start = None  # Azure withdrew it first: under the candidate it never started
    return Replayed(past, at, decision, effective, start, _end(past, start), impactful, note)


def _join(first: str, second: str) -> str:
    return f"{first}; {second}" if first else second


def _end(past: Past, start: datetime | None) -> datetime | None:
    if start is None:
        return None
    if past.started_at is not None and past.ended_at is not None:
        lasted = past.ended_at - past.started_at
        if lasted > timedelta(0):
            return start + lasted
    duration = past.event.duration_in_seconds
    if duration is not None and duration > 0:
        return start + timedelta(seconds=duration)
    return start


def peaks(events: list[Replayed], limit: int) -> list[Peak]:
    """For each set, the most impactful events overlapping at once (an instant counts at
    its moment; an event ending when another starts does not overlap it)."""
    spans: dict[tuple[str, str], list[tuple[datetime, datetime, str]]] = defaultdict(list)
    names: dict[tuple[str, str], str] = {}
    for r in events:
        if not r.impactful or r.impact_start is None or r.impact_end is None:
            continue
        groups = [("scale set", s) for s in r.past.scale_sets]
        groups += [("availability set", a) for a in r.past.availability_sets]
        for kind, name in groups:
            key = (kind, name.casefold())
            names.setdefault(key, name)
            spans[key].append((r.impact_start, r.impact_end, r.past.event_id))
    out = []
    for key, items in spans.items():
        best: tuple[int, datetime, tuple[str, ...]] | None = None
        for moment, _, _ in items:
            # The count is highest at some event's start: count at each one.
            on = tuple(sorted(i for s, e, i in items if s <= moment and _on(s, e, moment)))
            if best is None or len(on) > best[0]:
                best = (len(on), moment, on)
        assert best is not None
        out.append(Peak(key[0], names[key], best[0], best[1], best[2], limit))
    return sorted(out, key=lambda p: (-p.peak, p.kind, p.name.casefold()))


def _on(start: datetime, end: datetime, moment: datetime) -> bool:
    """Whether an impact that began by `moment` still holds then (an instant, at it)."""
    return moment < end or start == end == moment


def _hold(r: Replayed) -> Hold | None:
    if r.decision is None or r.effective != "hold" or r.decided_at is None:
        return None
    not_before = r.past.event.not_before
    if not_before is None or not_before <= r.decided_at:
        return None
    if r.past.end == "cancelled" and r.past.ended_at is not None and r.past.ended_at < not_before:
        return None  # Azure withdrew it before NotBefore: the hold never ran out
    why = r.note or r.decision.reason or f"rule {r.decision.rule!r}: hold"
    return Hold(
        r.past.event_id,
        r.past.event.event_type,
        r.past.event.resources,
        r.decided_at,
        not_before,
        r.decision.rule,
        why,
    )
