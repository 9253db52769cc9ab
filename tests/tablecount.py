"""Count Table storage requests on the wire: a small reverse proxy in front of Azurite.

Counting at the HTTP level, not by spying on client methods, sees exactly what Azure bills
(one `$batch` transaction is one request, a query page is one request, a retried call is
two) whatever client, process or code path makes the call. Shared by the tests and the
bench (`make bench`):

    with TableCounter(azurite_connection_string) as counter:
        store = Store.from_connection_string(counter.connection_string, prefix)
        ...
        counter.reset()
        run_watchdog(pipeline)
        assert counter.total() <= 30
        counter.by_kind()   # {"query": 3, "get": 1, "batch": 2, ...}

Kinds: `get` (point read), `query` (one page of a query or list), `insert` (POST a row),
`upsert`/`update` (PUT / MERGE without / with If-Match), `delete`, `batch` (one entity
group transaction), `table` (create or list tables).
"""

from __future__ import annotations

import http.client
import re
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from urllib.parse import unquote, urlsplit

_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "proxy-connection", "upgrade"}
_ENTITY_PATH = re.compile(r"^/[^/]+/(?P<table>[^/(?]+)(?P<key>\([^)]*\))?")


def classify(method: str, path: str, headers: dict[str, str]) -> tuple[str, str]:
    """(kind, table) of one Table REST request."""
    target = unquote(urlsplit(path).path)
    match = _ENTITY_PATH.match(target)
    table = match.group("table") if match else ""
    if table == "$batch":
        return "batch", ""
    if table in ("Tables", "") or table.startswith("Tables"):
        return "table", ""
    point = bool(match and match.group("key") and "PartitionKey=" in match.group("key"))
    if method == "GET":
        return ("get" if point else "query"), table
    if method == "POST":
        return "insert", table
    if method == "DELETE":
        return "delete", table
    if method in ("PUT", "MERGE", "PATCH"):
        conditional = headers.get("if-match", "*") != "*"
        return ("update" if conditional else "upsert"), table
    return method.lower(), table


class TableCounter:
    """A counting reverse proxy to one Azurite (or any Table endpoint over plain HTTP)."""

    def __init__(self, connection_string: str) -> None:
        parts = dict(item.split("=", 1) for item in connection_string.strip(";").split(";") if item)
        endpoint = urlsplit(parts["TableEndpoint"])
        self._upstream = (endpoint.hostname or "127.0.0.1", endpoint.port or 80)
        self._parts = parts
        self._endpoint_path = endpoint.path
        self._counts: Counter[tuple[str, str]] = Counter()
        self._lock = threading.Lock()
        self._local = threading.local()
        counter = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            # The headers and the body go out in two writes: with Nagle's algorithm the body
            # waits for the client's delayed ACK of the headers, about 40 ms a response.
            disable_nagle_algorithm = True

            def log_message(self, *args: object) -> None:
                pass

            def _forward(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP}
                kind, table = classify(
                    self.command, self.path, {k.lower(): v for k, v in headers.items()}
                )
                counter._count(kind, table)
                status, reason, out_headers, data = counter._send(
                    self.command, self.path, body, headers
                )
                self.send_response(status, reason)
                for name, value in out_headers:
                    if name.lower() not in _HOP_BY_HOP and name.lower() != "content-length":
                        self.send_header(name, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_DELETE = do_MERGE = do_PATCH = _forward

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    # ------------------------------------------------------------------ proxying

    def _connection(self) -> http.client.HTTPConnection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = http.client.HTTPConnection(*self._upstream, timeout=60)
            self._local.conn = conn
        return conn

    def _send(
        self, method: str, path: str, body: bytes | None, headers: dict[str, str]
    ) -> tuple[int, str, list[tuple[str, str]], bytes]:
        for attempt in (1, 2):  # a kept-alive upstream connection may have been closed
            conn = self._connection()
            try:
                conn.request(method, path, body=body, headers=headers)
                response = conn.getresponse()
                return response.status, response.reason, response.getheaders(), response.read()
            except (http.client.HTTPException, ConnectionError):
                conn.close()
                self._local.conn = None
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def _count(self, kind: str, table: str) -> None:
        with self._lock:
            self._counts[(kind, table)] += 1

    # ------------------------------------------------------------------ public

    @property
    def connection_string(self) -> str:
        """The upstream's connection string with the Table endpoint moved to the proxy."""
        parts = {
            **self._parts,
            "TableEndpoint": f"http://127.0.0.1:{self.port}{self._endpoint_path}",
        }
        return ";".join(f"{k}={v}" for k, v in parts.items()) + ";"

    def start(self) -> TableCounter:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> TableCounter:
        return self.start()

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def reset(self) -> None:
        with self._lock:
            self._counts.clear()

    def total(self, *, exclude: tuple[str, ...] = ("table",)) -> int:
        """Requests since the last reset; table create/list calls are left out by default."""
        with self._lock:
            return sum(n for (kind, _), n in self._counts.items() if kind not in exclude)

    def by_kind(self) -> dict[str, int]:
        with self._lock:
            out: Counter[str] = Counter()
            for (kind, _), n in self._counts.items():
                out[kind] += n
            return dict(out)

    def by_table(self) -> dict[str, int]:
        with self._lock:
            out: Counter[str] = Counter()
            for (kind, table), n in self._counts.items():
                if kind != "table":
                    out[table or "$batch"] += n
            return dict(out)

    def counts(self) -> dict[tuple[str, str], int]:
        with self._lock:
            return dict(self._counts)
