"""One place every outgoing request of the app passes, and the two faults injected there.

Every request the function app makes goes out through urllib3: the Table client through
functions.store.http.Urllib3Transport (PoolManager.urlopen), relay callbacks, drain hooks,
channel posts and ARM calls through requests (HTTPAdapter.send), and both end in
`HTTPConnectionPool.urlopen`. Patching that one method therefore counts them all in the
order they are sent. Topic sends do not go through HTTP here (the topic is a stand-in), so
the host's publisher calls `Faults.request` itself.

For request number k of a run, a fault is either
- `before`: the host dies just before sending k (k never reaches its receiver), or
- `lost`: k is applied, and the host dies before it sees the answer.
A request that gets no answer (its receiver closes the connection unanswered, as the
scenarios' slow relay does) is a point too: it went out, and may have been applied.
A death raises HostCrash, a BaseException, so no `except Exception` in the code under test
can swallow it; from then on every request of the dead host raises it too (its `finally`
blocks and worker threads cannot write), until the harness starts a fresh host.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal

from urllib3.connectionpool import HTTPConnectionPool

Kind = Literal["before", "lost"]


class HostCrash(BaseException):
    """The Functions host died here (a BaseException: `except Exception` cannot catch it)."""


@dataclass(frozen=True)
class Fault:
    index: int  # 1-based number of the request in the run
    kind: Kind


@dataclass(frozen=True)
class Sent:
    """One request of a run, as the fault-free run saw it: enough to tell which crash
    points leave the world in the same state (explore.equivalence)."""

    index: int
    label: str
    step: int  # index of the scenario step that sent it
    changes_before: int  # writes applied (and messages settled) before it, in the whole run
    clock_before: str
    write: bool  # it changes something outside the host (a read changes nothing)
    clock_after: str
    error: str = ""  # it got no answer: why (the receiver closed the connection, a timeout)


@dataclass
class Faults:
    """Counts requests while `armed`; raises HostCrash at the planned fault and after it.

    `classify(host, port, method, path)` names a request for the log ("table POST events",
    "relay /v1/start"), or returns None for one that is not the run's (`foreign`);
    `on_applied(label, context)` is told of every request that reached its receiver (the
    outside effects are read at the receivers, this is for the log)."""

    classify: Callable[[str, int, str, str], str | None]
    now: Callable[[], object] = lambda: ""
    fault: Fault | None = None
    step: int = 0
    changes: int = 0  # writes applied and messages settled so far
    sent: list[Sent] = field(default_factory=list)
    armed: bool = False
    dead: bool = False
    count: int = 0
    log: list[str] = field(default_factory=list)  # label of every request, in order
    fired: str = ""  # the label of the request the fault hit
    # Double faults (issue 37): the host that takes over dies too, at the same request of
    # the retried step (the same label, the first time it comes again), the same way.
    twice: bool = False
    _again: tuple[str, str] | None = None
    # Requests of this process that were not the run's (classify gave None): a thread an
    # earlier test of the same worker left behind, calling its own stopped Azurite. They
    # pass untouched and uncounted, and are named here for the report.
    foreign: list[str] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _open: dict[int, tuple[int, str]] = field(default_factory=dict)

    def request(self, label: str) -> tuple[int, bool]:
        """Called before each request: its number in the run, and whether the caller must
        apply it and then die (its answer is lost); raises HostCrash to die before it."""
        with self._lock:
            if not self.armed:
                return 0, False
            if self.dead:
                raise HostCrash(f"dead host: {label}")
            self.count += 1
            self.log.append(label)
            self._open[self.count] = (self.changes, str(self.now()))
            fault = self.fault
            if self._again is not None and self._again[0] == label:
                fault = Fault(self.count, self._again[1])  # type: ignore[arg-type]
                self._again = None
            elif fault is None or fault.index != self.count:
                return self.count, False
            elif self.twice:
                self._again = (label, fault.kind)
            self.fired = self.fired or label
            if fault.kind == "before":
                self.dead = True
                raise HostCrash(f"crash before request {self.count}: {label}")
            return self.count, True

    def done(self, index: int, label: str, write: bool, error: str = "") -> None:
        """Request `index` was sent: it reached its receiver (and, unless the host died, was
        answered), or it failed with `error` after it went out (it may have been applied)."""
        with self._lock:
            if not self.armed:
                return
            before, clock = self._open.pop(index, (self.changes, ""))
            if write:
                self.changes += 1
            self.sent.append(
                Sent(index, label, self.step, before, clock, write, str(self.now()), error)
            )

    def settled(self) -> None:
        """A Service Bus message was completed: a change that is not an app request."""
        with self._lock:
            self.changes += 1

    def die_after(self, label: str) -> None:
        with self._lock:
            self.dead = True
        raise HostCrash(f"crash after request {self.count} (answer lost): {label}")

    def revive(self) -> None:
        """A fresh host: requests flow again (the fault has fired; it fires only once)."""
        with self._lock:
            self.dead = False

    @contextmanager
    def paused(self) -> Iterator[None]:
        """Requests that are not the app's (booting a host, reading the end state)."""
        with self._lock:
            was = self.armed
            self.armed = False
        try:
            yield
        finally:
            with self._lock:
                self.armed = was


_ACTIVE: list[Faults] = []
_ORIGINAL = HTTPConnectionPool.urlopen
_inside = threading.local()
# Every connection pool a request went through while installed: a forked run drops the
# connections it inherited (tests.crash.checkpoint), whose other end is its parent's.
POOLS: weakref.WeakSet[HTTPConnectionPool] = weakref.WeakSet()


def _urlopen(pool: HTTPConnectionPool, method: str, url: str, *args: Any, **kwargs: Any) -> Any:
    faults = _ACTIVE[-1] if _ACTIVE else None
    POOLS.add(pool)
    if faults is None or getattr(_inside, "depth", 0):  # urllib3's own retry recursion
        return _ORIGINAL(pool, method, url, *args, **kwargs)
    label = faults.classify(pool.host, pool.port or 80, method, url)
    if label is None:  # not the run's: another test's leftover thread (Faults.foreign)
        with faults._lock:
            faults.foreign.append(f"{method} {pool.host}:{pool.port} {url[:60]}")
        return _ORIGINAL(pool, method, url, *args, **kwargs)
    index, lose = faults.request(label)
    # A Table read (GET) changes nothing; everything else (a Table write, a callback, a
    # hook, a post) may change something outside the host.
    write = not label.startswith("table GET")
    _inside.depth = 1
    try:
        response = _ORIGINAL(pool, method, url, *args, **kwargs)
    except Exception as exc:
        # No answer (the receiver closed the connection unanswered, a timeout): the request
        # went out and may have been applied, so it is a crash point like any other (die
        # before it; die instead of seeing its failure), and its failure is recorded.
        if index:
            faults.done(index, label, write, error=f"{type(exc).__name__}: {exc}"[:160])
        if lose:
            faults.die_after(label)
        raise
    finally:
        _inside.depth = 0
    if index:
        faults.done(index, label, write)
    if lose:
        faults.die_after(label)
    return response


@contextmanager
def installed(faults: Faults) -> Iterator[Faults]:
    """Route every urllib3 request of this process through `faults` while inside."""
    _ACTIVE.append(faults)
    HTTPConnectionPool.urlopen = _urlopen  # type: ignore[method-assign]
    try:
        yield faults
    finally:
        _ACTIVE.remove(faults)
        if not _ACTIVE:
            HTTPConnectionPool.urlopen = _ORIGINAL  # type: ignore[method-assign]
