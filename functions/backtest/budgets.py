"""Disruption budgets replayed on history: each group's worst moment, and who would wait.

Given the replayed events (functions.backtest.replay: when the candidate would take each
VM away, and for how long) and where Azure places each VM (`Placement`s, from an export
or the identity sync's rows), this says, per budget group:

- the **peak**: the most VMs out at once under the candidate without any budget (what the
  budget would have had to hold back), against the group's limit;
- the **waits**: replaying the budgets as the lifecycle enforces them. An approval (or a
  drain, or a window's opening) that finds a group full waits; waiting events are served
  oldest NotBefore first as slots free; one still waiting at NotBefore starts then anyway
  (Azure's rule) and counts over budget. An event the candidate holds, or one first seen
  Started, starts when it did and never waits. Each wait is listed with the budget it
  waited for, from when, to when, and whether NotBefore ended it.

A VM without a placement (no export row, not synced) is counted only by the default
budget over sets, from the event's own set when it names exactly one; such VMs are listed.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from functions.backtest.history import HistoryError, graph_rows, read_json
from functions.backtest.replay import Replayed
from functions.identity.facts import read_tags, read_zone
from functions.model.budgets import (
    Budget,
    Placement,
    Slot,
    counted_in,
    disruptive,
    effective_budgets,
    slots_for,
)

_ID = re.compile(
    r"^/subscriptions/(?P<sub>[^/]+)/resourceGroups/(?P<rg>[^/]+)/providers/"
    r"Microsoft\.Compute/(?:virtualMachines/(?P<vm>[^/]+)|virtualMachineScaleSets/"
    r"(?P<ss>[^/]+)/virtualMachines/(?P<instance>[^/]+))$",
    re.IGNORECASE,
)
# What `--placements FILE` is: the VMs with their tags and zones, from Resource Graph.
PLACEMENTS_QUERY = (
    "resources | where type =~ 'microsoft.compute/virtualmachines' | project id, "
    "subscriptionId, tags, zones, scaleSetId = tostring(properties.virtualMachineScaleSet.id), "
    "availabilitySetId = tostring(properties.availabilitySet.id)"
)


@dataclass(frozen=True)
class BudgetPeak:
    budget: str
    group: str
    limit: int
    peak: int  # VMs out at once without budgets
    at: datetime
    vms: tuple[str, ...]
    peak_enforced: int  # ... with the budgets replayed (above limit only at NotBefore)

    @property
    def over(self) -> int:
        return max(0, self.peak - self.limit)


@dataclass(frozen=True)
class BudgetWait:
    event_id: str
    vms: tuple[str, ...]
    budget: str  # the first full group's budget when it came
    group: str
    holders: tuple[str, ...]  # who held that group then
    waited_from: datetime
    until: datetime
    at_not_before: bool  # still waiting at NotBefore: Azure started it then
    over: bool  # ... with its group still full: out over budget

    @property
    def seconds(self) -> float:
        return (self.until - self.waited_from).total_seconds()


@dataclass
class BudgetReplay:
    budgets: tuple[Budget, ...]
    peaks: list[BudgetPeak] = field(default_factory=list)
    waits: list[BudgetWait] = field(default_factory=list)
    unplaced: list[str] = field(default_factory=list)  # VMs with no placement


@dataclass
class _Item:
    replayed: Replayed
    start: datetime
    length: Any  # timedelta
    not_before: datetime | None
    can_wait: bool
    needs: dict[Slot, list[str]]  # slot -> the event's VMs in it


def read_placements(path: str) -> dict[str, list[Placement]]:
    """`--placements FILE`: an `az graph query` export of PLACEMENTS_QUERY (uniform
    scale-set instances from `computeresources` too), by VM name (case-folded)."""
    rows = graph_rows(read_json(path, "a placements export"), path)
    out: dict[str, list[Placement]] = {}
    for index, row in enumerate(rows):
        if not isinstance(row, dict):
            raise HistoryError(f"{path}: row {index} is not an object")
        match = _ID.match(str(row.get("id") or ""))
        if match is None:
            continue  # not a VM: the query's other rows
        if match["vm"]:
            name = match["vm"]
            scale_set = str(row.get("scaleSetId") or "").rstrip("/").rsplit("/", 1)[-1] or None
        else:
            scale_set, name = match["ss"], f"{match['ss']}_{match['instance']}"
        availability = str(row.get("availabilitySetId") or "").rstrip("/").rsplit("/", 1)[-1]
        placement = Placement(
            name=name,
            subscription=str(row.get("subscriptionId") or match["sub"]).casefold(),
            resource_group=match["rg"],
            zone=read_zone(row.get("zones")),
            scale_set=scale_set,
            availability_set=availability or None,
            tags=read_tags(row.get("tags"))[0],
        )
        out.setdefault(name.casefold(), []).append(placement)
    return out


def replay_budgets(
    policy_budgets: Sequence[Budget],
    max_concurrent_per_set: int,
    events: Sequence[Replayed],
    placements: Callable[[str], list[Placement] | None],
    sizes: Mapping[tuple[str, str], int] | Callable[[str, str], int | None],
) -> BudgetReplay:
    """The budgets' peaks and waits over `events` (see the module docstring)."""
    budgets = effective_budgets(policy_budgets, max_concurrent_per_set)
    result = BudgetReplay(budgets)
    items: list[_Item] = []
    unplaced: set[str] = set()
    for r in events:
        if r.impact_start is None or r.impact_end is None or not disruptive(r.past.event):
            continue
        needs: dict[Slot, list[str]] = {}
        for vm in r.past.event.resources:
            found = placements(vm)
            if not found:
                unplaced.add(vm)
                found = [_from_event(vm, r)]
            for slot in slots_for(budgets, r.past.event, found, sizes):
                needs.setdefault(slot, []).append(vm)
        if not needs:
            continue
        can_wait = r.decision is not None and r.effective in ("approve", "drain")
        items.append(
            _Item(
                r,
                r.impact_start,
                r.impact_end - r.impact_start,
                r.past.event.not_before,
                can_wait and r.past.event.not_before is not None,
                needs,
            )
        )
    result.unplaced = sorted(unplaced, key=str.casefold)
    result.peaks = _peaks(items, _enforce(items, result.waits))
    return result


