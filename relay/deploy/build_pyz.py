"""Build `scheduled-events-relay.pyz`: the whole relay in one file, for any Python >= 3.9.

    python3 relay/deploy/build_pyz.py [OUT]     (or: make relay)

The archive holds the relay package's modules (relay/*.py; not deploy/, not the simulator,
not tests) and a `__main__.py`, deflate-compressed, written with `zipapp` behind a
`#!/usr/bin/env python3` line. It is reproducible: entries are sorted and stamped with a
fixed time and mode, so the same source always gives the same bytes. That is what lets the
repository commit a built copy for Bicep to embed (infra/relay/) and a test prove it is not
stale, and what lets a release's checksum be recomputed by anyone.
"""

from __future__ import annotations

import ast
import io
import sys
import tokenize
import zipapp
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "relay"
DEFAULT_OUT = ROOT / "dist" / "scheduled-events-relay.pyz"
FIXED_TIME = (1980, 1, 1, 0, 0, 0)  # the earliest time a zip entry can carry
INTERPRETER = "/usr/bin/env python3"

MAIN = '''\
"""Entry point of scheduled-events-relay.pyz: `python3 scheduled-events-relay.pyz --help`."""
import sys

if sys.version_info < (3, 9):
    sys.stderr.write("relay: needs Python 3.9 or newer (this is %s)\\n" % sys.version.split()[0])
    sys.exit(2)

from relay.__main__ import main  # noqa: E402

sys.exit(main())
'''


def slim(source: str) -> str:
    """The module without docstrings and comments, every line kept in its place.

    The archive travels in a VM's customData, whose 64 KiB limit it must share with the
    unit and the bootstrap script; docstrings and comments are a third of the text. Lines
    are blanked, never removed, so a traceback's line numbers still point at the lines of
    relay/ in the repository. Tokenize and ast behave the same on every Python >= 3.9, so
    the result does not depend on which Python builds it.
    """
    lines = source.splitlines(keepends=True)
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if not isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        body = node.body
        first = body[0] if body else None
        if not (
            isinstance(first, ast.Expr)
            and isinstance(first.value, ast.Constant)
            and isinstance(first.value.value, str)
        ):
            continue
        start, end = first.lineno - 1, first.end_lineno or first.lineno
        indent = lines[start][: len(lines[start]) - len(lines[start].lstrip())]
        keep = "" if len(body) > 1 else f"{indent}...\n"
        lines[start:end] = [keep or "\n"] + ["\n"] * (end - start - 1)
    text = "".join(lines)
    comments = [
        tok.start
        for tok in tokenize.generate_tokens(io.StringIO(text).readline)
        if tok.type == tokenize.COMMENT
    ]
    lines = text.splitlines(keepends=True)
    for row, col in comments:
        lines[row - 1] = lines[row - 1][:col].rstrip() + "\n"
    return "".join(line if line.strip() else "\n" for line in lines)


def sources() -> list[tuple[str, bytes]]:
    """(archive name, content) of every file that goes in, sorted by name."""
    files = [("__main__.py", MAIN.encode())]
    for path in sorted(PACKAGE.glob("*.py")):
        files.append((f"relay/{path.name}", slim(path.read_text(encoding="utf-8")).encode()))
    return sorted(files)


def build_bytes() -> bytes:
    """The archive's bytes, computed in memory (tests compare them with committed copies)."""
    inner = io.BytesIO()
    with zipfile.ZipFile(inner, "w") as archive:
        for name, data in sources():
            info = zipfile.ZipInfo(name, date_time=FIXED_TIME)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            info.create_system = 3  # Unix, whatever the building machine
            archive.writestr(info, data, compresslevel=9)
    inner.seek(0)
    out = io.BytesIO()
    zipapp.create_archive(inner, out, interpreter=INTERPRETER)
    return out.getvalue()


def build(out: Path = DEFAULT_OUT) -> Path:
    out.parent.mkdir(parents=True, exist_ok=True)
    data = build_bytes()
    tmp = out.with_name(f".{out.name}.tmp")
    tmp.write_bytes(data)
    tmp.chmod(0o755)
    tmp.replace(out)
    return out


if __name__ == "__main__":
    target = build(Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_OUT)
    print(f"{target} ({target.stat().st_size} bytes)")
