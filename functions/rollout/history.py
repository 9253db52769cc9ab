"""The history file of `python -m functions relay ...`: one JSON object per run (what,
where, which package and version, which VMs came back, which did not, and the version each
VM heard before), appended when the run ends, read by `rollback`. Written whole to a
temporary file and renamed, so an interrupted write leaves the previous history."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

DEFAULT_FILE = "relay-rollout-history.json"


def read(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    data = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(data, list):
        raise ValueError(f"{path}: not a list of runs")
    return [entry for entry in data if isinstance(entry, dict)]


def append(path: Path, entry: dict[str, Any]) -> None:
    runs = [*read(path), entry]
    temporary = path.with_name(path.name + ".new")
    temporary.write_text(json.dumps(runs, indent=1) + "\n", encoding="utf-8")
    os.replace(temporary, path)


def rollback_of(
    runs: list[dict[str, Any]], scope: str, given: bool = False
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """(the last rollout of `scope`, the earlier rollout whose version it replaced). The
    earlier one may be missing only when the package was `given`; ValueError otherwise,
    saying what is missing."""
    rollouts = [r for r in runs if r.get("scope") == scope and r.get("verb") != "remove"]
    if not rollouts:
        raise ValueError(f"no rollout of {scope} in the history file: nothing to roll back")
    last = rollouts[-1]
    before = set((last.get("previous") or {}).values())
    for earlier in reversed(rollouts[:-1]):
        if earlier.get("version") in before and earlier.get("version") != last.get("version"):
            return last, earlier
    if given:
        return last, None
    raise ValueError(
        f"the history has no rollout of the version {last.get('version')!r} replaced in "
        f"{scope} ({', '.join(sorted(before)) or 'not heard'}): give it, "
        "`relay rollback --version OLD --package URL#sha256=HEX`"
    )
