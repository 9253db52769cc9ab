"""The settings the documentation shows pass `settings check`, as the reader would set them.

Every shell block of README.md, docs/ and the other READMEs is read as the shell reads it
(shlex: quotes, line continuations, comments); its `NAME=value` words for app settings are
set as one environment and checked with the app's own check. Every JSON block that is a
policy rule (or a list of them) validates as one. A block that shows a mistake on purpose
says so with `settings check` failing in the same block (`# exits 2`), and is skipped.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shlex
from pathlib import Path

import pytest
from pydantic import TypeAdapter

from functions.model.budgets import Budget
from functions.model.policy import Rule
from functions.settings_check import app_prefixes, check_settings, known_names, settings_models

ROOT = Path(__file__).resolve().parents[2]
DOCS = sorted(
    {
        ROOT / "README.md",
        ROOT / "functions" / "README.md",
        ROOT / "infra" / "README.md",
        *(ROOT / "docs").rglob("*.md"),
    }
)
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```", re.M | re.S)
ASSIGNMENT = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$", re.S)


def blocks(kind: tuple[str, ...]) -> list[tuple[str, str]]:
    found = []
    for path in DOCS:
        if not path.exists():
            continue
        text = path.read_text(encoding="utf-8")
        for match in FENCE.finditer(text):
            if match.group(1) in kind:
                line = text[: match.start()].count("\n") + 1
                found.append((f"{path.relative_to(ROOT)}:{line}", match.group(2)))
    return found


@functools.cache
def _names() -> tuple[frozenset[str], tuple[str, ...]]:
    models = settings_models()
    return frozenset(n.casefold() for n in known_names(models)), tuple(app_prefixes(models))


def words(block: str) -> list[str]:
    """The block's words as the shell reads them; a block that is not all shell (output
    lines shown after a command) is read command by command, skipping what is not."""
    try:
        return shlex.split(block, comments=True)
    except ValueError:
        pass
    found: list[str] = []
    for command in re.split(r"(?<!\\)\n", block):
        try:
            found += shlex.split(command, comments=True)
        except ValueError:
            continue
    return found


def app_assignments(block: str) -> dict[str, str]:
    """The app-setting words of one shell block (`POLICY__X=...`, quoted or not)."""
    known, prefixes = _names()
    found = {}
    for word in words(block):
        m = ASSIGNMENT.match(word)
        if "$" in word:
            continue  # the shell makes the value (`$(openssl rand ...)`): not shown here
        if m and (m.group(1).casefold() in known or m.group(1).upper().startswith(prefixes)):
            found[m.group(1)] = m.group(2)
    return found


SHELL = [
    (where, block)
    for where, block in blocks(("sh", "bash", "shell", ""))
    if "exits 2" not in block and app_assignments(block)
]
JSON_RULES = [
    (where, block)
    for where, block in blocks(("json",))
    if '"action"' in block and '"name"' in block
]
JSON_BUDGETS = [
    (where, block)
    for where, block in blocks(("json",))
    if '"group_by"' in block and '"name"' in block
]


def test_the_documentation_shows_settings():
    assert SHELL, "no shell block with app settings found in the documentation"
    assert JSON_RULES, "no policy rule found in the documentation"
    assert JSON_BUDGETS, "no disruption budget found in the documentation"


@pytest.mark.parametrize(("where", "block"), SHELL, ids=[w for w, _ in SHELL])
def test_each_documented_settings_block_passes(monkeypatch, where, block):
    for name in list(os.environ):
        if name not in ("PATH", "HOME"):
            monkeypatch.delenv(name)
    for name, value in app_assignments(block).items():
        monkeypatch.setenv(name, value)
    report = check_settings(for_azure=False)
    assert report.errors() == [], f"{where}: {[str(e) for e in report.errors()]}"


@pytest.mark.parametrize(("where", "block"), JSON_RULES, ids=[w for w, _ in JSON_RULES])
def test_each_documented_rule_validates(where, block):
    data = json.loads(block)
    TypeAdapter(list[Rule]).validate_python(data if isinstance(data, list) else [data])


@pytest.mark.parametrize(("where", "block"), JSON_BUDGETS, ids=[w for w, _ in JSON_BUDGETS])
def test_each_documented_budget_validates(where, block):
    data = json.loads(block)
    TypeAdapter(list[Budget]).validate_python(data if isinstance(data, list) else [data])
