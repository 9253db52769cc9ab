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


def test_a_checkpoint_puts_back_a_prefix_as_stored_and_nothing_else(azurite: str) -> None:
    """The crash explorer's checkpoints (local/azurite_checkpoint.cjs): after a restore,
    the prefix's tables hold the rows saved, with their ETags (a forked run's host holds
    them), tables made since are gone, and another prefix's rows are untouched."""
    from azure.core import MatchConditions
    from azure.data.tables import UpdateMode

    from tests.crash.checkpoint import CheckpointError, Checkpoints

    checkpoints = Checkpoints(azurite)
    assert checkpoints.available()
    service = TableServiceClient.from_connection_string(azurite)
    mine, other = service.create_table("xcheck00001events"), service.create_table("xother0001rows")
    mine.upsert_entity({"PartitionKey": "p", "RowKey": "r", "v": 1})
    saved = mine.get_entity("p", "r").metadata["etag"]
    checkpoints.call("save", "xcheck00001")
    mine.upsert_entity({"PartitionKey": "p", "RowKey": "r", "v": 2})
    mine.upsert_entity({"PartitionKey": "p", "RowKey": "r2", "v": 3})
    service.create_table("xcheck00001later").upsert_entity({"PartitionKey": "p", "RowKey": "r"})
    other.upsert_entity({"PartitionKey": "p", "RowKey": "r", "v": 9})
    checkpoints.call("restore", "xcheck00001")

    assert [dict(e) for e in mine.list_entities()] == [{"PartitionKey": "p", "RowKey": "r", "v": 1}]
    names = {t.name for t in service.list_tables()}
    assert "xcheck00001later" not in names and {"xcheck00001events", "xother0001rows"} <= names
    assert [e["v"] for e in other.list_entities()] == [9]
    # The ETag read before the save still matches: a conditional write with it succeeds.
    mine.update_entity(
        {"PartitionKey": "p", "RowKey": "r", "v": 4},
        mode=UpdateMode.REPLACE,
        etag=saved,
        match_condition=MatchConditions.IfNotModified,
    )
    checkpoints.call("restore", "xcheck00001")  # as often as needed
    assert mine.get_entity("p", "r")["v"] == 1
    checkpoints.call("drop", "xcheck00001")
    with pytest.raises(CheckpointError, match="409"):
        checkpoints.call("restore", "xcheck00001")


def test_azurite_has_no_checkpoints_unless_asked() -> None:
    from tests.crash.checkpoint import Checkpoints

    with Azurite() as server:
        assert not Checkpoints(server.connection_string).available()
