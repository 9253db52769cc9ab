"""One outgoing HTTP exchange within a deadline for the whole of it.

requests' (and urllib3's) `timeout` bounds each socket operation, not the exchange: a peer
that answers one byte a second never trips a 10 s read timeout, and holds the caller for
as long as it likes. Whatever a VM controls must cost only that VM (a relay's callback, a
drain hook on it), so every exchange the app starts goes through `exchange`:

- the connection is its own (a one-off pool), so its socket is known;
- a timer shuts that socket down when the deadline passes, which wakes a read blocked in
  the status line, the headers or the body at once;
- the body is read up to `max_bytes` (an answer is a few hundred bytes; a peer that sends
  more is cut off, never buffered whole).

`DeadlineExceeded` (a requests.Timeout, so callers that already treat timeouts as "try
again later" need nothing new) says which deadline passed.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from typing import Any, TypeVar

import requests
from requests.adapters import HTTPAdapter
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool

MAX_ANSWER_BYTES = 64 * 1024


class DeadlineExceeded(requests.Timeout):
    """The whole exchange did not finish within its deadline."""


class _Sockets:
    """The sockets one exchange opened; shut down when its deadline passes."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.open: list[socket.socket] = []
        self.expired = False

    def add(self, sock: socket.socket) -> None:
        with self.lock:
            self.open.append(sock)
            if self.expired:
                _shut(sock)

    def expire(self) -> None:
        with self.lock:
            self.expired = True
            for sock in self.open:
                _shut(sock)


def _shut(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):  # closed already
        sock.shutdown(socket.SHUT_RDWR)


_Connection = TypeVar("_Connection", bound=HTTPConnection)


def _adapter(sockets: _Sockets) -> HTTPAdapter:
    """An adapter whose connections report their sockets to `sockets`."""

    def tracked(base: type[_Connection]) -> type[_Connection]:
        class Tracked(base):  # type: ignore[valid-type, misc]
            def _new_conn(self) -> socket.socket:
                sock = super()._new_conn()
                sockets.add(sock)
                return sock

        return Tracked

    class Pool(HTTPConnectionPool):
        ConnectionCls = tracked(HTTPConnection)

    class TlsPool(HTTPSConnectionPool):
        ConnectionCls = tracked(HTTPSConnection)

    adapter = HTTPAdapter(pool_connections=1, pool_maxsize=1, max_retries=0)
    adapter.poolmanager.pool_classes_by_scheme = {"http": Pool, "https": TlsPool}
    return adapter


def exchange(
    method: str,
    url: str,
    *,
    seconds: float,
    max_bytes: int = MAX_ANSWER_BYTES,
    session: requests.Session | None = None,
    **kwargs: Any,
) -> requests.Response:
    """`method url` within `seconds` in all (connect, send, status, headers, body), the
    body read up to `max_bytes`. Raises DeadlineExceeded when the deadline passed,
    requests' own exceptions otherwise. `session`: where proxies and headers would come
    from (its settings are merged as requests does); the connection is never its pool's.
    Redirects are never followed (a caller that wants one follows it itself)."""
    if seconds <= 0:
        raise DeadlineExceeded(f"no time left for {method} {_where(url)}")
    sockets = _Sockets()
    timer = threading.Timer(seconds, sockets.expire)
    timer.daemon = True
    with requests.Session() as own:
        if session is not None:
            own.headers.update(session.headers)
            own.trust_env = session.trust_env
            own.proxies.update(session.proxies)
            own.verify = session.verify
        adapter = _adapter(sockets)
        own.mount("http://", adapter)
        own.mount("https://", adapter)
        timeout = kwargs.pop("timeout", None) or seconds
        kwargs.setdefault("allow_redirects", False)
        began = time.monotonic()
        timer.start()
        try:
            response = own.request(method, url, timeout=timeout, stream=True, **kwargs)
            try:
                body = response.raw.read(max_bytes, decode_content=True)
            finally:
                response.close()
            response._content = body  # where requests keeps a body it read
        except requests.RequestException as exc:
            # requests' own timeout (at most the deadline) can fire a moment before the
            # timer on a busy machine: a timeout once the deadline passed is the deadline.
            late = isinstance(exc, requests.Timeout) and time.monotonic() - began >= 0.99 * seconds
            if sockets.expired or late:
                raise DeadlineExceeded(
                    f"{method} {_where(url)}: no whole answer within {seconds:.1f} s"
                ) from exc
            raise
        except Exception as exc:  # urllib3's own errors, raised while reading the body
            if sockets.expired:
                raise DeadlineExceeded(
                    f"{method} {_where(url)}: no whole answer within {seconds:.1f} s"
                ) from exc
            raise requests.ConnectionError(str(exc)) from exc
        finally:
            timer.cancel()
    if sockets.expired:
        raise DeadlineExceeded(f"{method} {_where(url)}: no whole answer within {seconds:.1f} s")
    return response


def _where(url: str) -> str:
    """Scheme, host and path only: a query may carry a secret (a webhook's key)."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{parts.hostname}{port}{parts.path}"
