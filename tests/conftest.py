"""Fixtures every test area shares: free loopback ports and a real Azurite Table service.

`make test` runs the suite on pytest-xdist workers: each worker is its own process with its
own session fixtures (one Azurite each), and the lines tests leave for the run's summary
(tests/infra/conftest.py SUMMARIES) travel from the workers to the terminal here."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

# One Azurite start-up for the demo, the bench and the tests; free_port / wait_for_port are
# re-exported because test modules import them from here.
from local.azurite import Azurite, AzuriteError, free_port, wait_for_port

# xdist_group under pytest 9 (tests/xdist_groups.py): a hook found here by its name.
from tests.xdist_groups import pytest_collection_modifyitems

__all__ = ["free_port", "pytest_collection_modifyitems", "wait_for_port"]


@pytest.fixture(scope="session")
def azurite() -> Iterator[str]:
    """Start Azurite's Table service on a free loopback port; yield its connection string."""
    server = Azurite(checkpoints=True)
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


def _summaries() -> list[str]:
    from tests.infra.conftest import SUMMARIES

    return SUMMARIES


def pytest_sessionfinish(session: pytest.Session) -> None:
    """On an xdist worker: hand this worker's summary lines to the controller."""
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:
        workeroutput["summaries"] = list(_summaries())


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: object, error: object) -> None:
    """On the xdist controller: keep what a finished worker left for the summary."""
    mine = _summaries()
    for line in getattr(node, "workeroutput", {}).get("summaries", []):
        if line not in mine:  # two workers that ran the same module say the same
            mine.append(line)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    for line in _summaries():
        terminalreporter.write_line(line)
