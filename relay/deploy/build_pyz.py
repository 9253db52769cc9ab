"""Build `scheduled-events-relay.pyz`: the whole relay in one file, for any Python >= 3.9.

    python3 relay/deploy/build_pyz.py OUT.pyz [--embedded OUT.pyz.xz]    (or: make relay)

The archive holds the relay package's modules (relay/*.py; not deploy/, not the simulator,
not tests) and a `__main__.py` (relay/deploy/pyz_main.py), deflate-compressed, written
with `zipapp` behind a `#!/usr/bin/env python3` line. It is reproducible: entries are
sorted and stamped with a fixed time and mode, so the same source always gives the same
bytes. That lets the repository commit a built copy for Bicep to embed
(infra/relay/scheduled-events-relay.pyz.xz, see embedded_bytes) with a test proving it is
not stale, and lets anyone recompute a release's checksum.
"""

from __future__ import annotations

import ast
import contextlib
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
EMBEDDED_OUT = ROOT / "infra" / "relay" / "scheduled-events-relay.pyz.xz"
FIXED_TIME = (1980, 1, 1, 0, 0, 0)  # the earliest time a zip entry can carry
INTERPRETER = "/usr/bin/env python3"

MAIN = Path(__file__).with_name("pyz_main.py")  # becomes the archive's __main__.py


def slim(source: str) -> str:
    """The module as it runs, without what only a reader needs.

    The archive travels in a VM's customData, whose 64 KiB limit it shares with the unit
    and the bootstrap script, and must leave room (8 KiB: tests/relay/test_deploy.py) for
    the relay to grow. So the shipped copy drops docstrings, comments, blank lines, the
    module-level `if TYPE_CHECKING:` blocks (imports for annotations only: the relay sets
    TYPE_CHECKING = False) and `__all__` lists (for linters), the annotations of functions
    and of function-local assignments (`from __future__ import annotations` makes them
    strings nothing reads at run time; class-level ones stay, relay.record reads them),
    indents by one space per level, writes each bracketed expression on one line, drops the
    spaces between tokens that need none and puts a block of one simple statement on its
    header's line (`if x:return y`). Line numbers then differ from relay/ in the
    repository, but a traceback still shows the right source lines: they are read from the
    archive. Only ast
    and tokenize positions are used, the same on every Python >= 3.9, so the result does
    not depend on which Python builds it.
    """
    text = _without_docstrings(_without_annotations(_without_typing_only(source)))
    text = _reindented(_without_comments(text))
    joined = _joined(text)
    slimmed = _one_liners(_tightened(joined))
    if ast.dump(ast.parse(slimmed)) != ast.dump(ast.parse(joined)):
        raise ValueError("tightening changed the program")
    return slimmed


def _without_docstrings(source: str) -> str:
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
    return "".join(lines)


def typing_only(node: ast.stmt) -> bool:
    """A module-level statement nothing needs at run time: `if TYPE_CHECKING:` without an
    else (the relay sets TYPE_CHECKING = False), or `__all__ = ...`."""
    if isinstance(node, ast.If):
        test = node.test
        return isinstance(test, ast.Name) and test.id == "TYPE_CHECKING" and not node.orelse
    return isinstance(node, ast.Assign) and any(
        isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
    )


def _without_typing_only(source: str) -> str:
    lines = source.splitlines(keepends=True)
    for node in ast.parse(source).body:
        if typing_only(node):
            start, end = node.lineno - 1, node.end_lineno or node.lineno
            lines[start:end] = ["\n"] * (end - start)
    return "".join(lines)


def _without_comments(text: str) -> str:
    comments = [
        tok.start
        for tok in tokenize.generate_tokens(io.StringIO(text).readline)
        if tok.type == tokenize.COMMENT
    ]
    lines = text.splitlines(keepends=True)
    for row, col in comments:
        lines[row - 1] = lines[row - 1][:col].rstrip() + "\n"
    return "".join(line for line in lines if line.strip())


