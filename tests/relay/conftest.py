"""Fixtures of the relay tests: the Service Bus stand-in, keys, a relay subprocess runner.

The IMDS simulator comes from the shared `simulator` fixture (tests/conftest.py).
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

from tests.relay.servicebus_standin import ServiceBusStandIn

ROOT = Path(__file__).resolve().parents[2]
KEY = b"k3y-for-relay-tests-only-0123456789"


def wait_for(condition: Callable[[], Any], timeout: float = 10.0, interval: float = 0.02) -> Any:
    """Poll until `condition()` is truthy; return its value or fail with a clear message."""
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

    def __init__(self, args: list[str], log_path: Path) -> None:
        self.log_path = log_path
        self._log = open(log_path, "ab")  # noqa: SIM115 - closed in stop()
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        env = {k: v for k, v in env.items() if not k.startswith("RELAY_")}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "relay", *args],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=self._log,
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
def relay_process(tmp_path: Path) -> Iterator[Callable[..., RelayProcess]]:
    started: list[RelayProcess] = []

    def start(*args: str) -> RelayProcess:
        process = RelayProcess(list(args), tmp_path / f"relay-{len(started)}.log")
        started.append(process)
        return process

    try:
        yield start
    finally:
        for process in started:
            process.stop()
