"""The front door works as written: every relative link in README.md, docs/*.md and
infra/README.md reaches a file (and, with #anchor, a heading there, as GitHub makes
anchors), every `make X` the README shows is a Makefile target, and every `python -m ...`
it shows runs (`--help` of the module and its subcommand words, exit 0). The README stays
a front door: at most about 400 lines, with a table of contents that matches its headings.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = [
    README,
    ROOT / "infra" / "README.md",
    ROOT / "functions" / "README.md",
    ROOT / "relay" / "README.md",
    *sorted((ROOT / "docs").glob("*.md")),
]
FENCE = re.compile(r"^ *```.*?^ *```", re.M | re.S)
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _prose(text: str) -> str:
    """The page without its fenced code blocks (links and headings there are code)."""
    return FENCE.sub("", text)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip()).lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for line in _prose(path.read_text()).splitlines():
        match = re.match(r"^#{1,6} +(.*?) *#*$", line)
        if not match:
            continue
        base = slug(match.group(1))
        count = seen.get(base, 0)
        seen[base] = count + 1
        out.add(base if count == 0 else f"{base}-{count}")
    return out


def test_slugs_follow_github() -> None:
    assert slug("Deploy to Azure (`infra/`)") == "deploy-to-azure-infra"
    assert (
        slug("Security: callback keys and `APP_SECRET`") == "security-callback-keys-and-app_secret"
    )
    assert slug("Parameters (`infra/main.bicep`)") == "parameters-inframainbicep"


def _links() -> list[tuple[Path, str]]:
    return [
        (page, target)
        for page in PAGES
        for target in LINK.findall(_prose(page.read_text()))
        if not re.match(r"^[a-z]+:", target)  # https:, mailto:
    ]


@pytest.mark.parametrize(
    ("page", "target"), _links(), ids=lambda x: x if isinstance(x, str) else x.name
)
def test_every_relative_link_resolves(page: Path, target: str) -> None:
    file_part, _, anchor = target.partition("#")
    dest = (page.parent / file_part).resolve() if file_part else page
    assert dest.exists(), f"{page.relative_to(ROOT)}: {target}: no such file"
    if anchor:
        assert dest.suffix == ".md", f"{page.relative_to(ROOT)}: {target}: anchor into a non-page"
        assert anchor in anchors(dest), (
            f"{page.relative_to(ROOT)}: {target}: {dest.relative_to(ROOT)} has no heading #{anchor}"
        )


def test_a_broken_link_is_caught(tmp_path) -> None:
    """The checker itself: a missing file and a missing heading both fail."""
    page = tmp_path / "p.md"
    page.write_text("# Title\n\n## A `b` c\n")
    assert "a-b-c" in anchors(page)
    assert "title" in anchors(page)
    assert "missing" not in anchors(page)


def _shown(text: str) -> list[str]:
    """Every line of a code block and every inline code span: what a reader would run."""
    blocks = [line for block in FENCE.findall(text) for line in block.splitlines()]
    inline = re.findall(r"`([^`\n]+)`", _prose(text))
    return blocks + inline


def _make_targets() -> set[str]:
    makefile = (ROOT / "Makefile").read_text()
    return set(re.findall(r"^([a-z][\w-]*):", makefile, re.M))


def test_every_make_command_is_a_target() -> None:
    shown = {
        m for line in _shown(README.read_text()) for m in re.findall(r"\bmake ([a-z][\w-]*)", line)
    }
    assert {"demo", "test"} <= shown
    missing = shown - _make_targets()
    assert not missing, f"README shows make targets the Makefile lacks: {sorted(missing)}"


def _python_m_commands() -> list[tuple[str, ...]]:
    """(module, subcommand words...) of every `python -m` the README shows."""
    found: set[tuple[str, ...]] = set()
    for line in _shown(README.read_text()):
        for match in re.finditer(r"python3? -m ([\w.]+)((?: [a-z][a-z-]*)*)", line):
            found.add((match.group(1), *match.group(2).split()))
    return sorted(found)


def test_the_readme_shows_the_commands_people_need() -> None:
    commands = _python_m_commands()
    for expected in (
        ("functions", "policy", "check"),
        ("functions", "settings", "check"),
        ("functions", "cost"),
        ("functions", "attestation", "check"),
        ("functions", "ledger"),
    ):
        assert expected in commands, expected


@pytest.mark.parametrize("command", _python_m_commands(), ids=" ".join)
def test_every_python_m_command_runs(command: tuple[str, ...]) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", *command, "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, f"python -m {' '.join(command)} --help: {proc.stderr[-2000:]}"
    assert proc.stdout.strip(), "no help text"


def test_the_readme_is_a_front_door() -> None:
    text = README.read_text()
    assert len(text.splitlines()) <= 400
    contents = text[text.index("## Contents") : text.index("\n## ", text.index("## Contents") + 1)]
    listed = re.findall(r"\]\(#([^)]+)\)", contents)
    headings = [slug(h) for h in re.findall(r"^#{2,3} +(.+)$", _prose(text), re.M)]
    assert listed == [h for h in headings if h != "contents"], "the contents list every section"
    # terms are defined before they are used
    for term in ("StartRequests", "NotBefore", "EventId", "DocumentIncarnation"):
        definition = text.index(f"**{term}**")
        assert definition < text.index("## Contents"), term
        assert text.index(term) == definition + 2, f"{term} is used before it is defined"


def test_every_relay_subcommand_the_readme_shows_runs() -> None:
    """`python3 scheduled-events-relay.pyz check` is the relay's own module (`make relay`
    zips relay/), so `python -m relay check --help` is the same command."""
    subcommands = {
        m for line in _shown(README.read_text()) for m in re.findall(r"relay\.pyz (\w+)", line)
    }
    assert "check" in subcommands
    for sub in sorted(subcommands):
        proc = subprocess.run(
            [sys.executable, "-m", "relay", sub, "--help"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode == 0, f"relay {sub} --help: {proc.stderr[-2000:]}"


def test_every_app_setting_is_documented() -> None:
    """docs/settings.md names every setting the app reads (the names `settings check`
    knows); an identity-connection sub-setting is named by its `__suffix` beside its group."""
    from functions.settings_check import known_names, settings_models

    page = (ROOT / "docs" / "settings.md").read_text()

    def documented(name: str) -> bool:
        if f"`{name}`".casefold() in page.casefold():
            return True
        group, _, suffix = name.partition("__")
        return bool(suffix) and f"`{group}__*`" in page and f"`__{suffix}`" in page

    missing = [n for n in sorted(known_names(settings_models())) if not documented(n)]
    assert not missing, f"docs/settings.md does not name: {missing}"


def test_every_template_parameter_is_documented() -> None:
    """infra/README.md's parameter tables (the main one, agentless mode's) name every
    parameter of infra/main.bicep."""
    bicep = (ROOT / "infra" / "main.bicep").read_text()
    rows = "\n".join(
        line
        for line in (ROOT / "infra" / "README.md").read_text().splitlines()
        if line.startswith("| `")
    )
    missing = [p for p in re.findall(r"^param (\w+) ", bicep, re.M) if f"`{p}`" not in rows]
    assert not missing, f"infra/README.md's parameter tables lack: {missing}"


# ---------------------------------------------------------------- snippets that must work

# A snippet that shows a mistake on purpose says so within this many characters before it.
ERROR_MARK = "exits 2"
PROJECT_MODULE = re.compile(r"(?<![\w/.])python3? -m (functions|simulator|tests|local)\b")


def _snippets(page: Path) -> list[tuple[str, str, str]]:
    """(where, snippet, the text just before it) for every inline code span and fenced
    block of a page."""
    text = page.read_text()
    found = []
    for match in re.finditer(r"^ *```[^\n]*\n(.*?)^ *```|`([^`\n]+)`", text, re.M | re.S):
        body = match.group(1) if match.group(1) is not None else match.group(2)
        line = text[: match.start()].count("\n") + 1
        before = text[max(0, match.start() - 300) : match.start()]
        found.append((f"{page.relative_to(ROOT)}:{line}", body, before))
    return found


def _policy_snippets() -> list[tuple[str, list[dict]]]:
    """Every snippet that is a policy rule or a list of them (JSON with `name` and
    `action`), unless marked as a mistake shown on purpose."""
    out = []
    for page in PAGES:
        for where, body, before in _snippets(page):
            stripped = body.strip()
            if not stripped.startswith(("{", "[")) or '"action"' not in stripped:
                continue
            try:
                data = json.loads(stripped)
            except json.JSONDecodeError:
                continue
            rules = data if isinstance(data, list) else [data]
            if not all(isinstance(r, dict) and {"name", "action"} <= set(r) for r in rules):
                continue
            if ERROR_MARK in before or ERROR_MARK in body:
                continue
            out.append((where, rules))
    return out


def test_the_docs_show_policy_snippets() -> None:
    shown = {where.split(":")[0] for where, _ in _policy_snippets()}
    assert {"README.md", "docs/policy.md"} <= shown, shown


@pytest.mark.parametrize(("where", "rules"), _policy_snippets(), ids=lambda x: str(x)[:60])
def test_every_policy_snippet_passes_settings_check(monkeypatch, where, rules) -> None:
    """A rule (or a list of rules) the docs show is put where the docs tell an operator to:
    in front of the reference rules (those it does not name itself), and the whole policy
    must pass `settings check` as the app reads it. The README's AKS rule once made the
    policy invalid (issue 33): the app would have failed closed fleet-wide."""
    from functions.model.policy import default_rules
    from functions.settings_check import check_settings

    names = {r["name"] for r in rules}
    reference = [
        r.model_dump(mode="json", exclude_defaults=True)
        for r in default_rules()
        if r.name not in names
    ]
    for name in list(os.environ):
        if name not in ("PATH", "HOME"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("POLICY__RULES", json.dumps([*rules, *reference]))
    report = check_settings(for_azure=False)
    assert report.errors() == [], f"{where}: {[str(e) for e in report.errors()]}"


def _inline_settings() -> list[tuple[str, str, str]]:
    """Every inline `NAME=value` of an app setting the docs show (not marked as a mistake)."""
    from functions.settings_check import known_names, settings_models

    known = {n.casefold() for n in known_names(settings_models())}
    out = []
    for page in PAGES:
        for where, body, before in _snippets(page):
            match = re.fullmatch(r"([A-Z][A-Z0-9_]*)=(\S+)", body.strip())
            if not match or match.group(1).casefold() not in known or "$" in body:
                continue
            if ERROR_MARK not in before:
                out.append((where, match.group(1), match.group(2)))
    return out


@pytest.mark.parametrize(("where", "name", "value"), _inline_settings(), ids=lambda x: str(x))
def test_every_inline_setting_passes_settings_check(monkeypatch, where, name, value) -> None:
    from functions.settings_check import check_settings

    for env in list(os.environ):
        if env not in ("PATH", "HOME"):
            monkeypatch.delenv(env)
    monkeypatch.setenv(name, value)
    report = check_settings(for_azure=False)
    assert report.errors() == [], f"{where}: {[str(e) for e in report.errors()]}"


def test_a_policy_snippet_that_breaks_the_policy_is_caught(monkeypatch) -> None:
    """The checker itself: the README's old AKS rule fails, as `settings check` says."""
    old = {"name": "aks-notify-only", "match": {"scale_sets": ["aks-*"]}, "action": "hold"}
    with pytest.raises(AssertionError, match="aks-notify-only"):
        test_every_policy_snippet_passes_settings_check(monkeypatch, "old README", [old])


