"""The bench's report: each key beside its target, met or MISSED (the table, for people)."""

from __future__ import annotations

from typing import Any

from tests.bench.runner import Phase, Target


def targets_of(phases: list[Phase]) -> dict[str, Target]:
    """Every registered phase's targets, by key."""
    return {key: target for phase in phases for key, target in phase.targets.items()}


def verdict(name: str, value: Any, targets: dict[str, Target]) -> str:
    if name in targets and value is None:
        return f"{targets[name][0]} {targets[name][1]:g}  FAILED (see the *_error key)"
    if name not in targets or not isinstance(value, int | float):
        return ""
    op, target = targets[name]
    ok = {"<=": value <= target, ">=": value >= target, "==": value == target}[op]
    return f"{op} {target:g}  {'met' if ok else 'MISSED'}"


def table(results: dict[str, Any], targets: dict[str, Target]) -> str:
    rows = [
        (name, f"{value}", verdict(name, value, targets))
        for name, value in results.items()
        if not isinstance(value, dict)  # breakdowns and the counts stay in the JSON line
    ]
    width = max(len(r[0]) for r in rows)
    lines = [f"{'measure':<{width}}  {'value':>12}  target", "-" * (width + 32)]
    lines += [f"{name:<{width}}  {value:>12}  {target}" for name, value, target in rows]
    return "\n".join(lines)
