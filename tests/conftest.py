"""Fixtures every test area shares: free loopback ports and a real Azurite Table service."""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# Azurite's documented development account. It is public and only ever used on loopback.
AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = (
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for_port(port: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"nothing listens on 127.0.0.1:{port} after {timeout}s")


def azurite_connection_string(port: int) -> str:
    return (
        f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};AccountKey={AZURITE_KEY};"
        f"TableEndpoint=http://127.0.0.1:{port}/{AZURITE_ACCOUNT};"
    )


@pytest.fixture(scope="session")
def azurite() -> Iterator[str]:
    """Start Azurite's Table service on a free loopback port; yield its connection string."""
    binary = ROOT / "node_modules" / ".bin" / "azurite-table"
    if not binary.exists():
        pytest.fail("Azurite is not installed: run `make test` (it runs `npm ci`) first")
    if shutil.which("node") is None:
        pytest.fail("Node.js is needed to run Azurite")
    port = free_port()
    proc = subprocess.Popen(
        [
            str(binary),
            "--tableHost",
            "127.0.0.1",
            "--tablePort",
            str(port),
            "--inMemoryPersistence",
            "--skipApiVersionCheck",
            "--disableProductStyleUrl",
            "--silent",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        cwd=tempfile.gettempdir(),
    )
    try:
        try:
            wait_for_port(port)
        except TimeoutError:
            proc.kill()
            err = proc.communicate()[1].decode()[-500:]
            raise RuntimeError(f"Azurite did not start: {err}") from None
        yield azurite_connection_string(port)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.fixture
def simulator() -> Iterator[object]:
    """A started IMDS simulator (relay.simulator.SimulatorServer) at time scale 60.

    `simulator.sim` is the Simulator (add VMs, events, faults); `simulator.vm_url(name)` is a
    VM's IMDS base URL. `myVM` exists until another VM is added. Stopped after the test.
    """
    from relay.simulator import Simulator, SimulatorServer

    server = SimulatorServer(Simulator(time_scale=60.0)).start()
    try:
        yield server
    finally:
        server.stop()
