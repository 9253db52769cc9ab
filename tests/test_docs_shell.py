"""The docs' shell examples run as pasted (issue 38): docs/policy.md's Oslo example set
`POLICY__RULES=...` without `export`, so pasted into a shell and followed by `policy check`
it checked Microsoft's reference policy instead, and nothing said so.

Each shell block that sets an app setting is run by bash itself, as a reader's shell would
read it: in an empty directory, with no command on PATH (every command is a no-op, so
nothing is installed, deployed or fetched; bash's builtins still run). After it, every app
setting the block set must be in the environment (exported), and together they must pass
the app's own `settings check`, unless the block shows a mistake on purpose (`exits 2`)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from functools import cache
from pathlib import Path

import pytest

from tests.test_docs import FENCE, PAGES, ROOT

BASH = shutil.which("bash") or "/bin/bash"
# A statement that assigns a variable: at the start of a line, after `export`, `;`, `&&`.
ASSIGNS = re.compile(r"(?:^|[;&|]\s*|\bexport\s+)([A-Za-z_][A-Za-z0-9_]*)=", re.M)


@cache
def _app_names() -> tuple[frozenset[str], tuple[str, ...]]:
    from functions.settings_check import app_prefixes, known_names, settings_models

    models = settings_models()
    return frozenset(n.casefold() for n in known_names(models)), tuple(app_prefixes(models))


def is_app_setting(name: str) -> bool:
    known, prefixes = _app_names()
    return name.casefold() in known or name.upper().startswith(prefixes)


def shell_blocks() -> list[tuple[str, str]]:
    """(where, block) of every sh/bash block that assigns an app setting as a statement."""
    found = []
    for page in PAGES:
        text = page.read_text()
        for match in FENCE.finditer(text):
            head, _, body = match.group(0).partition("\n")
            if head.strip().strip("`") not in ("sh", "bash", "shell", ""):
                continue
            body = body.rsplit("```", 1)[0]
            if any(is_app_setting(n) for n in ASSIGNS.findall(body)):
                line = text[: match.start()].count("\n") + 1
                found.append((f"{page.relative_to(ROOT)}:{line}", body))
    return found


def run_as_pasted(block: str, tmp_path: Path) -> tuple[dict[str, str], set[str]]:
    """(the environment after the block, every shell variable it holds)."""
    assert not re.search(r">\s*/(?!dev/null)", block), "a block that writes outside its dir"
    empty = tmp_path / "bin"
    empty.mkdir()
    env_file, vars_file = tmp_path / "env", tmp_path / "vars"
    script = (
        "command_not_found_handle() { return 0; }\n"
        f"trap '/usr/bin/env -0 > {env_file}; compgen -v > {vars_file}' EXIT\n"
        f"{block}\n"
    )
    subprocess.run(
        [BASH, "--noprofile", "--norc", "-c", script],
        cwd=tmp_path,
        env={"PATH": str(empty), "HOME": str(tmp_path)},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=20,
        check=False,
    )
    pairs = [p.split("=", 1) for p in env_file.read_text().split("\0") if "=" in p]
    return dict(pairs), set(vars_file.read_text().split())


BLOCKS = shell_blocks()


def test_the_docs_have_such_blocks():
    pages = {where.split(":")[0] for where, _ in BLOCKS}
    assert {"README.md", "docs/policy.md"} <= pages, pages


@pytest.mark.parametrize(("where", "block"), BLOCKS, ids=[w for w, _ in BLOCKS])
def test_each_block_exports_what_it_sets_and_passes_the_check(monkeypatch, tmp_path, where, block):
    from functions.settings_check import check_settings

    env, variables = run_as_pasted(block, tmp_path)
    unexported = sorted(v for v in variables if is_app_setting(v) and v not in env)
    assert not unexported, (
        f"{where}: {unexported} set but not exported: pasted, `settings check` and `policy "
        "check` do not see them (they check the reference policy instead)"
    )
    # A value a command makes (`APP_SECRET=$(openssl rand -hex 32)`) is not shown: not checked.
    made = set(re.findall(r"\b([A-Za-z_]\w*)=[\"']?\$", block))
    settings = {k: v for k, v in env.items() if is_app_setting(k) and k not in made}
    if "exits 2" in block or not settings:
        return
    for name in list(os.environ):
        if name not in ("PATH", "HOME"):
            monkeypatch.delenv(name)
    for name, value in settings.items():
        monkeypatch.setenv(name, value)
    report = check_settings(for_azure=False)
    assert report.errors() == [], f"{where}: {[str(e) for e in report.errors()]}"


def test_an_unexported_setting_is_caught(tmp_path):
    """The checker itself, on the Oslo example as it was on 2cd3d60."""
    env, variables = run_as_pasted(
        "POLICY__TIMEZONE=Europe/Oslo\nexport POLICY__MAX_CONCURRENT_PER_SET=2\n", tmp_path
    )
    assert "POLICY__TIMEZONE" in variables and "POLICY__TIMEZONE" not in env
    assert env["POLICY__MAX_CONCURRENT_PER_SET"] == "2"


def bicep_blocks() -> list[tuple[str, str]]:
    found = []
    for page in PAGES:
        text = page.read_text()
        for match in re.finditer(r"^```bicep\n(.*?)^```", text, re.M | re.S):
            if re.search(r"^param \w+ =", match.group(1), re.M):
                found.append(
                    (
                        f"{page.relative_to(ROOT)}:{text[: match.start()].count(chr(10)) + 1}",
                        match.group(1),
                    )
                )
    return found


BICEP = bicep_blocks()


@pytest.mark.parametrize(("where", "block"), BICEP, ids=[w for w, _ in BICEP])
def test_each_parameter_file_example_passes_the_check(monkeypatch, tmp_path, where, block):
    """A `param ... = ...` example for main.bicepparam names parameters main.bicep has, and
    what a deployment would write from it passes the app's check."""
    from functions.bicepparam import read_parameter_file
    from functions.settings_check import check_settings
    from tests.infra.bicep import load

    path = tmp_path / "example.bicepparam"
    path.write_text(f"using 'main.bicep'\n{block}")
    parsed = read_parameter_file(str(path), {})
    unknown = set(parsed.params) - set(load("main").params)
    assert not unknown and not parsed.notes, f"{where}: {unknown or parsed.notes}"
    for name in list(os.environ):
        if name not in ("PATH", "HOME"):
            monkeypatch.delenv(name)
    for name, value in parsed.settings.items():
        monkeypatch.setenv(name, value)
    report = check_settings(for_azure=False)
    assert report.errors() == [], f"{where}: {[str(e) for e in report.errors()]}"


def test_no_shell_example_sets_by_hand_what_a_deployment_writes_back():
    """A redeploy (the README's secret rotation) writes every app setting from its
    parameters: a dry run set with `az functionapp config appsettings set` was silently
    switched off by it. The docs flip such switches in main.bicepparam instead."""
    from functions.bicepparam import TEMPLATE_SETTINGS

    written = {m.setting for m in TEMPLATE_SETTINGS.values()}
    by_hand = []
    for page in PAGES:
        text = page.read_text()
        for match in FENCE.finditer(text):
            for command in re.findall(r"appsettings set[^\n]*(?:\\\n[^\n]*)*", match.group(0)):
                names = set(re.findall(r"\b([A-Z][A-Z0-9_]*)=", command))
                by_hand += [f"{page.relative_to(ROOT)}: {n}" for n in sorted(names & written)]
    assert not by_hand, by_hand
    readme = (ROOT / "README.md").read_text()
    policy = readme[readme.index("## The policy") : readme.index("Rules are tried in order")]
    assert "param policyDryRun = true" in policy
    assert "settings check --file infra/main.bicepparam" in policy
