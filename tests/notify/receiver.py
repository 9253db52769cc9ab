"""A real HTTP receiver on 127.0.0.1 standing in for Teams, PagerDuty, webhooks and hooks.

Each request is recorded; the answer comes from a script (status, headers, body, delay)
consumed in order, then `default`. A `handler` callable may compute the answer instead.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Recorded:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class Answer:
    status: int = 200
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0


class Receiver:
    def __init__(self, default: Answer | None = None, port: int = 0) -> None:
        self.default = default or Answer(200, {"ok": True})
        self.script: list[Answer] = []
        self.handler: Callable[[Recorded], Answer] | None = None
        self.requests: list[Recorded] = []
        self.lock = threading.Lock()
        self.stop_event = threading.Event()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self._serve()

            def do_GET(self) -> None:
                self._serve()

            def _serve(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                record = Recorded(
                    self.command, self.path, dict(self.headers.items()), self.rfile.read(length)
                )
                with receiver.lock:
                    receiver.requests.append(record)
                    if receiver.handler is not None:
                        answer = receiver.handler(record)
                    elif receiver.script:
                        answer = receiver.script.pop(0)
                    else:
                        answer = receiver.default
                if answer.delay:
                    receiver.stop_event.wait(answer.delay)
                payload = b"" if answer.body is None else json.dumps(answer.body).encode()
                try:
                    self.send_response(answer.status)
                    for name, value in answer.headers.items():
                        self.send_header(name, value)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                except OSError:
                    pass  # the client gave up (a timeout test)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.02,), daemon=True)

    def start(self) -> Receiver:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.stop_event.set()
        self.server.shutdown()
        self.server.server_close()

    def bodies(self) -> list[Any]:
        with self.lock:
            return [record.json() for record in self.requests]

    def wait_for(self, count: int, timeout: float = 5.0) -> None:
        deadline = time.monotonic() + timeout
        while len(self.requests) < count and time.monotonic() < deadline:
            time.sleep(0.01)


@contextmanager
def running(default: Answer | None = None, port: int = 0) -> Iterator[Receiver]:
    """A receiver on `port` (0: any free one) until the block ends."""
    receiver = Receiver(default, port).start()
    try:
        yield receiver
    finally:
        receiver.stop()
