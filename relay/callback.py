"""The signed callback: `POST /v1/start` (approve), `POST /v1/hook` (drain), `GET /v1/health`.

Approving an event lets it proceed for every VM in its `Resources`, so this is the one
place the relay can do harm. It therefore trusts nothing it is sent: the signature must be
valid, fresh and unseen, and each EventId must be, in an IMDS read made for this request,
present, still `Scheduled` and naming this VM. Any doubt refuses the whole request and
approves nothing.

A shared event (one EventId in several VMs' documents) is approved by the app from one VM's
report; a VM that forged its view of it (another EventType, a `User` source for a `Platform`
event) must not get it approved elsewhere. So /v1/start may carry what the app believes:
`"Expect": {EventId: {"EventType": ..., "EventSource": ...}}` (each key optional). Every
EventId of the request with an entry there is compared with this VM's own fresh IMDS view
(case-insensitively; an event without `EventSource` has ""), and any difference refuses the
whole request with a 409 `{"error": "event ID differs from this VM's view: ...", "results":
{ID: "differs"}}`, before IMDS is asked to start anything.

The server itself is bounded, because it listens on a customer's VM: at most
`max_concurrent` requests are handled at once (one thread each; a connection beyond that
gets a canned 503 from the listening thread and is closed, no thread started), and a
request must arrive completely within `read_timeout` seconds in total, so a sender that
trickles bytes cannot hold a slot for longer than that. Slots are shared fairly between
client addresses: when all are taken and a connection arrives from an address holding
fewer than the busiest one, a connection of the busiest address that is still being read
(nothing of it has been acted on) is closed to make room. So one address trickling bytes
on every slot cannot keep a signed approval from another address waiting.

Signatures are scheme v2 only (issue 22, relay.signing.verify_v2): made with this relay's
own key (relay.keystore; the current one, or the previous one for 24 h after a rotation),
naming this VM's vmId as the target. A request signed for another VM is a 403, an unknown
key id or a v1 signature a 401. The health answer counts which key matched, never showing
a key.

Answers (JSON): 200 `{"imds_status": 200, "results": {EventId: "approved"}}`; 502 with the
same shape when IMDS refused the StartRequests; 4xx/5xx `{"error": reason}` (for /v1/start
refusals also `"results": {EventId: verdict}`) and nothing approved. A byte-identical request
(same second, same body) is a replay: callers repeating within a second add any extra field,
e.g. a "Nonce".
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
from collections.abc import Callable

from relay.httpwire import MAX_LINE, REASONS, HeaderError, read_headers
from relay.imds import ImdsClient, ImdsError
from relay.logs import ErrorStreak, event
from relay.signing import (
    KEY_ID_HEADER,
    MAX_SKEW_SECONDS,
    MalformedSignature,
    SignatureError,
    WrongTarget,
    verify_v2,
)

TYPE_CHECKING = False
if TYPE_CHECKING:  # hooks (and subprocess) are loaded only when hooks are configured
    from typing import Any

    from relay.hooks import HookRunner
    from relay.keystore import KeyStore

RUNNING = "running"  # relay.hooks.RUNNING, without importing it

log = logging.getLogger("relay.callback")

MAX_BODY = 16 * 1024
MAX_EVENT_IDS = 100
REPLAY_CACHE_LIMIT = 100_000
DEFAULT_MAX_CONCURRENT = 16
DEFAULT_READ_TIMEOUT = 10.0
_BUSY_BODY = b'{"error": "too many concurrent requests; try again shortly"}'
BUSY_RESPONSE = (
    b"HTTP/1.0 503 Service Unavailable\r\n"
    b"Content-Type: application/json\r\n"
    b"Content-Length: " + str(len(_BUSY_BODY)).encode() + b"\r\n"
    b"Retry-After: 1\r\n"
    b"Connection: close\r\n\r\n" + _BUSY_BODY
)


MAX_NESTING = 16  # a request is an object holding a list of strings: depth 2
EXPECTED_FIELDS = ("EventType", "EventSource")  # what an `Expect` entry may name
MAX_EXPECTED_LENGTH = 64


def _nesting(body: bytes) -> int:
    """The deepest [ or { nesting outside strings. Checked before parsing because how
    deep json.loads may go before a RecursionError depends on the Python version."""
    depth = deepest = 0
    in_string = escaped = False
    for byte in body:
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:  # quote
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in (0x5B, 0x7B):
            depth += 1
            deepest = max(deepest, depth)
        elif byte in (0x5D, 0x7D):
            depth -= 1
    return deepest


def _expectations(value: Any) -> dict[str, dict[str, str]]:
    """`Expect` of a /v1/start body: casefolded EventId -> {field: expected value}."""
    shape = (
        'expected "Expect": {EventId: {"EventType": TEXT, "EventSource": TEXT}} '
        f"(each key optional, at most {MAX_EXPECTED_LENGTH} characters)"
    )
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise Refused(400, shape)
    found: dict[str, dict[str, str]] = {}
    for event_id, entry in value.items():
        if not isinstance(entry, dict) or not 0 < len(event_id) <= 128:
            raise Refused(400, shape)
        fields = {}
        for name in EXPECTED_FIELDS:
            if name not in entry:
                continue
            text = entry[name]
            if not isinstance(text, str) or len(text) > MAX_EXPECTED_LENGTH:
                raise Refused(400, shape)
            fields[name] = text
        if event_id.casefold() in found:
            raise Refused(400, "duplicate EventIds in Expect")
        found[event_id.casefold()] = fields
    return found


def _differences(expected: dict[str, str] | None, scheduled: Any) -> list[str]:
    """What differs between the app's view of an event and this VM's IMDS view."""
    if not expected:
        return []
    seen = {"EventType": scheduled.event_type, "EventSource": scheduled.raw.get("EventSource")}
    differences = []
    for name, wanted in expected.items():
        actual = seen[name] if isinstance(seen[name], str) else ""
        if wanted.casefold() != actual.casefold():
            differences.append(f"{name} '{wanted}' expected, IMDS says '{actual[:64]}'")
    return differences


class Refused(Exception):
    def __init__(self, status: int, reason: str, **extra: Any) -> None:
        super().__init__(reason)
        self.status = status
        self.body = {"error": reason, **extra}


class ReplayCache:
    """Signatures seen within the timestamp window; older ones cannot verify anyway."""

    def __init__(self, window: float = MAX_SKEW_SECONDS, limit: int = REPLAY_CACHE_LIMIT) -> None:
        self._window = window
        self._limit = limit
        self._seen: dict[str, float] = {}
        self._lock = threading.Lock()

    def first_use(self, signature: str, now: float) -> bool:
        with self._lock:
            if len(self._seen) >= self._limit // 2:
                self._seen = {s: t for s, t in self._seen.items() if t > now}
            if signature in self._seen and self._seen[signature] > now:
                return False
            if len(self._seen) >= self._limit:
                raise Refused(503, "too many signed requests; try again shortly")
            # A timestamp may lie up to `window` ahead, so remember for two windows.
            self._seen[signature] = now + 2 * self._window
            return True

    def __len__(self) -> int:
        return len(self._seen)


class CallbackApp:
    """Request handling, separate from the HTTP plumbing so it reads top to bottom."""

    def __init__(
        self,
        keys: KeyStore,
        vm_id: str,
        vm_name: str,
        imds: ImdsClient,
        hooks: HookRunner | None = None,
        health: Callable[[], dict[str, Any]] | None = None,
        hook_wait: float = 10.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.keys = keys
        self.vm_id = vm_id.lower()
        self.key_matches = {"current": 0, "previous": 0}
        self.vm_name = vm_name
        self.imds = imds
        self.hooks = hooks
        self._health = health or (lambda: {"healthy": True})
        self.hook_wait = hook_wait
        self._clock = clock
        self.replays = ReplayCache()

    def health(self) -> tuple[int, dict[str, Any]]:
        report = dict(self._health())
        keys = self.keys.keys()
        report["signatures"] = {
            "scheme": "v2",
            "key_id": self.keys.current_key().id,
            "previous_key_active": len(keys) > 1,
            "accepted": dict(self.key_matches),
        }
        return (200 if report.get("healthy") else 503), report

    def _verify(self, headers: dict[str, str], path: str, body: bytes, now: float) -> str:
        """The signature, if v2, for this VM, under the current or the previous key."""
        signature = verify_v2(self.keys.keys(), self.vm_id, headers, "POST", path, body, now=now)
        current = self.keys.current_key().id
        matched = "current" if headers.get(KEY_ID_HEADER.lower()) == current else "previous"
        if matched == "previous":
            event(log, logging.INFO, "signature matched the previous key", path=path)
        self.key_matches[matched] += 1
        return signature

    def post(self, path: str, headers: dict[str, str], body: bytes) -> tuple[int, dict[str, Any]]:
        route = path.split("?", 1)[0]
        if route not in ("/v1/start", "/v1/hook"):
            raise Refused(404, "no such endpoint")
        now = self._clock()
        try:
            signature = self._verify(headers, path, body, now)
        except MalformedSignature as exc:
            raise Refused(400, str(exc)) from None
        except WrongTarget:
            raise Refused(403, "signed for another VM") from None
        except SignatureError as exc:
            raise Refused(401, str(exc)) from None
        if not self.replays.first_use(signature, now):
            raise Refused(409, "replayed request")
        if _nesting(body) > MAX_NESTING:
            raise Refused(400, "body nests too deeply")
        try:
            payload = json.loads(body)
        except (UnicodeDecodeError, ValueError):
            raise Refused(400, "body is not JSON") from None
        except RecursionError:  # e.g. 16 KiB of "[": valid-looking, but no request nests so
            raise Refused(400, "body nests too deeply") from None
        if not isinstance(payload, dict):
            raise Refused(400, "body must be a JSON object")
        if route == "/v1/start":
            return self.start(payload)
        return self.hook(payload)

    # ------------------------------------------------------------ /v1/start

    def start(self, payload: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        ids = payload.get("EventIds")
        if (
            not isinstance(ids, list)
            or not ids
            or len(ids) > MAX_EVENT_IDS
            or not all(isinstance(i, str) and 0 < len(i) <= 128 for i in ids)
        ):
            raise Refused(400, f'expected {{"EventIds": [1..{MAX_EVENT_IDS} EventId strings]}}')
        if len({i.casefold() for i in ids}) != len(ids):
            raise Refused(400, "duplicate EventIds")
        expect = _expectations(payload.get("Expect"))
        document = self._fresh_document()
        checks: dict[str, str] = {}
        refusal: tuple[int, str] | None = None
        canonical: list[str] = []
        for event_id in ids:
            scheduled = document.event(event_id)
            reason = None
            if scheduled is None:
                verdict, code = "unknown EventId", 404
            elif not scheduled.affects(self.vm_name):
                verdict, code = "does not name this VM", 403
            elif not scheduled.is_scheduled:
                verdict, code = f"not Scheduled ({scheduled.event_status})", 409
            elif differences := _differences(expect.get(event_id.casefold()), scheduled):
                verdict, code = "differs", 409
                reason = f"event {event_id} differs from this VM's view: {'; '.join(differences)}"
            else:
                verdict, code = "ok", 0
                canonical.append(scheduled.event_id)
            checks[event_id] = verdict
            if code and refusal is None:
                refusal = (code, reason or verdict)
        if refusal is not None:
            event(log, logging.WARNING, "start refused", reason=refusal[1], event_ids=ids)
            raise Refused(refusal[0], refusal[1], results=checks)
        try:
            status, text = self.imds.start_events(canonical)
        except ImdsError as exc:
            raise Refused(502, f"IMDS did not answer the StartRequests: {exc.kind}") from None
        outcome = "approved" if status == 200 else "failed"
        event(
            log,
            logging.INFO if status == 200 else logging.ERROR,
            "start requested",
            imds_status=status,
            event_ids=canonical,
        )
        body = {
            "imds_status": status,
            "results": {i: outcome for i in canonical},
        }
        if status != 200:
            body["imds_body"] = text[:200]
        return (200 if status == 200 else 502), body

    def _fresh_document(self) -> Any:
        try:
            _, document = self.imds.get_events()
        except ImdsError as exc:
            raise Refused(503, f"cannot read IMDS to check the request: {exc.kind}") from None
        return document

    # ------------------------------------------------------------ /v1/hook

    def hook(self, payload: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        name, event_id = payload.get("Hook"), payload.get("EventId")
        if not isinstance(name, str) or not isinstance(event_id, str) or not event_id:
            raise Refused(400, 'expected {"Hook": NAME, "EventId": ID}')
        if len(event_id) > 128:
            raise Refused(400, "EventId too long")
        if self.hooks is None or not self.hooks.known(name):
            raise Refused(404, "unknown hook")
        if self.hooks.disabled:
            raise Refused(503, self.hooks.disabled)
        previous = self.hooks.result(name, event_id)
        from relay.hooks import public

        if previous is not None and previous.get("status") != RUNNING:
            return 200, public(previous)
        document = self._fresh_document()
        scheduled = document.event(event_id) or self._undoing(payload, event_id)
        if scheduled is None:
            raise Refused(404, "unknown EventId")
        if not scheduled.affects(self.vm_name):
            raise Refused(403, "EventId does not name this VM")
        record = self.hooks.run_once(name, scheduled, wait=self.hook_wait)
        return (202 if record.get("status") == RUNNING else 200), public(record)

    def _undoing(self, payload: dict[str, Any], event_id: str) -> Any:
        """An event gone from IMDS (cancelled) may still be undone here: `{"Undoes": HOOK}`
        runs the requested hook only if HOOK already ran on this VM for that EventId (an
        undrain after a drain), never for an event this relay did not act on."""
        undoes = payload.get("Undoes")
        if not isinstance(undoes, str) or self.hooks is None or not self.hooks.known(undoes):
            return None
        if self.hooks.result(undoes, event_id) is None:
            return None
        from relay.models import ScheduledEvent

        event_type = str(payload.get("EventType") or "Terminate")[:64]
        raw = {
            "EventId": event_id,
            "EventStatus": "Cancelled",
            "EventType": event_type,
            "Resources": [self.vm_name],
        }
        return ScheduledEvent(event_id, "Cancelled", event_type, (self.vm_name,), raw)


class _DeadlineReader(socket.SocketIO):
    """Socket reads sharing one deadline.

    A per-read timeout alone lets a sender dripping one byte every few seconds keep a
    connection (and its slot) for ever; here every read gets only what is left of the time
    the whole request may take.
    """

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        super().__init__(sock, "rb")
        self._deadline = deadline

    def readinto(self, buffer: Any) -> int | None:
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("request not received in time")
        self._sock.settimeout(left)
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
        self.path = ""

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
        if method == "GET":
            self.do_GET()
        elif method == "POST":
            self.do_POST()
        elif method in ("PUT", "DELETE", "PATCH"):
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
        if self.path.split("?", 1)[0] != "/v1/health":
            self._answer(404, {"error": "no such endpoint"})
            return
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
        data = json.dumps(body).encode()
        now = time.gmtime()
        head = (
            f"HTTP/1.0 {status} {REASONS.get(status, 'Unknown')}\r\n"
            "Server: scheduled-events-relay\r\n"
            f"Date: {_DAYS[now.tm_wday]}, {now.tm_mday:02d} {_MONTHS[now.tm_mon - 1]} "
            f"{now.tm_year} {now.tm_hour:02d}:{now.tm_min:02d}:{now.tm_sec:02d} GMT\r\n"
            "Content-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\n"
            "Cache-Control: no-store\r\n"
            "Connection: close\r\n\r\n"
        )
        with contextlib.suppress(OSError):  # a client gone before its answer: nothing to do
            self.connection.sendall(head.encode("ascii") + data)


_DAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")


class CallbackHTTPServer(socketserver.ThreadingMixIn, socketserver.TCPServer):
    """A thread per request, but never more than `max_concurrent` at once.

    The listening thread takes a slot before starting a handler thread; without one it
    writes the canned 503 (non-blocking: a fresh socket's send buffer is empty) and closes
    the connection, so a flood costs no thread, no read and little memory.
    """

    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 64  # the kernel's accept queue: a burst waits there, not in threads

    def __init__(
        self,
        address: tuple[str, int],
        app: CallbackApp,
        max_concurrent: int = DEFAULT_MAX_CONCURRENT,
        read_timeout: float = DEFAULT_READ_TIMEOUT,
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
        super().__init__(address, _Handler)

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
        try:
            request.setblocking(False)
            request.send(BUSY_RESPONSE)
        except OSError:
            pass  # a full buffer or a gone client: closing is answer enough
        self.shutdown_request(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A connection that failed outside our handlers (reset, timeout): no traceback."""
        log.debug("callback connection failed", exc_info=True)


class CallbackServer:
    def __init__(
        self,
        listen: str,
        app: CallbackApp,
        poll_interval: float = 0.5,
        max_concurrent: int = DEFAULT_MAX_CONCURRENT,
        read_timeout: float = DEFAULT_READ_TIMEOUT,
    ) -> None:
        self._poll = poll_interval  # how fast stop() is noticed; a wake-up costs CPU
        host, _, port = listen.rpartition(":")
        host = host.strip("[]")
        server_class = CallbackHTTPServer
        if ":" in host:
            import socket

            server_class = type("CallbackHTTP6Server", (CallbackHTTPServer,), {})
            server_class.address_family = socket.AF_INET6
        self.httpd = server_class((host, int(port)), app, max_concurrent, read_timeout)
        self.app = app
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return self.httpd.server_address[1]

    @property
    def url(self) -> str:
        host = self.httpd.server_address[0]
        return f"http://{host}:{self.port}"

    def start(self) -> CallbackServer:
        self._thread = threading.Thread(
            target=self.httpd.serve_forever,
            kwargs={"poll_interval": self._poll},
            name="relay-callback",
            daemon=True,
        )
        self._thread.start()
        event(log, logging.INFO, "callback listening", address=f"{self.url}")
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        if self._thread:
            self._thread.join(5)
