"""The callback's HTTP plumbing: a bounded, fair, one-request-per-connection server.

The server listens on a customer's VM, so it is bounded: at most `max_concurrent` requests
are handled at once (one thread each; a connection beyond that gets a canned 503, or a
readiness server's last answer, from the listening thread and is closed, no thread
started), and a request must arrive completely within `read_timeout` seconds in total, so a
sender that trickles bytes cannot hold a slot for longer than that. Slots are shared fairly
between client addresses: when all are taken and a connection arrives from an address
holding fewer than the busiest one, a connection of the busiest address that is still being
read (nothing of it has been acted on) is closed to make room. So one address trickling
bytes on every slot cannot keep a signed approval from another address waiting.

What a request means is relay.callback's (`CallbackApp.post` and `.health`); this module
only reads requests, bounds them and writes answers. Kept apart so each reads top to bottom.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import socket
import socketserver
import threading
import time

from relay.httpwire import MAX_LINE, REASONS, HeaderError, read_headers
from relay.logs import ErrorStreak, event
from relay.models import http_date

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

log = logging.getLogger("relay.callback")

MAX_BODY = 16 * 1024
DEFAULT_MAX_CONCURRENT = 16
DEFAULT_READ_TIMEOUT = 10.0
BUSY = {"error": "too many concurrent requests; try again shortly"}
# A readiness server's busy answer repeats its last answer if it is younger than this: a
# few of a load balancer's probe intervals (Azure's default is 5 s), never an old state.
REMEMBERED = 15.0


class Refused(Exception):
    """A refusal: the HTTP status and the JSON body that says why. Nothing was acted on."""

    def __init__(self, status: int, reason: str, **extra: Any) -> None:
        super().__init__(reason)
        self.status = status
        self.body = {"error": reason, **extra}


class _DeadlineReader(socket.SocketIO):
    """Socket reads sharing one deadline.

    A per-read timeout alone lets a sender dripping one byte every few seconds keep a
    connection (and its slot) for ever; here every read gets only what is left of the time
    the whole request may take.
    """

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        super().__init__(sock, "rb")
        self._socket = sock
        self._deadline = deadline

    def readinto(self, buffer: Any) -> int | None:
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("request not received in time")
        self._socket.settimeout(left)
        return super().readinto(buffer)


class _Handler(socketserver.BaseRequestHandler):
    """One request per connection (HTTP/1.0 answers, then close): callers are few and each
    request is one signed call, so keep-alive would only let a client hold a slot longer."""

    server: CallbackHTTPServer
    request: socket.socket

    def setup(self) -> None:
        self.connection = self.request
        self.connection.settimeout(self.server.read_timeout)  # bounds each write too
        deadline = time.monotonic() + self.server.read_timeout
        self.rfile = io.BufferedReader(_DeadlineReader(self.connection, deadline))
        self.path, self.head = "", False

    def finish(self) -> None:
        with contextlib.suppress(OSError):
            self.rfile.close()

    def handle(self) -> None:
        try:
            line = self.rfile.readline(MAX_LINE + 1)
            if not line:
                return
            if len(line) > MAX_LINE:
                self._refuse_malformed(414, "request line too long")
                return
            words = line.decode("iso-8859-1").split()
            if len(words) != 3 or not words[2].startswith("HTTP/1."):
                self._refuse_malformed(400, "bad request line")
                return
            method, self.path, _ = words
            self.headers = read_headers(self.rfile)
        except HeaderError as exc:  # malformed or oversized headers: say so, then close
            self._refuse_malformed(exc.status, str(exc))
            return
        except (OSError, ValueError):  # too slow or gone: nobody to answer
            return
        self.head = method == "HEAD"
        if method == "GET" or self.head:
            self.do_GET()
        elif method == "POST" and not self.server.read_only:
            self.do_POST()
        elif method in ("PUT", "DELETE", "PATCH", "POST"):
            self._answer(405, {"error": "method not allowed"})
        else:
            self._answer(501, {"error": "method not implemented"})

    def _refuse_malformed(self, status: int, reason: str) -> None:
        """Answer a request we will not read further, then close without a reset: stop
        writing, and drain (briefly, boundedly) what the client is still sending, so its
        unread bytes do not make the kernel reset the connection before it reads the answer."""
        self._answer(status, {"error": reason})
        with contextlib.suppress(OSError):
            self.connection.shutdown(socket.SHUT_WR)
            self.connection.settimeout(0.5)
            drained = 0
            while drained < 1024 * 1024:
                chunk = self.connection.recv(65536)
                if not chunk:
                    break
                drained += len(chunk)

    def _received(self) -> None:
        """The request is in: what follows (IMDS reads, a hook) is not the client's time."""
        if not self.server.mark_received(self.connection):
            raise Refused(503, "connection closed to share slots fairly; try again")
        self.connection.settimeout(self.server.read_timeout)

    def do_GET(self) -> None:
        try:
            self._received()
        except Refused:
            return
        if self.path.split("?", 1)[0] != self.server.get_path:
            self._answer(404, {"error": "no such endpoint"})
            return
        if self.server.read_only:  # the readiness probe: who asked (relay.responder)
            status, body = self.server.app.health(str(self.client_address[0]))
            hit = _response(status, body, "Cache-Status: scheduled-events-relay; hit\r\n")
            self.server.last_answer = (time.monotonic() + REMEMBERED, hit)  # the busy answer
            self._answer(status, body)
        else:
            self._answer(*self.server.app.health())

    def do_POST(self) -> None:
        try:
            body = self._read_body()
            status, answer = self.server.app.post(self.path, self.headers, body)
        except Refused as exc:
            if exc.status >= 500 or exc.status in (401, 409, 413):
                event(log, logging.WARNING, "callback refused", path=self.path, **exc.body)
            self._answer(exc.status, exc.body)
            return
        except Exception:  # answer, never crash the server thread; nothing was approved
            log.exception("callback failed")
            self._answer(500, {"error": "internal error"})
            return
        self._answer(status, answer)

    def _read_body(self) -> bytes:
        length = self.headers.get("content-length")
        if length is None:
            raise Refused(411, "Content-Length required")
        if not (length.isascii() and length.isdigit()) or len(length) > 12:
            raise Refused(400, "bad Content-Length")
        if int(length) > MAX_BODY:
            raise Refused(413, f"body over {MAX_BODY} bytes")
        try:
            body = self.rfile.read(int(length))
        except OSError:  # TimeoutError included; the client is too slow or gone
            raise Refused(408, "request not received in time") from None
        if len(body) != int(length):
            raise Refused(400, "body shorter than Content-Length")
        self._received()
        return body

    def _answer(self, status: int, body: dict[str, Any]) -> None:
        answer = _response(status, body)
        if self.head:  # HEAD: the headers of the GET answer, Content-Length included
            answer = answer[: answer.index(b"\r\n\r\n") + 4]
        with contextlib.suppress(OSError):  # a client gone before its answer: nothing to do
            self.connection.sendall(answer)