def _from_event(vm: str, r: Replayed) -> Placement:
    """A VM without Azure's placement: its set, when the event names exactly one."""
    sets, avsets = r.past.scale_sets, r.past.availability_sets
    return Placement(
        name=vm,
        scale_set=sets[0] if len(sets) == 1 and not avsets else None,
        availability_set=avsets[0] if len(avsets) == 1 and not sets else None,
    )


def _enforce(items: list[_Item], waits: list[BudgetWait]) -> dict[int, tuple[datetime, datetime]]:
    """When each item would really be out with the budgets enforced: id(item) -> span."""
    pending = sorted(items, key=lambda i: (i.start, i.replayed.past.event_id))
    waiting: list[tuple[_Item, Slot, tuple[str, ...]]] = []
    active: list[tuple[datetime, _Item]] = []
    spans: dict[int, tuple[datetime, datetime]] = {}

    def used(slot: Slot) -> list[str]:
        return [vm for _, item in active for vm in item.needs.get(slot, [])]

    def full(item: _Item) -> Slot | None:
        for slot, vms in item.needs.items():
            if len(used(slot)) + len(vms) > slot.limit:
                return slot
        return None

    def admit(item: _Item, at: datetime) -> None:
        spans[id(item)] = (at, at + item.length)
        active.append((at + item.length, item))

    while pending or waiting:
        # The next moment anything changes: an arrival, an end, a NotBefore reached.
        moments = [pending[0].start] if pending else []
        moments += [end for end, _ in active]
        moments += [w.not_before for w, _, _ in waiting if w.not_before is not None]
        now = min(moments)
        active[:] = [(end, item) for end, item in active if end > now]
        while pending and pending[0].start <= now:
            item = pending.pop(0)
            blocked = full(item)
            if blocked is None or not item.can_wait:
                admit(item, now)  # room, or it starts whatever a budget says
            else:
                waiting.append((item, blocked, tuple(used(blocked))))
        # Oldest NotBefore first: a later waiter never takes a slot an older one waits for.
        waiting.sort(key=lambda w: (w[0].not_before, w[0].start))
        reserved: set[Slot] = set()
        for entry in list(waiting):
            item, blocked, holders = entry
            forced = item.not_before is not None and now >= item.not_before
            room = full(item) is None and not reserved & set(item.needs)
            if not (forced or room):
                reserved |= set(item.needs)
                continue
            over = full(item) is not None
            waiting.remove(entry)
            admit(item, now)
            event = item.replayed.past
            waits.append(
                BudgetWait(
                    event.event_id,
                    tuple(event.event.resources),
                    blocked.budget,
                    blocked.group,
                    holders,
                    item.start,
                    now,
                    forced,
                    over,
                )
            )
    waits.sort(key=lambda w: (w.waited_from, w.event_id))
    return spans


def _peaks(
    items: list[_Item], enforced: Mapping[int, tuple[datetime, datetime]]
) -> list[BudgetPeak]:
    by_slot: dict[Slot, list[tuple[datetime, datetime, datetime, datetime, list[str]]]] = {}
    for item in items:
        start, end = item.start, item.start + item.length
        e_start, e_end = enforced.get(id(item), (start, end))
        for slot, vms in item.needs.items():
            by_slot.setdefault(slot, []).append((start, end, e_start, e_end, vms))
    out = []
    for slot, spans in by_slot.items():
        best = _peak([(s, e, vms) for s, e, _, _, vms in spans])
        enforced_best = _peak([(s, e, vms) for _, _, s, e, vms in spans])
        out.append(
            BudgetPeak(
                slot.budget, slot.group, slot.limit, best[0], best[1], best[2], enforced_best[0]
            )
        )
    return sorted(out, key=lambda p: (-p.over, -p.peak, p.budget, p.group))


def _peak(
    spans: Iterable[tuple[datetime, datetime, list[str]]],
) -> tuple[int, datetime, tuple[str, ...]]:
    """The most VMs out at once (counted at each start; an instant at its moment)."""
    spans = list(spans)
    best: tuple[int, datetime, tuple[str, ...]] | None = None
    for moment, _, _ in spans:
        on = [
            vm
            for s, e, vms in spans
            if s <= moment and (moment < e or s == e == moment)
            for vm in vms
        ]
        if best is None or len(on) > best[0]:
            best = (len(on), moment, tuple(sorted(on, key=str.casefold)))
    assert best is not None
    return best


def sizes_of(
    budgets: Sequence[Budget], everyone: Iterable[Placement]
) -> dict[tuple[str, str], int]:
    """Group sizes as the identity sync counts them, from a whole export."""
    sizes: dict[tuple[str, str], int] = {}
    for placement in everyone:
        for pair in counted_in(budgets, placement):
            sizes[pair] = sizes.get(pair, 0) + 1
    return sizes
