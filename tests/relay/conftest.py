"""Fixtures of the relay tests: the Service Bus stand-in, keys, a relay subprocess runner.

The IMDS simulator comes from the shared `simulator` fixture (tests/conftest.py).

A relay started as a process is what a VM runs: `python3 scheduled-events-relay.pyz`, the
zipapp built fresh from relay/ once per session. The interpreter is this one, or the one
named by RELAY_TEST_PYTHON (`make test-py39` points it at Debian's Python 3.9), so the same
process-level tests prove the relay on the oldest Python it supports.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from functions import signing as app_signing
from relay import signing
from simulator.instance import vm_id as simulated_vm_id
from tests.relay.servicebus_standin import ServiceBusStandIn

ROOT = Path(__file__).resolve().parents[2]
KEY = bytes.fromhex("6b3379" * 10 + "0123")  # 32 bytes: a relay callback secret, for tests
VM0_ID = simulated_vm_id({"name": "vm0"})  # the simulator's vmId of "vm0"


def vm_id_of(name: str) -> str:
    return simulated_vm_id({"name": name})


class FixedKeys:
    """A KeyStore stand-in holding given secrets (current first, then previous)."""

    def __init__(self, *secrets: bytes) -> None:
        from relay.keystore import CallbackKey

        self._keys = [CallbackKey(secret, 0) for secret in secrets or (KEY,)]

    def keys(self) -> dict[str, bytes]:
        return {key.id: key.secret for key in self._keys}

    def current_key(self) -> Any:
        return self._keys[0]

    def wire(self) -> dict[str, str]:
        """The envelope's `callback_key`, as KeyStore.wire makes it."""
        return self._keys[0].wire(self._keys[1] if len(self._keys) > 1 else None)

    def rotate_if_due(self) -> bool:
        return False


def sign_headers(
    key: bytes,
    method: str,
    path: str,
    body: bytes,
    now: float | None = None,
    target: str = VM0_ID,
) -> dict[str, str]:
    """v2 headers as the app signs them: `key` is the secret, for the VM `target`."""
    return app_signing.sign_headers_v2(
        key, signing.key_id(key), target, method, path, body, now=now
    )


def relay_key(state_dir: Path) -> bytes:
    """The current callback secret a relay process made in its state directory."""
    data = json.loads((state_dir / "callback-key.json").read_text())
    return bytes.fromhex(data["current"]["secret"])


RELAY_PYTHON = os.environ.get("RELAY_TEST_PYTHON") or sys.executable


def build_pyz(out: Path) -> Path:
    """A fresh, reproducible build of relay/ (the code `make relay` runs)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "build_pyz", ROOT / "relay" / "deploy" / "build_pyz.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.build(out)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "relay_process: starts the relay pyz as a process (rerun on Python 3.9)"
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test that runs the pyz, so `make test-py39` can rerun exactly those."""
    here = Path(__file__).parent
    for item in items:
        if here in Path(item.path).parents and "relay_pyz" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.relay_process)


@pytest.fixture(scope="session")
def relay_pyz(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_pyz(tmp_path_factory.mktemp("pyz") / "scheduled-events-relay.pyz")


def relay_command(pyz: Path, *args: str) -> list[str]:
    return [RELAY_PYTHON, str(pyz), *args]


def relay_env() -> dict[str, str]:
    """The environment of a relay process: no RELAY_* from the test run, no PYTHONPATH."""
    return {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("RELAY_", "PYTHON")) and k != "VIRTUAL_ENV"
    }


def wait_for(condition: Callable[[], Any], timeout: float = 30.0, interval: float = 0.02) -> Any:
    """Poll until `condition()` is truthy; return its value or fail with a clear message.
    30 s: a relay polling every 0.1 s shows a change in well under a second, but on a
    2-core machine running the suite on every core a 10 s wait once ran out."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        time.sleep(interval)


def json_files(directory: Path) -> list[Path]:
    """Complete message files, in name order (a half-written `.tmp-*` is not a message)."""
    if not directory.exists():
        return []
    return sorted(p for p in directory.glob("*.json") if not p.name.startswith("."))


@pytest.fixture
def standin() -> Iterator[ServiceBusStandIn]:
    server = ServiceBusStandIn().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def key_file(tmp_path: Path) -> Path:
    path = tmp_path / "callback.key"
    path.write_bytes(KEY + b"\n")
    return path


class RelayProcess:
    """A real `python -m relay` subprocess; stderr (the JSON log) goes to a file."""

    def __init__(
        self, pyz: Path, args: list[str], log_path: Path, sockets: dict[str, Any] | None = None
    ) -> None:
        """`sockets`: listening sockets passed as systemd's socket units pass them
        (local.socket_units), by FileDescriptorName."""
        from local.socket_units import command

        self.log_path = log_path
        self._log = open(log_path, "ab")  # noqa: SIM115 - closed in stop()
        argv, fds = command(relay_command(pyz, *args), sockets) if sockets else (None, ())
        self.proc = subprocess.Popen(
            argv or relay_command(pyz, *args),
            cwd=log_path.parent,  # not the repository: nothing may come from relay/ there
            env=relay_env(),
            stdout=subprocess.DEVNULL,
            stderr=self._log,
            pass_fds=fds,
        )

    def logs(self) -> list[dict[str, Any]]:
        lines = []
        for line in self.log_path.read_text().splitlines():
            try:
                lines.append(json.loads(line))
            except ValueError:
                lines.append({"msg": line})
        return lines

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._log.close()
        return self.proc.returncode


@pytest.fixture
def hook_unit(relay_pyz: Path) -> Iterator[Callable[..., str]]:
    """A hook unit for relay processes (local/hook_unit.py's stand-in for systemd's socket
    activation), each run the pyz under test's `run-hook` on the relay's Python:
    `hook_unit({"drain": script}, timeout)` is the path of its socket."""
    import tempfile

    from local.hook_unit import HookUnit

    units: list[HookUnit] = []
    where = Path(tempfile.mkdtemp(prefix="hook-unit-"))  # short: a socket path has 107 bytes

    def start(hooks: dict[str, Path], timeout: float = 30.0) -> str:
        command = [RELAY_PYTHON, "-I", str(relay_pyz), "run-hook"]
        path = where / f"{len(units)}.sock"
        units.append(HookUnit(path, hooks, timeout, command).start())
        return str(path)

    try:
        yield start
    finally:
        for unit in units:
            unit.stop()
        import shutil

        shutil.rmtree(where, ignore_errors=True)


@pytest.fixture
def relay_process(tmp_path: Path, relay_pyz: Path) -> Iterator[Callable[..., RelayProcess]]:
    started: list[RelayProcess] = []

    def start(*args: str, sockets: dict[str, Any] | None = None) -> RelayProcess:
        log = tmp_path / f"relay-{len(started)}.log"
        process = RelayProcess(relay_pyz, list(args), log, sockets)
        started.append(process)
        return process

    try:
        yield start
    finally:
        for process in started:
            process.stop()
