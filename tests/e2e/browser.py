"""A real headless browser for the report tests: Debian's chromium, installed by `make test`.

Outside CI a machine without chromium skips those tests with a clear message; in CI (the
`CI` environment variable is set) a missing browser is a failure, never a silent skip.
"""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import tempfile
import zlib
from pathlib import Path

import pytest

FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--enable-logging=stderr",
    "--v=0",
)


def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    why = "chromium is not installed (`make test` installs it: apt-get install -y chromium)"
    if os.environ.get("CI"):
        pytest.fail(why)
    pytest.skip(why)


def run(page: Path, *extra: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    with tempfile.TemporaryDirectory(prefix="report-browser-") as profile:
        return subprocess.run(
            [
                chromium(),
                *FLAGS,
                f"--user-data-dir={profile}",
                "--virtual-time-budget=3000",
                *extra,
                page.resolve().as_uri(),
            ],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )


def dump_dom(page: Path) -> tuple[str, str]:
    """(the DOM after scripts ran, the browser's log)."""
    done = run(page, "--dump-dom")
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout, done.stderr


def screenshot(page: Path, png: Path, size: str = "1280,2400") -> bytes:
    done = run(page, f"--screenshot={png}", f"--window-size={size}")
    assert done.returncode == 0 and png.exists(), done.stderr[-2000:]
    return png.read_bytes()


def png_pixels(data: bytes) -> tuple[int, int, bytes]:
    """(width, height, raw scanlines) of a PNG: enough to tell a blank page from a chart."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, width, height, idat = 8, 0, 0, b""
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind = data[pos + 4 : pos + 8]
        chunk = data[pos + 8 : pos + 8 + length]
        if kind == b"IHDR":
            width, height = struct.unpack(">II", chunk[:8])
        elif kind == b"IDAT":
            idat += chunk
        pos += 12 + length
    return width, height, zlib.decompress(idat)
