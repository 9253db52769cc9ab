"""Publishing to Flex Consumption (issue #23): the README's commands, `.funcignore` (what
`func azure functionapp publish` leaves out) and the release workflow's `functionapp.zip`
deploy exactly the same files, the app's and nothing else.

Sources (Microsoft Learn):
- "Create and manage function apps in the Flex Consumption plan", section "Deploy your code
  project": `func azure functionapp publish` and `az functionapp deployment source
  config-zip` both deploy to Flex (one deploy, into the app's deployment container); for a
  remote build, set `--build-remote true` on config-zip.
  https://learn.microsoft.com/azure/azure-functions/flex-consumption-how-to#deploy-your-code-project
- "App settings reference for Azure Functions", "Flex Consumption plan deprecations":
  SCM_DO_BUILD_DURING_DEPLOYMENT and ENABLE_ORYX_BUILD are not used on Flex.
  https://learn.microsoft.com/azure/azure-functions/functions-app-settings#flex-consumption-plan-deprecations
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import zipfile
from pathlib import Path

import yaml

from tests.infra.bicep import ROOT
from tests.test_funcignore import _published_files

README = ROOT / "infra" / "README.md"
FRONT_DOOR = ROOT / "README.md"
RELEASE = ROOT / ".github" / "workflows" / "release.yml"
APP_FILES = {"function_app.py", "host.json", "requirements.txt", "functions"}
NEVER = ("relay/", "simulator/", "local/", "tests/", "infra/", ".venv", "node_modules/")


def _zip_args(command: str) -> tuple[list[str], list[str]]:
    """`zip -r [-X] OUT PATH... -x PATTERN...` -> (paths, exclude patterns)."""
    words = shlex.split(command.replace("\\\n", " "))
    assert words[:2] == ["zip", "-r"], command
    words = [w for w in words[2:] if w != "-X"]
    out, rest = words[0], words[1:]
    assert out.endswith(".zip")
    if "-x" in rest:
        cut = rest.index("-x")
        return rest[:cut], rest[cut + 1 :]
    return rest, []


def _workflow_zip() -> str:
    steps = yaml.safe_load(RELEASE.read_text())["jobs"]["release"]["steps"]
    (step,) = [s for s in steps if s.get("name") == "Package the function app"]
    (command,) = [c for c in step["run"].split("\n\n") if c.strip().startswith("zip ")]
    return command.strip()


def _readme_block(marker: str, readme: Path = README) -> str:
    blocks = re.findall(r"```bash\n(.*?)```", readme.read_text(), re.S)
    found = [line for block in blocks for line in block.splitlines() if line.startswith(marker)]
    assert len(found) == 1, f"{readme.name}: {len(found)} lines start with {marker!r}"
    return found[0]


def _tracked_under(paths: list[str], excludes: list[str]) -> set[str]:
    tracked = subprocess.run(
        ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    pattern = [re.compile(re.escape(x).replace(r"\*", ".*") + "$") for x in excludes]
    chosen = set()
    for path in tracked:
        inside = any(path == p or path.startswith(p.rstrip("/") + "/") for p in paths)
        if inside and not any(rx.match(path) for rx in pattern):
            chosen.add(path)
    return chosen


def test_the_workflow_and_the_readme_zip_the_same_app_files() -> None:
    workflow_paths, workflow_x = _zip_args(_workflow_zip())
    readme_paths, readme_x = _zip_args(_readme_block("zip -r"))
    assert set(workflow_paths) == set(readme_paths) == APP_FILES
    assert set(workflow_x) == set(readme_x) == {"*/__pycache__/*"}


def test_func_publish_sends_what_the_zip_holds() -> None:
    """`.funcignore` leaves exactly the zip's files (git-tracked ones)."""
    published = set(_published_files())
    zipped = _tracked_under(*_zip_args(_workflow_zip()))
    assert published == zipped, published ^ zipped
    assert not [p for p in published if p.startswith(NEVER)]


def test_the_workflow_zip_imports_and_indexes_the_app(tmp_path: Path) -> None:
    """Build the package as the workflow does (its file list), unpack it elsewhere, and
    index the app from it alone: nothing it imports is left out."""
    package = tmp_path / "functionapp.zip"
    with zipfile.ZipFile(package, "w") as archive:
        for path in sorted(_tracked_under(*_zip_args(_workflow_zip()))):
            archive.write(ROOT / path, path)
    root = tmp_path / "site"
    with zipfile.ZipFile(package) as archive:
        names = archive.namelist()
        archive.extractall(root)
    assert {n.split("/", 1)[0] for n in names} == APP_FILES
    assert not [n for n in names if n.startswith(NEVER)]
    probe = "import function_app; print(len(function_app.app.get_functions()))"
    result = subprocess.run(
        [sys.executable, "-c", probe], cwd=root, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert int(result.stdout) >= 12


def test_the_publish_commands_fit_flex_consumption() -> None:
    func = shlex.split(_readme_block("func azure functionapp publish"))
    assert func[-2:] == ["--build", "remote"]
    assert "--python" not in func  # a `func init` option, not a publish one
    zip_deploy = shlex.split(_readme_block("az functionapp deployment source config-zip"))
    assert zip_deploy[zip_deploy.index("--build-remote") + 1] == "true"
    assert zip_deploy[zip_deploy.index("--src") + 1] == "app.zip"
    text = README.read_text()
    # Named only as settings not to set (Flex deprecates them).
    for setting in ("SCM_DO_BUILD_DURING_DEPLOYMENT", "ENABLE_ORYX_BUILD"):
        assert f"Do not set `{setting}`" in text or f"or\n`{setting}`" in text, setting


def test_the_front_door_publishes_as_infra_readme_does() -> None:
    """The project README repeats the publish commands: word for word infra/README's."""
    for marker in ("func azure functionapp publish", "zip -r", "az functionapp deployment"):
        assert _readme_block(marker, FRONT_DOOR) == _readme_block(marker), marker
