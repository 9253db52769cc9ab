"""Fixtures every test area shares: free loopback ports and a real Azurite Table service."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

# One Azurite start-up for the demo, the bench and the tests; free_port / wait_for_port are
# re-exported because test modules import them from here.
from local.azurite import Azurite, AzuriteError, free_port, wait_for_port

__all__ = ["free_port", "wait_for_port"]


@pytest.fixture(scope="session")
def azurite() -> Iterator[str]:
    """Start Azurite's Table service on a free loopback port; yield its connection string."""
    server = Azurite()
    try:
        server.start()
    except AzuriteError as exc:
        pytest.fail(f"{exc} (`make test` runs `npm ci` first)")
    try:
        yield server.connection_string
    finally:
        server.stop()


@pytest.fixture
def simulator() -> Iterator[object]:
    """A started IMDS simulator (simulator.SimulatorServer) at time scale 60.

    `simulator.sim` is the Simulator (add VMs, events, faults); `simulator.vm_url(name)` is a
    VM's IMDS base URL. `myVM` exists until another VM is added. Stopped after the test.
    """
    from simulator import Simulator, SimulatorServer

    server = SimulatorServer(Simulator(time_scale=60.0)).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(autouse=True)
def _fresh_test_fleet() -> None:
    """Hand-made relay messages (tests.identity_harness) remember each VM's relay address
    for the test that gave it, never for the next test."""
    import sys

    harness = sys.modules.get("tests.identity_harness")
    if harness is not None:
        harness.URLS.clear()