def _annotation_cuts(tree: ast.AST) -> list[tuple[int, int, int, int]]:
    """(line, byte column) spans to cut: `: T` of parameters, `-> T` of functions, `: T`
    of annotated assignments with a value inside a function (never a class's fields)."""
    cuts: list[tuple[int, int, int, int]] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = node.args
            every = [*args.posonlyargs, *args.args, *args.kwonlyargs]
            every += [a for a in (args.vararg, args.kwarg) if a is not None]
            for arg in every:
                note = arg.annotation
                if note is not None and arg.lineno == note.end_lineno:
                    cuts.append(
                        (
                            arg.lineno,
                            arg.col_offset + len(arg.arg),
                            note.lineno,
                            note.end_col_offset or 0,
                        )
                    )
            note = node.returns
            if note is not None and note.lineno == note.end_lineno:
                cuts.append((note.lineno, -1, note.lineno, note.end_col_offset or 0))
            in_function = True
        elif isinstance(node, ast.ClassDef):
            in_function = False
        elif (
            isinstance(node, ast.AnnAssign)
            and in_function
            and node.value is not None
            and node.target.end_lineno == node.annotation.end_lineno
        ):
            target, note = node.target, node.annotation
            cuts.append(
                (
                    target.end_lineno or 0,
                    target.end_col_offset or 0,
                    note.lineno,
                    note.end_col_offset or 0,
                )
            )
        for child in ast.iter_child_nodes(node):
            visit(child, in_function)

    visit(tree, False)
    return cuts


def _without_annotations(source: str) -> str:
    lines = [line.encode() for line in source.splitlines(keepends=True)]
    cuts = [
        # a return annotation (start -1) is cut from its "->"
        (row, lines[row - 1].rindex(b"->", 0, end) if start < 0 else start, end)
        for row, start, _, end in _annotation_cuts(ast.parse(source))
    ]
    for row, start, end in sorted(cuts, reverse=True):  # right to left on each line
        line = lines[row - 1]
        lines[row - 1] = line[:start].rstrip() + line[end:]
    return b"".join(lines).decode()


def _reindented(text: str) -> str:
    """One space per block level; lines inside brackets one more than their statement."""
    lines = text.splitlines(keepends=True)
    depth = brackets = 0
    first_on_line: dict[int, tuple[int, int]] = {}
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.INDENT:
            depth += 1
        elif tok.type == tokenize.DEDENT:
            depth -= 1
        elif tok.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.ENDMARKER):
            row, col = tok.start
            if row not in first_on_line:
                first_on_line[row] = (col, depth + (1 if brackets else 0))
            if tok.type == tokenize.OP and tok.string in "([{":
                brackets += 1
            elif tok.type == tokenize.OP and tok.string in ")]}":
                brackets -= 1
    for row, (col, level) in first_on_line.items():
        line = lines[row - 1]
        lead = len(line) - len(line.lstrip(" "))
        if col == lead and not (row > 1 and lines[row - 2].rstrip("\n").endswith("\\")):
            lines[row - 1] = " " * level + line[lead:]
    return "".join(lines)


def _joined(text: str) -> str:
    """Every line break inside brackets removed (with the next line's indentation)."""
    breaks = set()
    depth = 0
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.OP and tok.string in "([{":
            depth += 1
        elif tok.type == tokenize.OP and tok.string in ")]}":
            depth -= 1
        elif tok.type == tokenize.NL and depth > 0:
            breaks.add(tok.start[0])
    out: list[str] = []
    pending = ""
    for row, line in enumerate(text.splitlines(keepends=True), start=1):
        if pending:
            head, line = pending.rstrip("\n"), line.lstrip()
            tight = head.endswith(("(", "[", "{")) or line.startswith((")", "]", "}"))
            line = head + ("" if tight else " ") + line
        if row in breaks:
            pending = line
        else:
            out.append(line)
            pending = ""
    return "".join(out) + pending


# Tokens that run together without a space between them (`return x`, `"a" "b"`, `1 if`).
_WORDS = {tokenize.NAME, tokenize.NUMBER, tokenize.STRING} | {
    getattr(tokenize, name) for name in ("FSTRING_START", "FSTRING_END") if hasattr(tokenize, name)
}


def _tightened(text: str) -> str:
    """Without the spaces between two tokens of one line where Python needs none (`x = a +
    b` -> `x=a+b`): only a space between two words stays. Inside an f-string (Python 3.12+
    tokenizes its fields) nothing changes, so every Python builds the same bytes. The
    result must parse to the same tree, or the build stops."""
    lines = text.splitlines(keepends=True)
    cuts: list[tuple[int, int, int]] = []  # (row, start, end) of spaces to drop
    previous = None
    depth = 0  # f-strings open (3.12+)
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type in (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT):
            previous = None
            continue
        if (
            depth == 0
            and previous is not None
            and previous.end[0] == tok.start[0]
            and previous.end[1] < tok.start[1]
            and not (previous.type in _WORDS and tok.type in _WORDS)
        ):
            cuts.append((tok.start[0], previous.end[1], tok.start[1]))
        name = tokenize.tok_name[tok.type]
        depth += (name == "FSTRING_START") - (name == "FSTRING_END")
        previous = tok
    for row, start, end in reversed(cuts):  # right to left on each line
        line = lines[row - 1]
        if line[start:end].strip(" "):
            raise ValueError(f"not only spaces between tokens on line {row}")
        lines[row - 1] = line[:start] + line[end:]
    return "".join(lines)


