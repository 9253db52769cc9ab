"""The hook unit off a VM: what systemd does for scheduled-events-relay-hook.socket
(`Accept=yes`) and its @.service, for the demo and the tests.

On a VM the relay runs no hook script itself (relay/hooks.py): it connects to the hook
unit's socket, and systemd starts one `scheduled-events-relay.pyz run-hook` per connection,
the connection as its standard input and output, as the user and with the rights of the
unit's drop-in. Here a thread accepts on a Unix socket and starts the same `run-hook` per
connection (`python -m relay run-hook`, or the command given: the pyz under test), with
RELAY_HOOKS and RELAY_HOOK_TIMEOUT in its environment as the unit's env files give them, as
whoever runs this (on a VM: the drop-in's user, never the relay's; the real units' rights
are tested through systemd-socket-activate in tests/infra/test_hook_unit.py). Each run is a
process of its own in a session of its own, as on a VM, so it outlives a relay killed in the
middle of it (issue 40); `stop` ends the runs still going, as stopping the VM would.

    python -m local.hook_unit SOCKET HOOKS_JSON TIMEOUT     (the demo's: until SIGTERM)
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


class HookUnit:
    """A listening hook unit at `path` until `stop` (also a context manager)."""

    def __init__(
        self,
        path: Path | str,
        hooks: Mapping[str, Path | str],
        timeout: float = 120.0,
        command: Sequence[str] | None = None,
    ) -> None:
        self.path = str(path)
        self.command = list(command or [sys.executable, "-m", "relay", "run-hook"])
        self.env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "RELAY_HOOKS": json.dumps({name: str(script) for name, script in hooks.items()}),
            "RELAY_HOOK_TIMEOUT": str(timeout),
        }
        self.runs: list[subprocess.Popen[bytes]] = []
        self._stop = threading.Event()
        self._listener: socket.socket | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> HookUnit:
        listener = socket.socket(socket.AF_UNIX)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        listener.bind(self.path)
        os.chmod(self.path, 0o666)  # noqa: S103 - the unit's SocketMode is 0660; the tests' relay may be another user
        listener.listen(16)
        listener.settimeout(0.2)  # to notice stop()
        self._listener = listener
        self._thread = threading.Thread(target=self._accept, name="hook-unit", daemon=True)
        self._thread.start()
        return self

    def _accept(self) -> None:
        assert self._listener is not None
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with conn:
                conn.settimeout(None)
                try:
                    run = subprocess.Popen(  # noqa: S603 - our own runner, no shell
                        self.command,
                        stdin=conn.fileno(),
                        stdout=conn.fileno(),
                        env=self.env,
                        cwd=ROOT,
                        start_new_session=True,
                    )
                except OSError as exc:  # as systemd: the connection closes, the relay says why
                    print(f"hook unit: cannot start {self.command[0]}: {exc}", file=sys.stderr)
                    continue
                self.runs.append(run)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        if self._listener is not None:
            self._listener.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        for run in self.runs:
            if run.poll() is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(run.pid, signal.SIGKILL)
            run.wait(10)

    def __enter__(self) -> HookUnit:
        return self.start()

    def __exit__(self, *_exc: Any) -> None:
        self.stop()


def main(argv: list[str]) -> int:
    path, hooks, timeout = argv
    unit = HookUnit(path, json.loads(hooks), float(timeout)).start()
    stopped = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopped.set())
    signal.signal(signal.SIGINT, lambda *_: stopped.set())
    stopped.wait()
    unit.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
