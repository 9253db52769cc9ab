"""Just enough HTTP/1.1 for the relay: a kept-alive client for IMDS and request parsing for
the callback.

Why not http.client and http.server: importing them pulls in the email package, and
http.client pulls in ssl (OpenSSL) even for plain http; together that is about half of the
relay's memory on every VM. IMDS is plain HTTP on a link-local address and the callback
serves three small JSON endpoints, so a few dozen lines of socket code do the job. Service
Bus (HTTPS, proxies) still goes through urllib, imported only when it is used.
"""

from __future__ import annotations

import io
import select
import socket
import threading
from urllib.parse import urlencode, urlsplit

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

MAX_LINE = 65536
MAX_HEADERS = 100
MAX_ANSWER = 4 * 1024 * 1024  # a Scheduled Events document is a few KiB; never read more

REASONS = {
    200: "OK",
    202: "Accepted",
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    408: "Request Timeout",
    409: "Conflict",
    411: "Length Required",
    413: "Payload Too Large",
    414: "URI Too Long",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    501: "Not Implemented",
    502: "Bad Gateway",
    503: "Service Unavailable",
}


class ProtocolError(OSError):
    """The peer did not speak HTTP/1.x as expected (treated like a connection failure)."""


class HeaderError(ProtocolError):
    """Headers a server must refuse with an answer (`status`: 400 or 431), not a silent close."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class AnswerTooLarge(ProtocolError):
    """An answer over MAX_ANSWER bytes: not read (contract §8: reported, not forwarded)."""

    def __init__(self, size: int) -> None:
        super().__init__(f"answer of {size} bytes is too large (limit {MAX_ANSWER})")
        self.size = size


class RemoteDisconnected(ProtocolError):
    """The peer closed the connection without answering."""


class HttpAnswer:
    __slots__ = ("body", "headers", "status")

    def __init__(self, status: int, body: bytes, headers: dict[str, str]) -> None:
        self.status = status
        self.body = body
        self.headers = headers

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", "replace")


def read_headers(rfile: io.BufferedIOBase) -> dict[str, str]:
    """Header lines up to the blank line; names lower-cased; ISO-8859-1 as HTTP says."""
    headers: dict[str, str] = {}
    for _ in range(MAX_HEADERS + 1):
        line = rfile.readline(MAX_LINE + 1)
        if len(line) > MAX_LINE:
            raise HeaderError(431, "header line too long")
        if line in (b"\r\n", b"\n"):
            return headers
        if not line:
            raise RemoteDisconnected("connection closed in the headers")
        if line[:1] in (b" ", b"\t"):
            # obs-fold (RFC 9112 5.2): a server must refuse it (or unfold it); refused.
            raise HeaderError(400, "folded header line (obs-fold)")
        name, sep, value = line.decode("iso-8859-1").partition(":")
        if not sep or not name.strip() or name != name.strip():
            raise HeaderError(400, "malformed header line")
        key = name.lower()
        value = value.strip()
        headers[key] = f"{headers[key]}, {value}" if key in headers else value
    raise HeaderError(431, f"more than {MAX_HEADERS} header lines")


class HttpConnection:
    """One kept-alive HTTP/1.1 connection to one origin; thread-safe (used under a lock).

    A connection the server closed while it sat idle is noticed before it is reused (it
    turns readable), so an idle close never shows up as an error, while a server that
    drops a request still does.
    """

    def __init__(self, base_url: str) -> None:
        parts = urlsplit(base_url)
        self.scheme = parts.scheme
        self.host = parts.hostname or ""
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.prefix = parts.path.rstrip("/")
        default_port = 443 if parts.scheme == "https" else 80
        host = f"[{self.host}]" if ":" in self.host else self.host
        self.host_header = host if self.port == default_port else f"{host}:{self.port}"
        self._sock: socket.socket | None = None
        self._rfile: io.BufferedReader | None = None
        self._lock = threading.Lock()

    def close(self) -> None:
        with self._lock:
            self._drop()

    def _drop(self) -> None:
        if self._rfile is not None:
            self._rfile.close()
            self._rfile = None
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def _connect(self, timeout: float) -> socket.socket:
        if self._sock is not None and _closed_by_peer(self._sock):
            self._drop()  # the server closed it while idle: not an error, reconnect
        if self._sock is None:
            # An ASCII host as bytes: a str goes through the idna codec, which loads
            # unicodedata (a megabyte) into every relay for "169.254.169.254".
            host = self.host.encode("ascii") if self.host.isascii() else self.host
            # CPython's create_connection takes a bytes host too (typeshed names str only).
            address: Any = (host, self.port)
            sock = socket.create_connection(address, timeout=timeout)
            if self.scheme == "https":
                import ssl  # only for an https IMDS URL; plain http needs no OpenSSL

                sock = ssl.create_default_context().wrap_socket(sock, server_hostname=self.host)
            self._sock = sock
            self._rfile = sock.makefile("rb")
        self._sock.settimeout(timeout)
        return self._sock

    def request(
        self,
        method: str,
        path: str,
        timeout: float,
        params: dict[str, str] | None = None,
        headers: dict[str, str] | None = None,
        body: bytes | None = None,
    ) -> HttpAnswer:
        target = self.prefix + path + ("?" + urlencode(params) if params else "")
        lines = [f"{method} {target} HTTP/1.1", f"Host: {self.host_header}"]
        lines += [f"{name}: {value}" for name, value in (headers or {}).items()]
        if body is not None or method in ("POST", "PUT"):
            lines.append(f"Content-Length: {len(body or b'')}")
        data = ("\r\n".join(lines) + "\r\n\r\n").encode("iso-8859-1") + (body or b"")
        with self._lock:
            try:
                sock = self._connect(timeout)
                sock.sendall(data)
                assert self._rfile is not None
                answer, keep = _read_answer(self._rfile, method)
            except BaseException:
                self._drop()
                raise
            if not keep:
                self._drop()
            return answer


def _read_answer(rfile: io.BufferedReader, method: str) -> tuple[HttpAnswer, bool]:
    line = rfile.readline(MAX_LINE + 1)
    if not line:
        raise RemoteDisconnected("the server closed the connection without an answer")
    parts = line.decode("iso-8859-1").split(None, 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
        raise ProtocolError(f"not an HTTP answer: {line[:40]!r}")
    status, version = int(parts[1]), parts[0]
    headers = read_headers(rfile)
    connection = headers.get("connection", "").lower()
    keep = "close" not in connection and (version != "HTTP/1.0" or "keep-alive" in connection)
    if method == "HEAD" or status in (204, 304) or 100 <= status < 200:
        return HttpAnswer(status, b"", headers), keep
    if "chunked" in headers.get("transfer-encoding", "").lower():
        body = _read_chunked(rfile)
    elif headers.get("content-length", "").strip().isdigit():
        length = int(headers["content-length"])
        if length > MAX_ANSWER:
            raise AnswerTooLarge(length)
        body = rfile.read(length)
        if len(body) != length:
            raise RemoteDisconnected("the answer was cut short")
    else:
        body = rfile.read(MAX_ANSWER + 1)
        if len(body) > MAX_ANSWER:
            raise AnswerTooLarge(len(body))
        keep = False
    return HttpAnswer(status, body, headers), keep


def _read_chunked(rfile: io.BufferedReader) -> bytes:
    chunks: list[bytes] = []
    total = 0
    while True:
        size_line = rfile.readline(MAX_LINE + 1).split(b";", 1)[0].strip()
        try:
            size = int(size_line, 16)
        except ValueError:
            raise ProtocolError("malformed chunk size") from None
        if size == 0:
            while rfile.readline(MAX_LINE + 1) not in (b"\r\n", b"\n", b""):
                pass  # trailers
            return b"".join(chunks)
        total += size
        if total > MAX_ANSWER:
            raise AnswerTooLarge(total)
        chunk = rfile.read(size)
        if len(chunk) != size:
            raise RemoteDisconnected("the answer was cut short")
        chunks.append(chunk)
        rfile.readline(MAX_LINE + 1)


def _closed_by_peer(sock: socket.socket) -> bool:
    """An idle kept-alive socket is readable only if the peer closed it (or misbehaved)."""
    try:
        readable, _, _ = select.select([sock], [], [], 0)
    except (OSError, ValueError):
        return True
    return bool(readable)