def test_project_commands_run_as_shown() -> None:
    """`python -m functions ...` fails outside the project's virtualenv (pydantic and the
    Azure SDKs live in .venv): every page shows `.venv/bin/python -m ...` instead."""
    bare = [
        f"{where}: {body.strip()[:80]}"
        for page in PAGES
        for where, body, _ in _snippets(page)
        if PROJECT_MODULE.search(body)
    ]
    assert not bare, bare


def test_the_readme_says_what_make_test_installs() -> None:
    """`make test` runs the `browser` (apt chromium) and `test-py39` (Debian's Python 3.9)
    targets too: the README says so next to it."""
    makefile = (ROOT / "Makefile").read_text()
    rules = dict(re.findall(r"^([\w-]+):(.*)$", makefile, re.M))
    needs = rules["test"].split() + rules.get("checks", "").split()  # test runs `checks`
    assert "test-py39" in needs and "browser" in needs
    text = README.read_text()
    try_it = text[text.index("## Try it") : text.index("## How it flows")]
    if "browser" in needs:
        assert "chromium" in try_it and "apt" in try_it
    if "test-py39" in needs:
        assert "Python 3.9" in try_it


def test_the_deploy_section_names_the_drain_and_alert_settings() -> None:
    """The default policy drains a scale-in; without a drain step it is held until
    NotBefore, and without a receiver no alert reaches anyone: the README's deploy section
    names both, with their Bicep parameters (issue 33)."""
    text = README.read_text()
    deploy = text[text.index("## Deploy") : text.index("## First checks")]
    for word in (
        "DRAIN__HTTP_URL",
        "DRAIN__RELAY_HOOK",
        "drainHttpUrl",
        "drainRelayHook",
        "alertEmail",
        "alertActionGroupId",
        "alertReceivers",
        "ALERT_EMAIL",
    ):
        assert word in deploy, word
    assert "6 h" in text[text.index("## First checks") : text.index("## The policy")]


