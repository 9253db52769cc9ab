"""Batches: which VMs a rollout runs on together. Pure.

A batch holds at most `percent` (10 % by default, at least one VM) of each scale set in
scope (standalone VMs count as one group), and never more VMs of a group than any of the
policy's disruption budgets allows at once (functions.model.budgets: the operator's
budgets and the default one over sets, `max_concurrent_per_set`), with each group's size
counted among the VMs in scope. A relay restart takes no VM down, but where a load
balancer probes the relay it is what a budget guards against, so the stricter count wins:
every budget applies whatever its `match` (which speaks of events, not of rollouts). The
first batch is a canary of `canary` VMs.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence

from functions.model.budgets import Budget, group_key
from functions.rollout.targets import Target

DEFAULT_PERCENT = 10.0
DEFAULT_CANARY = 1


def _limit(size: int, percent: float) -> int:
    return max(1, math.floor(size * percent / 100 + 1e-9))


def groups_of(target: Target, budgets: Sequence[Budget]) -> list[str]:
    """The groups a VM counts in: its set (for the percentage) and each budget's group."""
    keys = [f"set\x00{target.set_label.casefold()}"]
    placement = target.placement()
    for budget in budgets:
        key = group_key(budget, placement)
        if key is not None:
            keys.append(f"{budget.name}\x00{key}")
    return keys


def limits(
    targets: Sequence[Target], budgets: Sequence[Budget], percent: float = DEFAULT_PERCENT
) -> dict[str, int]:
    """Each group's limit per batch, its size counted among `targets`."""
    sizes: Counter[str] = Counter()
    for target in targets:
        sizes.update(groups_of(target, budgets))
    by_name = {b.name: b for b in budgets}
    out = {}
    for key, size in sizes.items():
        name = key.split("\x00", 1)[0]
        out[key] = _limit(size, percent) if name == "set" else by_name[name].limit(size)
    return out


def plan_batches(
    targets: Sequence[Target],
    budgets: Sequence[Budget],
    percent: float = DEFAULT_PERCENT,
    canary: int = DEFAULT_CANARY,
    max_batch: int | None = None,
    sizes_from: Sequence[Target] | None = None,
) -> list[list[Target]]:
    """`targets` in batches, in order, each within every group's limit. `sizes_from` (the
    whole scope) sizes the groups when only some VMs are left to do."""
    if not 0 < percent <= 100:
        raise ValueError(f"percent {percent}: above 0, at most 100")
    limit_of = limits(sizes_from or targets, budgets, percent)
    pending = list(targets)
    batches: list[list[Target]] = []
    while pending:
        cap = max_batch or len(pending)
        if not batches and canary > 0:
            cap = min(cap, canary)
        batch: list[Target] = []
        used: Counter[str] = Counter()
        left = []
        for target in pending:
            keys = groups_of(target, budgets)
            if len(batch) < cap and all(used[k] < limit_of.get(k, 1) for k in keys):
                batch.append(target)
                used.update(keys)
            else:
                left.append(target)
        batches.append(batch)
        pending = left
    return batches


def describe_limits(targets: Sequence[Target], budgets: Sequence[Budget], percent: float) -> str:
    """One line per set: its size and how many of it a batch may hold, and why."""
    limit_of = limits(targets, budgets, percent)
    lines = []
    for label in sorted({t.set_label for t in targets}, key=str.casefold):
        members = [t for t in targets if t.set_label == label]
        keys = {k for t in members for k in groups_of(t, budgets)}
        tightest = min(keys, key=lambda k: (limit_of[k], k))
        name = tightest.split("\x00", 1)[0]
        why = f"{percent:g} % of the set" if name == "set" else f"budget {name}"
        lines.append(
            f"  {label}: {len(members)} VM(s), at most {limit_of[tightest]} a batch ({why})"
        )
    return "\n".join(lines)
