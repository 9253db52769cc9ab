"""The demo's stop, as every thread of its function app sees it.

In Azure a drain run ends with its function's host; here the drain workflow and the host's
sweep run in the demo's own threads, and a run waits a long time by design: a drain hook
may take the scaled step timeout to answer, a relay that cannot be reached is tried again
until the drain deadline, a readiness drain waits out its probe. Stopping the demo must
not wait for any of that, nor leave a thread behind that later talks to this demo's
Azurite, stopped by then (issue 46, 7d: a demo took over 30 s to stop on SIGINT, and a
leaked drain thread's Table requests landed in a later crash scenario).

`StopSignal` is the one switch: the host's clock and HTTP session come from it
(`clock()`, `session()`), so once it is set (`set()`) every wait of theirs raises
`Stopped`, no new request goes out, and a request in flight has its connection shut, so
a run in any of its waits ends at once. `Stopped` is a BaseException: it unwinds the run
as a crash would (every step is safe to run again, functions.terminate.context), past
the `except Exception` that would otherwise count it a failure and deliver it again.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import weakref
from datetime import UTC, datetime
from typing import Any

import requests
from requests.adapters import HTTPAdapter
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool


class Stopped(BaseException):
    """The demo is stopping: the run ends here, as it would if its host died."""


class StopSignal:
    """Set once when the demo begins to stop; the clock and sessions made here obey it."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self._lock = threading.Lock()
        self._connections: weakref.WeakSet[HTTPConnection] = weakref.WeakSet()

    def is_set(self) -> bool:
        return self._event.is_set()

    def check(self) -> None:
        """Raise Stopped once the demo is stopping."""
        if self._event.is_set():
            raise Stopped

    def wait(self, seconds: float) -> None:
        """Sleep `seconds`, or raise Stopped as soon as the demo stops."""
        if self._event.wait(max(seconds, 0.0)):
            raise Stopped

    def set(self) -> None:
        """Stop: every wait raises, and every connection a session made is shut, so a
        request waiting for its answer ends now (its thread then raises Stopped)."""
        with self._lock:
            self._event.set()
            connections = list(self._connections)
        for connection in connections:
            _shut(connection)

    def clock(self) -> StoppableClock:
        return StoppableClock(self)

    def session(self) -> requests.Session:
        """A requests.Session whose requests this signal refuses and cuts once set."""
        session = requests.Session()
        adapter = _StoppableAdapter(self)
        session.mount("http://", adapter)
        session.mount("https://", adapter)
        return session

    def _track(self, connection: HTTPConnection) -> None:
        with self._lock:
            stopped = self._event.is_set()
            if not stopped:
                self._connections.add(connection)
        if stopped:  # connected while the stop began: shut like the others
            _shut(connection)


class StoppableClock:
    """functions.clock.SystemClock whose sleep ends, raising Stopped, when the demo stops."""

    def __init__(self, signal: StopSignal) -> None:
        self.signal = signal

    def now(self) -> datetime:
        return datetime.now(UTC)

    def sleep(self, seconds: float) -> None:
        self.signal.check()
        if seconds > 0:
            self.signal.wait(seconds)


def _shut(connection: HTTPConnection) -> None:
    sock = getattr(connection, "sock", None)
    if sock is not None:
        # The plain socket's shutdown (not TLS's, which also drops its state under a
        # reader): a recv blocked in another thread returns at once.
        with contextlib.suppress(OSError):
            socket.socket.shutdown(sock, socket.SHUT_RDWR)


class _StoppableAdapter(HTTPAdapter):
    def __init__(self, signal: StopSignal) -> None:
        self.signal = signal
        super().__init__()

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        super().init_poolmanager(*args, **kwargs)
        signal = self.signal

        class Plain(HTTPConnection):
            def connect(self) -> None:
                super().connect()
                signal._track(self)

        class Secure(HTTPSConnection):
            def connect(self) -> None:
                super().connect()
                signal._track(self)

        class PlainPool(HTTPConnectionPool):
            ConnectionCls = Plain

        class SecurePool(HTTPSConnectionPool):
            ConnectionCls = Secure

        self.poolmanager.pool_classes_by_scheme = {"http": PlainPool, "https": SecurePool}

    def send(self, request: requests.PreparedRequest, *args: Any, **kwargs: Any) -> Any:
        self.signal.check()
        try:
            return super().send(request, *args, **kwargs)
        except requests.RequestException:
            self.signal.check()  # cut by the stop: not the receiver's failure
            raise
