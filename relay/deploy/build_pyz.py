"""Build `scheduled-events-relay.pyz`: the whole relay in one file, for any Python >= 3.9.

    python3 relay/deploy/build_pyz.py OUT.pyz [--embedded OUT.pyz.gz]    (or: make relay)

The archive holds the relay package's modules (relay/*.py; not deploy/, not the simulator,
not tests) and a `__main__.py` (relay/deploy/pyz_main.py), deflate-compressed, written
with `zipapp` behind a `#!/usr/bin/env python3` line. It is reproducible: entries are
sorted and stamped with a fixed time and mode, so the same source always gives the same
bytes. That lets the repository commit a built copy for Bicep to embed
(infra/relay/scheduled-events-relay.pyz.gz, see embedded_bytes) with a test proving it is
not stale, and lets anyone recompute a release's checksum.
"""

from __future__ import annotations

import ast
import io
import struct
import sys
import tokenize
import zipapp
import zipfile
import zlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "relay"
DEFAULT_OUT = ROOT / "dist" / "scheduled-events-relay.pyz"
EMBEDDED_OUT = ROOT / "infra" / "relay" / "scheduled-events-relay.pyz.gz"
FIXED_TIME = (1980, 1, 1, 0, 0, 0)  # the earliest time a zip entry can carry
INTERPRETER = "/usr/bin/env python3"

MAIN = Path(__file__).with_name("pyz_main.py")  # becomes the archive's __main__.py


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
    files = [("__main__.py", slim(MAIN.read_text(encoding="utf-8")).encode())]
    for path in sorted(PACKAGE.glob("*.py")):
        files.append((f"relay/{path.name}", slim(path.read_text(encoding="utf-8")).encode()))
    return sorted(files)


def build_bytes(compression: int = zipfile.ZIP_DEFLATED) -> bytes:
    """The archive's bytes, computed in memory (tests compare them with committed copies)."""
    inner = io.BytesIO()
    with zipfile.ZipFile(inner, "w") as archive:
        for name, data in sources():
            info = zipfile.ZipInfo(name, date_time=FIXED_TIME)
            info.compress_type = compression
            info.external_attr = 0o644 << 16
            info.create_system = 3  # Unix, whatever the building machine
            archive.writestr(info, data, compresslevel=9)
    inner.seek(0)
    out = io.BytesIO()
    zipapp.create_archive(inner, out, interpreter=INTERPRETER)
    return out.getvalue()


def embedded_bytes() -> bytes:
    """What Bicep embeds in customData: the same zipapp with stored entries, gzipped.

    Deflate inside a zip compresses each module on its own; gzip over stored entries
    compresses them together, a quarter smaller, which is what customData's 64 KiB limit
    needs. cloud-init unpacks it (`encoding: gz+b64`) into a working pyz.
    """
    return gzip_bytes(build_bytes(zipfile.ZIP_STORED))


ADD_RELAY = ROOT / "infra" / "relay" / "add-relay.sh"
ADD_RELAY_GZ = ROOT / "infra" / "relay" / "add-relay.sh.gz"


def gzip_bytes(data: bytes) -> bytes:
    """A gzip frame written here rather than by gzip.compress, whose header bytes differ
    between Python versions: a committed copy must be the same whichever Python builds it.
    Also used for add-relay.sh, which customData carries gzipped beside the relay."""
    packer = zlib.compressobj(9, zlib.DEFLATED, -15, 9)
    deflated = packer.compress(data) + packer.flush()
    header = b"\x1f\x8b\x08\x00" + b"\x00\x00\x00\x00" + b"\x02\x03"  # no name, mtime 0, Unix
    trailer = struct.pack("<II", zlib.crc32(data) & 0xFFFFFFFF, len(data) & 0xFFFFFFFF)
    return header + deflated + trailer


def _write(out: Path, data: bytes, mode: int) -> Path:
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")
    tmp.write_bytes(data)
    tmp.chmod(mode)
    tmp.replace(out)
    return out


def build(out: Path = DEFAULT_OUT) -> Path:
    return _write(out, build_bytes(), 0o755)


def build_embedded(out: Path = EMBEDDED_OUT) -> Path:
    return _write(out, embedded_bytes(), 0o644)


def build_bootstrap(out: Path = ADD_RELAY_GZ) -> Path:
    return _write(out, gzip_bytes(ADD_RELAY.read_bytes()), 0o644)


if __name__ == "__main__":
    targets = [build(Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_OUT)]
    if len(sys.argv) > 3 and sys.argv[2] == "--embedded":
        targets.append(build_embedded(Path(sys.argv[3])))
        targets.append(build_bootstrap())
    for target in targets:
        print(f"{target} ({target.stat().st_size} bytes)")