_COMPOUND = (
    ast.If, ast.For, ast.While, ast.With, ast.Try, ast.FunctionDef, ast.ClassDef,
    ast.AsyncFunctionDef, ast.AsyncFor, ast.AsyncWith,
)  # fmt: skip


def _one_liners(text: str) -> str:
    """Each block of one simple one-line statement joined to its header (`if x:`, `else:`,
    `try:`, `except E:`, `def f():`...), the line ending in `:` just above it."""
    lines = text.splitlines(keepends=True)
    rows = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Module):
            continue
        blocks = [getattr(node, name, None) for name in ("body", "orelse", "finalbody")]
        blocks += [handler.body for handler in getattr(node, "handlers", None) or ()]
        for block in blocks:
            if not isinstance(block, list) or len(block) != 1:
                continue
            statement = block[0]
            row = statement.lineno
            if (
                not isinstance(statement, _COMPOUND)
                and row == statement.end_lineno
                and row > 1
                and lines[row - 2].rstrip("\n").endswith(":")
            ):
                rows.add(row)
    for row in sorted(rows, reverse=True):
        lines[row - 2] = lines[row - 2].rstrip("\n") + lines[row - 1].lstrip(" ")
        lines[row - 1] = ""
    return "".join(lines)


def sources() -> list[tuple[str, bytes]]:
    """(archive name, content) of every file that goes in, in the archive's order."""
    files = [("__main__.py", slim(MAIN.read_text(encoding="utf-8")).encode())]
    for path in sorted(PACKAGE.glob("*.py")):
        files.append((f"relay/{path.name}", slim(path.read_text(encoding="utf-8")).encode()))
    # Largest first: gzip's 32 KiB window then holds more of what the small ones repeat
    # (about 1 KB smaller than by name). Still one order for one source: reproducible.
    return sorted(files, key=lambda item: (-len(item[1]), item[0]))


def _deflated_size(data: bytes) -> int:
    packer = zlib.compressobj(9, zlib.DEFLATED, -15, 9)
    return len(packer.compress(data) + packer.flush())


def gzip_order(files: list[tuple[str, bytes]]) -> list[tuple[str, bytes]]:
    """The files in an order gzip packs small, for the embedded copy (stored entries).

    Deflate finds repeats only within the last 32 KiB, so what comes just before a module
    decides how much of it is already "known". Greedy first: after the largest, each next
    file is the one that costs least given the 32 KiB before it, relative to its own
    compressed size; then neighbours are swapped while that shrinks the whole. Measured on
    this relay: about 550 bytes less base64 in customData than largest-first. The result
    depends only on the files (ties go by name), so a build stays reproducible.
    """
    order, rest = [files[0]], list(files[1:])
    while rest:
        window = b"".join(data for _, data in order)[-32768:]
        known = _deflated_size(window)
        after = min(
            rest,
            key=lambda item: (
                (_deflated_size(window + item[1]) - known) / _deflated_size(item[1]),
                item[0],
            ),
        )
        order.append(after)
        rest.remove(after)

    def size(candidate: list[tuple[str, bytes]]) -> int:
        return _deflated_size(b"".join(data for _, data in candidate))

    best = size(order)
    for _ in range(5):  # passes of neighbour swaps; it settles in about three
        improved = False
        for i in range(len(order) - 1):
            swapped = [*order[:i], order[i + 1], order[i], *order[i + 2 :]]
            if (packed := size(swapped)) < best:
                order, best, improved = swapped, packed, True
        if not improved:
            break
    return order


