"""What `func azure functionapp publish` uploads (.funcignore) must be enough to index the app."""

from __future__ import annotations

import fnmatch
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _published_files() -> list[str]:
    patterns = [
        line.strip()
        for line in (ROOT / ".funcignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    tracked = subprocess.run(
        ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()

    def ignored(path: str) -> bool:
        # gitignore-like: `dir/` a folder, `/name` anchored at the root, else a name anywhere.
        return any(
            path.startswith(p)
            if p.endswith("/")
            else path == p[1:]
            if p.startswith("/")
            else fnmatch.fnmatch(path, p) or fnmatch.fnmatch(path.rsplit("/", 1)[-1], p)
            for p in patterns
        )

    return [path for path in tracked if not ignored(path)]


def test_published_set_indexes_all_functions(tmp_path: Path) -> None:
    files = _published_files()
    assert {"function_app.py", "host.json", "requirements.txt"} <= set(files)
    assert not [
        f
        for f in files
        if f.startswith(("tests/", "infra/", "node_modules/", "relay/", "simulator/", "local/"))
    ]
    for path in files:
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / path, tmp_path / path)
    probe = "import function_app; print(len(function_app.app.get_functions()))"
    result = subprocess.run(
        [sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr[-2000:]
    # Every function the repository's app registers is indexed from the published files.
    full = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == full.stdout.strip()
    assert int(result.stdout) >= 12  # core, Event Grid, channels, drain, the operators' pages
