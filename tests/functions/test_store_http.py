"""The Table client's urllib3 transport (functions.store.http) against Azurite: every kind
of call ingest and the watchdog make, the errors the SDK maps from status codes, and the
connection failures its retry policy needs to tell apart."""

from __future__ import annotations

import base64
import socket
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from azure.core import MatchConditions
from azure.core.credentials import AzureNamedKeyCredential
from azure.core.exceptions import (
    HttpResponseError,
    ResourceExistsError,
    ResourceModifiedError,
    ResourceNotFoundError,
    ServiceRequestError,
    ServiceResponseError,
    ServiceResponseTimeoutError,
)
from azure.data.tables import TableClient, TableServiceClient, UpdateMode

from functions.store.http import Urllib3Transport
from functions.store.rows import transport_options
from functions.store.state import Store


@pytest.fixture
def table(azurite: str) -> TableClient:
    store = Store.from_connection_string(azurite, f"http{uuid.uuid4().hex[:8]}").ensure_tables()
    return store.vms


def test_the_store_sends_through_the_urllib3_transport(azurite):
    assert isinstance(transport_options("http://127.0.0.1:1")["transport"], Urllib3Transport)


def test_rows_round_trip_with_etags_and_non_ascii_text(table):
    text = "héllo 😀 " * 2000  # multi-byte UTF-8 and a surrogate pair, over 16 KB
    created = table.create_entity({"PartitionKey": "p", "RowKey": "r", "data": text})
    row = table.get_entity("p", "r")
    assert row["data"] == text and row.metadata["etag"] == created["etag"]
    table.upsert_entity({"PartitionKey": "p", "RowKey": "r", "data": "x"}, mode=UpdateMode.MERGE)
    assert table.get_entity("p", "r")["data"] == "x"


def test_status_codes_become_the_sdk_errors_ingest_relies_on(table):
    table.create_entity({"PartitionKey": "p", "RowKey": "r"})
    with pytest.raises(ResourceExistsError):
        table.create_entity({"PartitionKey": "p", "RowKey": "r"})
    with pytest.raises(ResourceNotFoundError):
        table.get_entity("p", "missing")
    with pytest.raises(ResourceModifiedError):
        table.update_entity(
            {"PartitionKey": "p", "RowKey": "r", "n": 1},
            mode=UpdateMode.REPLACE,
            etag="W/\"datetime'2000-01-01T00%3A00%3A00.0000000Z'\"",
            match_condition=MatchConditions.IfNotModified,
        )
    table.delete_entity("p", "r")
    with pytest.raises(ResourceNotFoundError):
        table.get_entity("p", "r")


def test_a_transaction_and_a_paged_query(table):
    ops = [("upsert", {"PartitionKey": "b", "RowKey": f"r{i}", "n": i}) for i in range(5)]
    assert len(table.submit_transaction(ops)) == 5
    rows = list(table.query_entities("PartitionKey eq 'b'", results_per_page=2))
    assert [row["n"] for row in rows] == [0, 1, 2, 3, 4]  # three pages, two continuations


def _client(endpoint: str, transport: Urllib3Transport) -> TableClient:
    credential = AzureNamedKeyCredential("acct", "a2V5")
    service = TableServiceClient(
        endpoint=endpoint, credential=credential, transport=transport, retry_total=0
    )
    return service.get_table_client("t")


def test_nothing_listening_is_a_request_error_the_retry_policy_may_repeat():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, never listening: the connection is refused
        client = _client(f"http://127.0.0.1:{port}", Urllib3Transport())
        with pytest.raises(ServiceRequestError):
            client.get_entity("p", "r")


class SilentServer:
    """Accepts connections; then says nothing, or hangs up without an answer."""

    def __init__(self, hang_up: bool) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.hang_up = hang_up
        self.held: list[socket.socket] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            conn.recv(65536)
            if self.hang_up:
                conn.close()
            else:
                self.held.append(conn)

    def close(self) -> None:
        self.sock.close()
        for conn in self.held:
            conn.close()


def test_no_answer_in_time_is_a_response_timeout():
    server = SilentServer(hang_up=False)
    try:
        client = _client(server.url, Urllib3Transport(read_timeout=0.3))
        began = time.monotonic()
        with pytest.raises(ServiceResponseTimeoutError):
            client.get_entity("p", "r")
        assert time.monotonic() - began < 5
    finally:
        server.close()


def test_a_connection_closed_before_the_answer_is_a_response_error():
    server = SilentServer(hang_up=True)
    try:
        with pytest.raises(ServiceResponseError):
            _client(server.url, Urllib3Transport()).get_entity("p", "r")
    finally:
        server.close()


def test_credentials_in_the_proxy_url_are_sent_to_the_proxy():
    """requests sent `http://user:pass@proxy` as a Proxy-Authorization header; so do we."""
    seen: list[str | None] = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            seen.append(self.headers.get("Proxy-Authorization"))
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        proxy = f"http://us%40er:p%3Ass@127.0.0.1:{server.server_address[1]}"
        with pytest.raises(HttpResponseError):  # the proxy's 404
            _client("http://127.0.0.1:9", Urllib3Transport(proxy=proxy)).get_entity("p", "r")
    finally:
        server.shutdown()
        server.server_close()
    assert seen == ["Basic " + base64.b64encode(b"us@er:p:ss").decode()]
