"""What the command line prints is text, never terminal control.

An EventType, EventId or VM name is a VM's own words, and it reaches `policy backtest`,
`ledger ID --csv` and `policy explain`'s warnings. Written raw, ESC and BEL sequences in it
would drive the operator's terminal: move the cursor, rewrite lines, or (OSC 52) set the
clipboard. So every character of the C0 and C1 control ranges (but newline and tab, which
our own output uses), DEL, and the bidirectional overrides that reorder what is shown
("Trojan Source", CVE-2021-42574) is printed as a visible escape, `\\x1b` or `\\u202e`."""

from __future__ import annotations

import contextlib
import io
import re
import sys
from collections.abc import Iterator
from typing import TextIO, cast

_UNSAFE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def printable(text: str) -> str:
    """`text` with every control character shown as an escape (see the module docstring)."""

    def escape(match: re.Match[str]) -> str:
        code = ord(match.group())
        return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"

    return _UNSAFE.sub(escape, text)


class PrintableStream(io.TextIOBase):
    """A text stream that writes `printable(text)` to the stream it wraps."""

    def __init__(self, inner: TextIO) -> None:
        self.inner = inner

    def write(self, text: str) -> int:
        self.inner.write(printable(text))
        return len(text)

    def flush(self) -> None:
        self.inner.flush()

    def isatty(self) -> bool:
        return self.inner.isatty()


@contextlib.contextmanager
def printable_output() -> Iterator[None]:
    """For the length of a command: sys.stdout and sys.stderr print no control characters."""
    out, err = sys.stdout, sys.stderr
    sys.stdout = cast(TextIO, PrintableStream(out))
    sys.stderr = cast(TextIO, PrintableStream(err))
    try:
        yield
    finally:
        sys.stdout, sys.stderr = out, err
