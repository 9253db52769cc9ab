"""A real HTTP front for the plain page functions, on 127.0.0.1, like the Azure handlers.

It does what functions/triggers/pages.py does (route, hand over method, path, headers,
query and body, send back status, headers and body) so the tests exercise the pages
through real HTTP: real cookies, real form encoding, real redirects.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qsl, unquote, urlsplit

from functions.pipeline.context import Pipeline
from functions.web import pages

EVENT = re.compile(r"^/api/pages/events/([^/]+)$")
APPROVE = re.compile(r"^/api/pages/events/([^/]+)/approve$")


@contextmanager
def serve(pipeline: Pipeline) -> Iterator[str]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def _answer(self, answer: pages.PageResponse) -> None:
            data = answer.body.encode()
            self.send_response(answer.status)
            for name, value in answer.headers.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _request(self) -> pages.PageRequest:
            parts = urlsplit(self.path)
            length = int(self.headers.get("Content-Length") or 0)
            return pages.PageRequest(
                method=self.command,
                path=parts.path,
                headers=dict(self.headers.items()),
                query=dict(parse_qsl(parts.query)),
                body=self.rfile.read(length) if length else b"",
            )

        def do_GET(self) -> None:
            request = self._request()
            if request.path == "/api/pages/fleet":
                self._answer(pages.fleet_page(pipeline, request))
            elif match := EVENT.match(request.path):
                self._answer(pages.event_page(pipeline, request, unquote(match[1])))
            else:
                self._answer(pages.PageResponse(404, "no such page"))

        def do_POST(self) -> None:
            request = self._request()
            if match := APPROVE.match(request.path):
                self._answer(pages.approve(pipeline, request, unquote(match[1])))
            else:
                self._answer(pages.PageResponse(404, "no such page"))

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