def _section(page: Path, heading: str) -> str:
    text = page.read_text()
    start = text.index(f"## {heading}")
    end = text.find("\n## ", start + 3)
    return text[start : end if end != -1 else len(text)]


RUNBOOK = "Runbook: approve by hand while the bridge is down"


def test_every_imds_curl_bypasses_proxies() -> None:
    """IMDS never answers through a proxy: a `curl` to 169.254.169.254 in a shell with
    http_proxy set fails unless it says --noproxy '*'."""
    calls = [
        f"{where}: {line.strip()}"
        for page in PAGES
        for where, body, _ in _snippets(page)
        for line in re.split(r"(?<!\\)\n", body)
        if re.search(r"\bcurl\b", line) and ("169.254.169.254" in line or "$URL" in line)
    ]
    assert calls, "no IMDS curl found in the docs"
    missing = [c for c in calls if "--noproxy '*'" not in c]
    assert not missing, missing


def test_the_runbook_defines_what_it_uses_and_says_what_is_too_slow() -> None:
    """Each command block of the runbook assigns every $VARIABLE it uses, names the CLI's
    own acknowledge, and says that Run Command is too slow for a Preempt (issue 33)."""
    section = _section(ROOT / "docs" / "operations.md", RUNBOOK)
    blocks = FENCE.findall(section)
    assert blocks
    for block in blocks:
        used = set(re.findall(r"\$\{?([A-Z_][A-Z0-9_]*)", block))
        defined = set(re.findall(r"(?:^|\s)([A-Z_][A-Z0-9_]*)=", block))
        assert used <= defined, f"undefined in a runbook block: {sorted(used - defined)}"
    assert "az maintenance scheduledevents acknowledge" in section
    assert "az vm run-command" in section and "Preempt" in section
    readme = README.read_text()
    assert f"docs/operations.md#{slug(RUNBOOK)}" in readme
