"""The bench's gate (tests/bench/report.py, __main__.py; issue 47): on 2f59d6a
`python -m tests.bench` exited 0 with a target MISSED, and a quick run's JSON line looked
like a full one."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.bench import __main__ as bench
from tests.bench.report import failures, table, targets_of
from tests.bench.runner import Phase


def phase(found: dict[str, Any]) -> Phase:
    return Phase(
        "fake",
        lambda a: "a fake phase",
        lambda b: dict(found),
        targets={"fast_ms": ("<=", 10), "runs": (">=", 5)},
        sized=("runs",),
    )


def test_a_target_missed_missing_or_without_a_figure_fails() -> None:
    targets = targets_of([phase({})])
    assert failures({"fast_ms": 3, "runs": 5}, targets) == []
    assert failures({"fast_ms": 30, "runs": 5}, targets) == ["fast_ms: 30 misses <= 10"]
    assert failures({"runs": 5}, targets) == ["fast_ms: missing"]
    assert failures({"fast_ms": None, "runs": 5}, targets) == ["fast_ms: no figure (None)"]
    assert "(missing)" in table({"runs": 5}, targets)
    assert targets_of([phase({})], quick=True) == {"fast_ms": ("<=", 10)}  # sized: full only


@pytest.mark.parametrize(
    ("found", "argv", "code"),
    [
        ({"fast_ms": 3, "runs": 9}, [], 0),
        ({"fast_ms": 30, "runs": 9}, [], 1),  # missed
        ({"runs": 9}, [], 1),  # missing
        ({"fast_ms": 3, "runs": 1}, [], 1),  # a sized target, on a full run
        ({"fast_ms": 3, "runs": 1}, ["--quick"], 0),  # ... not held to on a quick one
    ],
)
def test_the_bench_exits_1_when_a_target_fails_and_a_quick_line_says_so(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], found, argv, code
) -> None:
    monkeypatch.setattr(bench, "PHASES", [phase(found)])
    assert bench.main(["--only", "fake", *argv]) == code
    line = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert line["quick"] is bool(argv) and (line["targets_failed"] == []) is (code == 0)
