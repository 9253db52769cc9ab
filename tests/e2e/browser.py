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


class Browser:
    """Headless chromium driven over the DevTools protocol on a pipe
    (`--remote-debugging-pipe`: JSON messages ending in NUL on fds 3 and 4), standard
    library only: open a page, run JavaScript in it (click a button), read what it shows."""

    def __init__(self, timeout: float = 30) -> None:
        self.timeout = timeout
        # Chromium may still be writing its profile as it is killed: cleaned up best effort.
        self._profile = tempfile.TemporaryDirectory(
            prefix="pages-browser-", ignore_cleanup_errors=True
        )
        to_chrome, self._out = os.pipe()
        self._in, from_chrome = os.pipe()

        def fds() -> None:  # in the child: fd 3 reads our commands, fd 4 writes answers
            os.dup2(to_chrome, 3)
            os.dup2(from_chrome, 4)

        self._proc = subprocess.Popen(
            [
                chromium(),
                *FLAGS,
                "--remote-debugging-pipe",
                f"--user-data-dir={self._profile.name}",
                "about:blank",
            ],
            preexec_fn=fds,  # runs before the child closes the rest: 3 and 4 are kept
            pass_fds=(3, 4),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        os.close(to_chrome)
        os.close(from_chrome)
        self._buffer, self._next_id, self._session = b"", 0, ""

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc: object) -> None:
        self._proc.kill()
        self._proc.wait(timeout=10)
        os.close(self._out)
        os.close(self._in)
        self._profile.cleanup()

    def _call(self, method: str, **params: object) -> dict:
        import json
        import select
        import time

        self._next_id += 1
        message = {"id": self._next_id, "method": method, "params": params}
        if self._session and not method.startswith("Target."):
            message["sessionId"] = self._session
        os.write(self._out, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + self.timeout
        while True:
            while b"\0" in self._buffer:
                raw, _, self._buffer = self._buffer.partition(b"\0")
                answer = json.loads(raw)
                if answer.get("id") == self._next_id:
                    assert "error" not in answer, answer["error"]
                    return answer["result"]
            left = deadline - time.monotonic()
            assert left > 0, f"the browser did not answer {method} in {self.timeout} s"
            ready, _, _ = select.select([self._in], [], [], left)
            if ready:
                chunk = os.read(self._in, 65536)
                assert chunk, "the browser closed its pipe"
                self._buffer += chunk

    def open(self, url: str) -> None:
        target = self._call("Target.createTarget", url=url)["targetId"]
        self._session = self._call("Target.attachToTarget", targetId=target, flatten=True)[
            "sessionId"
        ]
        self.wait_for("document.readyState === 'complete' && location.href !== 'about:blank'")

    def evaluate(self, expression: str) -> object:
        result = self._call("Runtime.evaluate", expression=expression, returnByValue=True)
        assert "exceptionDetails" not in result, result["exceptionDetails"]
        return result["result"].get("value")

    def wait_for(self, expression: str) -> object:
        """Poll `expression` until it is truthy (a page loaded, a form sent)."""
        import time

        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            try:
                value = self.evaluate(expression)
            except AssertionError:  # the page is between documents
                value = None
            if value:
                return value
            time.sleep(0.1)
        raise AssertionError(f"never true in {self.timeout} s: {expression}")
