"""Crash runs that start where their fault is: the fault-free run is replayed once more,
and before each step that holds crash points the process forks, one copy per point.

A crash run is the fault-free run up to its point: the same steps, the same requests,
the same answers (explore.equivalence relies on it too). Running that common part again for
every point was a third of the explorer's requests. Here the replay stops before the step
of each point's first fault; Azurite saves the scenario's tables as stored
(local/azurite_checkpoint.cjs: rows, ETags and timestamps); a forked child takes the fault
and runs the rest of the scenario with everything the host holds in memory (its caches,
ETags it read, the FakeClock, the receivers' records), reads the end state and the
invariants and hands them back through a pipe; the parent puts the tables back and forks
the next. What a child inherits is what a fresh run would have at that point, and the
replay checks that it is: the same number of requests before each step as the fault-free
run, the same end state after the last.

A fork takes only the thread that forks: the receivers' serving threads are stopped in the
parent while its children run and started again in each child; a child drops the pooled
connections it inherited (their other ends are the parent's Azurite and receiver
handlers) and opens its own.
"""

from __future__ import annotations

import gc
import http.client
import os
import pickle
import select
import signal
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from local.azurite import table_url
from tests.crash import invariants, runner
from tests.crash.faults import POOLS, Fault, Sent
from tests.crash.state import snapshot, table_rows
from tests.crash.world import Servers, World

CHILD_SECONDS = 600.0  # one crash run, at most (the longest takes seconds)


class CheckpointError(AssertionError):
    """The replay left the fault-free run's path, or a forked run failed: loud, never a
    result."""


@dataclass
class Result:
    """What one forked crash run hands back."""

    state: dict[str, Any]
    fired: str  # the label of the request its fault hit
    broken: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


class Checkpoints:
    """Azurite's save and restore of one table prefix (local/azurite_checkpoint.cjs)."""

    def __init__(self, connection: str) -> None:
        endpoint = urlsplit(table_url(connection, ""))
        self.host, self.port = endpoint.hostname or "127.0.0.1", endpoint.port or 80

    def _post(self, what: str, prefix: str) -> int:
        connection = http.client.HTTPConnection(self.host, self.port, timeout=30)
        try:
            connection.request("POST", f"/__checkpoint/{what}?prefix={prefix}")
            response = connection.getresponse()
            response.read()
            return response.status
        finally:
            connection.close()

    def available(self) -> bool:
        """Whether this Azurite was started with the checkpoints (Azurite(checkpoints=True))."""
        return self._post("drop", "probe0") == 204

    def call(self, what: str, prefix: str) -> None:
        status = self._post(what, prefix)
        if status != 204:
            raise CheckpointError(f"Azurite checkpoint {what} {prefix}: HTTP {status}")


def pause(servers: Servers) -> None:
    """Every receiver stops serving (at once: each stop waits for its serving loop's poll);
    their sockets stay open for the children to serve on."""
    stoppers = [threading.Thread(target=s.shutdown) for s in servers.http_servers()]
    for thread in stoppers:
        thread.start()
    for thread in stoppers:
        thread.join()


def resume(servers: Servers) -> None:
    for server in servers.http_servers():
        threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True).start()


def _forget_connections() -> None:
    """A child's pools start empty: an inherited connection would carry the child's request
    to the parent's handler at the other end (or interleave with the parent's next one)."""
    for pool in list(POOLS):
        queue = pool.QueueCls(pool.pool.maxsize if pool.pool is not None else 1)
        for _ in range(queue.maxsize):
            queue.put(None)
        pool.pool = queue


def run_forked(
    world: World,
    steps: list[runner.Step],
    groups: list[list[Fault]],
    sent: list[Sent],
    checkpoints: Checkpoints,
) -> tuple[list[Result], runner.Outcome]:
    """The fault-free run once more on `world`, forking before each step that holds the
    first fault of a group; each group's Result, in the order of `groups`, and the replay's
    own outcome (the caller compares its end state with the fault-free run's)."""
    step_of = {s.index: s.step for s in sent}
    before = [sum(1 for s in sent if s.step < index) for index in range(len(steps) + 1)]
    at: dict[int, list[int]] = {}
    for number, group in enumerate(groups):
        # A point past the fault-free run's requests (`only`) forks at the start.
        at.setdefault(step_of.get(group[0].index, 0), []).append(number)
    results: list[Result | None] = [None] * len(groups)
    faults, outcome = world.faults, runner.Outcome()
    faults.armed = True
    try:
        for index, step in enumerate(steps):
            faults.step = index
            if index in at:
                if faults.count != before[index]:
                    raise CheckpointError(
                        f"the replay sent {faults.count} requests before step {index}"
                        f" ({step.label}), the fault-free run {before[index]}"
                    )
                checkpoints.call("save", world.prefix)
                pause(world.servers)
                try:
                    for number in at[index]:
                        results[number] = _child(world, steps, index, groups[number][0], outcome)
                        checkpoints.call("restore", world.prefix)
                finally:
                    resume(world.servers)
            runner._run_step(world, step, outcome)
    finally:
        faults.armed = False
        checkpoints.call("drop", world.prefix)
    return [r for r in results if r is not None], outcome


def _child(
    world: World, steps: list[runner.Step], start: int, fault: Fault, outcome: runner.Outcome
) -> Result:
    read, write = os.pipe()
    gc.freeze()  # the child's collections leave the inherited objects (and their pages) alone
    pid = os.fork()
    if pid == 0:  # the child: never returns
        os.close(read)
        _run_child(write, world, steps, start, fault, outcome)
    gc.unfreeze()
    os.close(write)
    return _collect(pid, read, fault)


def _run_child(
    write: int,
    world: World,
    steps: list[runner.Step],
    start: int,
    fault: Fault,
    outcome: runner.Outcome,
) -> None:
    try:
        faults = world.faults
        faults._lock = threading.Lock()  # held by no thread of this process
        _forget_connections()
        resume(world.servers)
        faults.fault = fault
        for index in range(start, len(steps)):
            faults.step = index
            runner._run_step(world, steps[index], outcome)
        faults.armed = False
        tables = table_rows(world)
        broken = invariants.check(world, tables)
        if not faults.fired:
            raise CheckpointError(f"the fault {fault} never fired (the run has fewer requests)")
        payload: Any = Result(snapshot(world, tables), faults.fired, broken, outcome.errors)
    except BaseException:  # handed to the parent, which raises it
        payload = traceback.format_exc()
    try:
        with os.fdopen(write, "wb") as pipe:
            pipe.write(pickle.dumps(payload))
    finally:
        os._exit(0)


def _collect(pid: int, read: int, fault: Fault, seconds: float = CHILD_SECONDS) -> Result:
    chunks: list[bytes] = []
    deadline = time.monotonic() + seconds
    try:
        while True:
            left = deadline - time.monotonic()
            ready, _, _ = select.select([read], [], [], max(0.0, left))
            if not ready:
                os.kill(pid, signal.SIGKILL)
                raise CheckpointError(f"the crash run of {fault} took over {seconds:g} s")
            chunk = os.read(read, 1 << 20)
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(read)
        _, status = os.waitpid(pid, 0)
    if not chunks:
        raise CheckpointError(f"the crash run of {fault} died without a result ({status})")
    payload = pickle.loads(b"".join(chunks))  # noqa: S301 - our own child's result
    if isinstance(payload, str):
        raise CheckpointError(f"the crash run of {fault} failed:\n{payload}")
    result: Result = payload
    return result
