"""local.azurite under parallel test workers: each worker's Azurite must be its own.

`make test` runs pytest-xdist workers, each starting an Azurite on a port that was free a
moment before. If another process binds that port first, connecting to it proves nothing:
the worker would use someone else's Table service (or none, once that one stops).
"""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest
from azure.data.tables import TableServiceClient

from local import azurite as azurite_module
from local.azurite import Azurite


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A loopback port another process listens on, as a neighbour's Azurite would."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def test_a_port_taken_before_azurite_listens_is_not_used(
    taken_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = azurite_module.free_port
    ports = iter([taken_port])
    monkeypatch.setattr(azurite_module, "free_port", lambda: next(ports, None) or real())
    with Azurite() as server:
        assert server.port != taken_port
        service = TableServiceClient.from_connection_string(server.connection_string)
        service.create_table("mine")
        assert [t.name for t in service.list_tables()] == ["mine"]


def test_an_azurite_that_cannot_listen_anywhere_says_so(
    taken_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(azurite_module, "free_port", lambda: taken_port)
    server = Azurite()
    with pytest.raises(azurite_module.AzuriteError, match="3 free ports were taken"):
        server.start()
    assert server.proc is None  # nothing left running


def test_a_killed_owner_leaves_no_azurite_running() -> None:
    """A SIGKILLed pytest worker or demo cannot run its cleanup: Azurite must still go
    (it exits when the pipe its owner holds closes)."""
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    owner = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "from local.azurite import Azurite; import sys, time; a = Azurite().start(); "
            "print(a.proc.pid, flush=True); time.sleep(600)",
        ],
        cwd=root,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert owner.stdout is not None
        pid = int(owner.stdout.readline())
        os.kill(pid, 0)  # running
        owner.send_signal(signal.SIGKILL)
        owner.wait(timeout=30)
        deadline = time.monotonic() + 60  # a condition, with a generous bound for busy machines
        while time.monotonic() < deadline:
            if not _running(pid):
                break
            time.sleep(0.05)
        else:
            os.kill(pid, signal.SIGKILL)
            raise AssertionError(f"Azurite {pid} outlived its killed owner")
    finally:
        if owner.poll() is None:
            owner.kill()


def _running(pid: int) -> bool:
    """Alive and not a zombie (an orphan's exit waits for whoever reaps it, maybe no one)."""
    from pathlib import Path

    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"