def _response(status: int, body: dict[str, Any], extra: str = "") -> bytes:
    data = json.dumps(body).encode()
    head = (
        f"HTTP/1.0 {status} {REASONS.get(status, 'Unknown')}\r\n"
        "Server: scheduled-events-relay\r\n"
        f"Date: {http_date(time.time())}\r\n"
        "Content-Type: application/json\r\n"
        f"Content-Length: {len(data)}\r\n"
        f"Cache-Control: no-store\r\n{extra}"
        "Connection: close\r\n\r\n"
    )
    return head.encode("ascii") + data


class CallbackHTTPServer(socketserver.ThreadingMixIn, socketserver.TCPServer):
    """A thread per request, but never more than `max_concurrent` at once.

    The listening thread takes a slot before starting a handler thread; without one it
    writes the canned 503 (non-blocking: a fresh socket's send buffer is empty) and closes
    the connection, so a flood costs no thread, no read and little memory.

    A readiness server (`read_only`) answers busy with its last readiness answer instead,
    if it gave one within REMEMBERED seconds, marked as such (`Cache-Status: ...; hit`,
    RFC 9211): a load balancer reads any 503 as "out of rotation", so a canned busy 503 on
    a starved VM would take serving capacity away by itself. The request is not read, so a
    busy answer may answer another path or method than the one asked.
    """

    daemon_threads = True
    allow_reuse_address = True
    get_path = "/v1/health"  # the one GET (and HEAD) path: app.health() answers it
    read_only = False  # True: no POST (the readiness probe, relay.ready)
    request_queue_size = 64  # the kernel's accept queue: a burst waits there, not in threads

    def __init__(
        self,
        address: tuple[str, int],
        app: Any,  # relay.callback.CallbackApp: post() and health()
        max_concurrent: int = DEFAULT_MAX_CONCURRENT,
        read_timeout: float = DEFAULT_READ_TIMEOUT,
        sock: socket.socket | None = None,
    ) -> None:
        if max_concurrent < 1 or read_timeout <= 0:
            raise ValueError("max_concurrent must be >= 1 and read_timeout > 0")
        self.app = app
        self.max_concurrent = max_concurrent
        self.read_timeout = read_timeout
        self._slots = threading.BoundedSemaphore(max_concurrent)
        self._active_lock = threading.Lock()
        self.active = 0  # requests being handled now (for health and tests)
        # Each connection holding a slot -> [client address, True while being read,
        # False once read, None once closed to make room].
        self._holders: dict[socket.socket, list[Any]] = {}
        self.evicted = 0
        self._busy = ErrorStreak(log, "callback")  # touched by the listening thread only
        self.refused_busy = 0
        self.last_answer: tuple[float, bytes] | None = None  # readiness: (until, answer)
        super().__init__(address, _Handler, bind_and_activate=sock is None)
        if sock is not None:  # a listening socket systemd holds (inherited): not ours to bind
            self.socket.close()
            self.socket = sock
            self.server_address = sock.getsockname()

    def process_request(self, request: Any, client_address: Any) -> None:
        address = client_address[0] if isinstance(client_address, tuple) else client_address
        if not self._slots.acquire(blocking=False) and not (
            self._evict_for(address) and self._slots.acquire(timeout=1.0)
        ):
            self.refused_busy += 1
            self._busy.error(
                "busy",
                f"{self.max_concurrent} requests in progress; answering 503 to more",
                max_concurrent=self.max_concurrent,
            )
            self._refuse(request)
            return
        self._busy.ok()
        self._count(+1)
        with self._active_lock:
            self._holders[request] = [address, True]
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._release(request)  # no thread started, so none will release it
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._release(request)

    def mark_received(self, request: Any) -> bool:
        """The request is wholly read: from now on it is never closed to make room.

        False if it was closed to make room meanwhile: then it must not be acted on.
        """
        with self._active_lock:
            holder = self._holders.get(request)
            if holder is None:
                return True
            if holder[1] is None:
                return False
            holder[1] = False
            return True

    def _evict_for(self, address: str) -> bool:
        """Close one still-reading connection of the busiest address, if that is fairer.

        Only when the newcomer's address holds fewer slots than the busiest one minus one,
        so equals never evict each other; only a connection still being read, so nothing
        half-done is cut. The closed sender sees its connection end and may retry.
        """
        with self._active_lock:
            counts: dict[str, int] = {}
            for holder_address, _ in self._holders.values():
                counts[holder_address] = counts.get(holder_address, 0) + 1
            if not counts:
                return False
            busiest = max(counts, key=lambda a: counts[a])
            if counts[busiest] <= counts.get(address, 0) + 1:
                return False
            victim = next(
                (
                    sock
                    for sock, (holder_address, reading) in self._holders.items()
                    if holder_address == busiest and reading
                ),
                None,
            )
            if victim is None:
                return False
            self._holders[victim][1] = None  # evicted: never acted on, even if it raced
        self.evicted += 1
        with contextlib.suppress(OSError):
            victim.shutdown(socket.SHUT_RDWR)  # its reader wakes at once and finishes
        if self.evicted == 1 or self.evicted % 100 == 0:
            event(
                log,
                logging.WARNING,
                "callback: closed a slow connection to share slots fairly",
                address=busiest,
                evicted=self.evicted,
            )
        return True

    def _count(self, delta: int) -> None:
        with self._active_lock:
            self.active += delta

    def _release(self, request: Any) -> None:
        with self._active_lock:
            self._holders.pop(request, None)
        self._count(-1)
        self._slots.release()

    def _refuse(self, request: socket.socket) -> None:
        """The busy answer: a readiness server's last answer while it is recent (`last_answer`,
        marked Cache-Status: ...; hit, RFC 9211), else the canned 503."""
        last = self.last_answer
        if last and time.monotonic() < last[0]:
            answer = last[1]
        else:
            answer = _response(503, BUSY, "Retry-After: 1\r\n")
        try:
            request.setblocking(False)
            request.send(answer)
        except OSError:
            pass  # a full buffer or a gone client: closing is answer enough
        self.shutdown_request(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A connection that failed outside our handlers (reset, timeout): no traceback."""
        log.debug("callback connection failed", exc_info=True)


class CallbackHTTP6Server(CallbackHTTPServer):
    """The same on an IPv6 address (`[::1]:8492`)."""

    address_family = socket.AF_INET6


class CallbackServer:
    def __init__(
        self,
        listen: str,
        app: Any,  # relay.callback.CallbackApp: post() and health()
        poll_interval: float = 0.5,
        max_concurrent: int = DEFAULT_MAX_CONCURRENT,
        read_timeout: float = DEFAULT_READ_TIMEOUT,
        get_path: str = "/v1/health",
        read_only: bool = False,  # the readiness probe (relay.ready): GET and HEAD only
        sock: socket.socket | None = None,  # systemd's listening socket (inherited), if any
    ) -> None:
        self._poll = poll_interval  # how fast stop() is noticed; a wake-up costs CPU
        self.name = "readiness probe" if read_only else "callback"
        host, _, port = listen.rpartition(":")
        host = host.strip("[]")
        six = ":" in host or (sock is not None and sock.family == socket.AF_INET6)
        server_class = CallbackHTTP6Server if six else CallbackHTTPServer
        self.httpd = server_class((host, int(port)), app, max_concurrent, read_timeout, sock)
        self.httpd.get_path, self.httpd.read_only = get_path, read_only
        self.app = app
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return self.httpd.server_address[1]

    @property
    def url(self) -> str:
        host = self.httpd.server_address[0]
        text = host.decode() if isinstance(host, bytes) else host
        return f"http://[{text}]:{self.port}" if ":" in text else f"http://{text}:{self.port}"

    def start(self) -> CallbackServer:
        self._thread = threading.Thread(
            target=self.httpd.serve_forever,
            kwargs={"poll_interval": self._poll},
            name=f"relay-{self.name}",
            daemon=True,
        )
        self._thread.start()
        event(log, logging.INFO, f"{self.name} listening", address=f"{self.url}")
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        if self._thread:
            self._thread.join(5)


def inherited(name: str) -> socket.socket | None:
    """The listening socket systemd passed as FileDescriptorName=`name` (sd_listen_fds(3):
    fds from 3, LISTEN_PID = this process), else None: bind the address yourself.

    Why (issue 46, issue 44): a port systemd's socket unit holds is bound by root from boot
    and stays bound across the relay's restarts, so no local user can take it while the
    relay is down, and connections made meanwhile wait in its queue instead of being
    refused."""
    import os

    names = os.environ.get("LISTEN_FDNAMES", "").split(":")[
        : int(os.environ.get("LISTEN_FDS") or 0)
    ]
    if os.environ.get("LISTEN_PID") != str(os.getpid()) or name not in names:
        return None
    found = socket.socket(fileno=3 + names.index(name))
    found.set_inheritable(False)
    return found
