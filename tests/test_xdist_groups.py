"""The suite's expensive module fixtures (the demo, the attestation vectors, the Bicep
schemas) run once per `make test` only if `--dist loadgroup` keeps each xdist_group on one
worker: checked on a throwaway module in a child pytest, as `make test` runs it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GROUPED = """
import pytest

pytestmark = pytest.mark.xdist_group("together")


@pytest.mark.parametrize("n", range(8))
def test_grouped(n):
    pass


@pytest.mark.parametrize("n", range(8))
@pytest.mark.xdist_group(name="apart")
def test_free(n):
    pass
"""


def test_an_xdist_group_runs_on_one_worker(tmp_path: Path) -> None:
    (tmp_path / "test_grouped.py").write_text(GROUPED)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = subprocess.run(
        [
            *(sys.executable, "-m", "pytest", "-p", "tests.xdist_groups", "-p", "no:cacheprovider"),
            *("-n", "2", "--dist", "loadgroup", "-v", "--rootdir", str(tmp_path), str(tmp_path)),
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    lines = re.findall(r"\[(gw\d)\].*PASSED \S*::(test_\w+)\[\d\]@(\w+)", run.stdout)
    assert len(lines) == 16, run.stdout
    groups = ("together", "apart_together")  # the module's mark and the function's own
    workers = {group: {gw for gw, _, g in lines if g == group} for group in groups}
    assert [len(w) for w in workers.values()] == [1, 1], run.stdout
