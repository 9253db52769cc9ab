"""The front door works as written: every relative link in README.md, docs/*.md and
infra/README.md reaches a file (and, with #anchor, a heading there, as GitHub makes
anchors), every `make X` the README shows is a Makefile target, and every `python -m ...`
it shows runs (`--help` of the module and its subcommand words, exit 0). The README stays
a front door: at most about 400 lines, with a table of contents that matches its headings.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = [README, ROOT / "infra" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
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
