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
