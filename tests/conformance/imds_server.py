"""A loopback HTTP server that answers with Azure's published examples, verbatim.

The relay's IMDS client and the app's ARM approver are pointed at it: what they send is
recorded (method, path, query, headers, body) and what they get back is the example a
specification or a Learn page publishes, not an answer written here.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit


@dataclass
class Seen:
    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]
    body: bytes


@dataclass
class Answers:
    """path -> (status, JSON body) or (status, body, headers): a `bytes` body is served
    byte for byte (a recorded answer), with those extra headers; everything asked is in
    `seen`."""

    routes: dict[str, tuple[Any, ...]]
    seen: list[Seen] = field(default_factory=list)


@contextmanager
def serve(routes: dict[str, tuple[Any, ...]]) -> Iterator[tuple[str, Answers]]:
    answers = Answers(routes)

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def _answer(self) -> None:
            parts = urlsplit(self.path)
            length = int(self.headers.get("Content-Length") or 0)
            answers.seen.append(
                Seen(
                    self.command,
                    parts.path,
                    parse_qs(parts.query),
                    {k.lower(): v for k, v in self.headers.items()},
                    self.rfile.read(length) if length else b"",
                )
            )
            status, body, *extra = answers.routes.get(parts.path, (404, {"error": "not_found"}))
            data = body if isinstance(body, bytes) else json.dumps(body).encode()
            headers = {"Content-Type": "application/json", **(extra[0] if extra else {})}
            self.send_response(status)
            for name, value in headers.items():
                if name.casefold() != "content-length":
                    self.send_header(name, value)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = _answer

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", answers
    finally:
        server.shutdown()
        server.server_close()