def build_bytes(compression: int = zipfile.ZIP_DEFLATED) -> bytes:
    """The archive's bytes, computed in memory (tests compare them with committed copies).
    Stored entries (the embedded copy, gzipped as a whole) go in gzip_order."""
    inner = io.BytesIO()
    files = sources()
    if compression == zipfile.ZIP_STORED:
        files = gzip_order(files)
    with zipfile.ZipFile(inner, "w") as archive:
        for name, data in files:
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
    """What Bicep embeds in customData: the same zipapp with stored entries, xz-compressed.

    Deflate inside a zip compresses each module on its own; one stream over stored entries
    compresses them together, a quarter smaller, which is what customData's 64 KiB limit
    needs. LZMA2 (xz) sees the whole archive at once, where gzip sees 32 KiB: 36.5 KB here
    against Zopfli's gzip at 39.1 KB, about 3.5 KB less base64 in customData (issue 44:
    room for the readiness responder and the longest parameter values). cloud-init has no
    xz encoding, so it writes the file as it came (`encoding: b64`) and add-relay.sh
    unpacks it with the VM's Python (`lzma`, standard library) or `xz -d`.
    """
    import lzma

    return lzma.compress(
        build_bytes(zipfile.ZIP_STORED),
        format=lzma.FORMAT_XZ,
        check=lzma.CHECK_CRC32,
        filters=[
            {"id": lzma.FILTER_LZMA2, "preset": 9 | lzma.PRESET_EXTREME, "pb": 0, "nice_len": 273}
        ],
    )


def embedded_archive(data: bytes) -> bytes:
    """The stored zipapp an embedded copy unpacks to (what the tests compare: liblzma's
    bytes may differ between its versions, the archive may not)."""
    import lzma

    return lzma.decompress(data, format=lzma.FORMAT_XZ)


ADD_RELAY = ROOT / "infra" / "relay" / "add-relay.sh"
ADD_RELAY_GZ = ROOT / "infra" / "relay" / "add-relay.sh.gz"


def gzip_bytes(data: bytes) -> bytes:
    """A gzip frame written here rather than by gzip.compress, whose header bytes differ
    between Python versions: a committed copy must be the same whichever Python builds it.
    Also used for add-relay.sh, which customData carries gzipped beside the relay.

    The deflate stream is Zopfli's (the `zopfli` package, a build-time tool only): any
    inflater reads it, cloud-init's included, and it is about 4 % smaller than zlib's
    level 9 (the relay: 39,397 -> 37,816 bytes, about 2.1 KB less base64 in customData).
    Zopfli is deterministic, so the committed copy stays reproducible."""
    deflated = _zopfli_deflate(data)
    header = b"\x1f\x8b\x08\x00" + b"\x00\x00\x00\x00" + b"\x02\x03"  # no name, mtime 0, Unix
    trailer = struct.pack("<II", zlib.crc32(data) & 0xFFFFFFFF, len(data) & 0xFFFFFFFF)
    return header + deflated + trailer


def _zopfli_deflate(data: bytes) -> bytes:
    """A raw deflate stream (RFC 1951) by Zopfli: its zlib container without the 2-byte
    header and the 4-byte Adler-32 trailer."""
    import zopfli.zopfli

    return bytes(zopfli.zopfli.compress(data, numiterations=15))[2:-4]


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
    """Rewritten only when what it unpacks to changed: a machine whose liblzma packs the
    same archive into other bytes leaves the committed copy alone (release.yml diffs it)."""
    import lzma

    with contextlib.suppress(OSError, lzma.LZMAError):
        if embedded_archive(out.read_bytes()) == build_bytes(zipfile.ZIP_STORED):
            return out
    return _write(out, embedded_bytes(), 0o644)


def slim_script(text: str) -> str:
    """add-relay.sh as customData carries it: without its comment and blank lines (the
    shebang stays). Its two here-documents write the systemd unit and relay.env, where a
    line starting with `#` is a comment too, so the installed files mean the same."""
    first, _, rest = text.partition("\n")
    kept = [line for line in rest.splitlines(keepends=True) if line.strip()[:1] not in ("#", "")]
    return first + "\n" + "".join(kept)


def embedded_script() -> bytes:
    """infra/relay/add-relay.sh.gz: the script slimmed, then gzipped reproducibly."""
    return gzip_bytes(slim_script(ADD_RELAY.read_text(encoding="utf-8")).encode())


def build_bootstrap(out: Path = ADD_RELAY_GZ) -> Path:
    return _write(out, embedded_script(), 0o644)


if __name__ == "__main__":
    targets = [build(Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_OUT)]
    if len(sys.argv) > 3 and sys.argv[2] == "--embedded":
        targets.append(build_embedded(Path(sys.argv[3])))
        targets.append(build_bootstrap())
    for target in targets:
        print(f"{target} ({target.stat().st_size} bytes)")
