"""The bench's report: each key beside its target, met or MISSED (the table, for people),
and the gate: the targets missed, or missing, that make `python -m tests.bench` exit 1.

A target whose key a phase that ran did not return is missing, and a missing figure fails
like a missed one: a phase that stopped measuring must not read as a pass. A quick run
(`--quick`) measures small samples: the targets on a sample's size (Phase.sized: crash
points explored, chaos runs) are not checked there, and its JSON line says "quick": true.
"""

from __future__ import annotations

from typing import Any

from tests.bench.runner import Phase, Target

NOT_CHECKED = "(full run only)"


def targets_of(phases: list[Phase], quick: bool = False) -> dict[str, Target]:
    """The targets of these phases, by key; on a quick run, without the sized ones."""
    return {
        key: target
        for phase in phases
        for key, target in phase.targets.items()
        if not (quick and key in phase.sized)
    }


def met(value: Any, target: Target) -> bool | None:
    """Whether `value` meets `target`; None when it is no number (a phase that failed)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    op, bound = target
    return {"<=": value <= bound, ">=": value >= bound, "==": value == bound}[op]


def verdict(name: str, value: Any, targets: dict[str, Target]) -> str:
    if name not in targets:
        return ""
    op, bound = targets[name]
    ok = met(value, targets[name])
    if ok is None:
        return f"{op} {bound:g}  FAILED (no figure: see the *_error key)"
    return f"{op} {bound:g}  {'met' if ok else 'MISSED'}"


def failures(results: dict[str, Any], targets: dict[str, Target]) -> list[str]:
    """Every targeted key missed, without a figure, or missing from the results."""
    out = []
    for name, target in targets.items():
        if name not in results:
            out.append(f"{name}: missing")
        elif (ok := met(results[name], target)) is None:
            out.append(f"{name}: no figure ({results[name]!r})")
        elif not ok:
            out.append(f"{name}: {results[name]} misses {target[0]} {target[1]:g}")
    return out


def table(results: dict[str, Any], targets: dict[str, Target]) -> str:
    rows = [
        (name, f"{value}", verdict(name, value, targets))
        for name, value in results.items()
        if not isinstance(value, dict) and name != "targets_failed"  # in the JSON line only
    ]
    rows += [(name, "(missing)", "FAILED") for name in targets if name not in results]
    width = max(len(r[0]) for r in rows)
    lines = [f"{'measure':<{width}}  {'value':>12}  target", "-" * (width + 32)]
    lines += [f"{name:<{width}}  {value:>12}  {target}" for name, value, target in rows]
    return "\n".join(lines)
