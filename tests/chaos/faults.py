"""Faults the chaos suite injects into the demo's running stack (issue 40).

Each acts on the real parts from outside, as an outage would: Azurite's process (SIGSTOP)
or its endpoint (a proxy that refuses connections), a relay's process (SIGKILL), the
network path to a relay's callback, the channel receivers, a guest's wall clock. Nothing
in the app or the relay knows of them. The faults inside the local host's process (its
death mid-message, a dead-lettered document) are in tests/chaos/host_faults.py.

A fault's life over one run (tests/chaos/runner.py): `prepare()` before the demo starts
(what must be in place first, e.g. the proxy), `attach(demo, t0)` just before the plan
plays (its timer starts; `t0` is time.monotonic() then), `undo()` after the run, always,
whatever happened. `note` says what it did, for the table.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.chaos.proxy import RefusingProxy


class Fault:
    name = "none"
    window = 0.0  # seconds of real time the fault lasts (0: an instant)

    def __init__(self) -> None:
        self.note = ""
        # What the fault did to the stack, set only when it touched something (requests
        # held or cut, a process killed, a request refused...): a run whose fault left no
        # trace tested nothing, and counts as divergent (issue 47).
        self.trace = ""
        self._threads: list[threading.Thread] = []
        self._stop = threading.Event()

    def prepare(self) -> None:
        """Before the demo starts."""

    def attach(self, demo: Any, t0: float) -> None:
        """Just before the plan plays."""

    def undo(self) -> None:
        """After the run, always: every patch and every stopped process restored."""
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=10)

    def done_by(self) -> float:
        """How long after t0 the fault is surely over (the run waits at least that)."""
        return 0.0

    def _later(self, delay: float, action: Callable[[], None]) -> None:
        """Run `action` `delay` seconds from now on a thread of the fault's (skipped once
        undone)."""

        def run() -> None:
            if not self._stop.wait(max(0.0, delay)):
                action()

        thread = threading.Thread(target=run, name=f"chaos-{self.name}", daemon=True)
        thread.start()
        self._threads.append(thread)


class NoFault(Fault):
    """The fault-free run each run is compared with."""

    name = "none"


# ------------------------------------------------------------------ storage


class StorageOutage(Fault):
    """Azurite frozen (SIGSTOP: every request hangs) or refusing (its endpoint closed:
    connections refused, open ones reset) for `window` seconds, from `start` seconds into
    the plan. Every client reaches Azurite through a proxy (the host, the drain worker,
    the relays' liveness and pending rows), in the fault-free run too."""

    def __init__(self, kind: str, window: float, start: float = 3.0) -> None:
        super().__init__()
        assert kind in ("frozen", "refusing")
        self.kind, self.window, self.start = kind, window, start
        self.name = f"storage {kind} {window:g} s"
        self.azurite: Any = None
        self._stopped = False
        self._chunks = 0

    def prepare(self) -> None:
        install_proxied_azurite(self)

    def attach(self, demo: Any, t0: float) -> None:
        self._later(t0 + self.start - time.monotonic(), self._begin)
        self._later(t0 + self.start + self.window - time.monotonic(), self._end)

    def done_by(self) -> float:
        return self.start + self.window

    def _begin(self) -> None:
        self._chunks = self.azurite.proxy.client_chunks
        if self.kind == "frozen":
            os.kill(self.azurite.real_pid, signal.SIGSTOP)
            self._stopped = True
        else:
            reset = self.azurite.proxy.refuse()
            if reset:
                self.trace = f"{reset} open connections reset"
        self.note = f"from {self.start:g} s for {self.window:g} s"

    def _end(self) -> None:
        if self._stopped:
            held = self.azurite.proxy.client_chunks - self._chunks
            if held:
                self.trace = f"{held} reads of requests held while frozen"
            os.kill(self.azurite.real_pid, signal.SIGCONT)
            self._stopped = False
        if self.kind == "refusing":
            self.azurite.proxy.accept()

    def undo(self) -> None:
        super().undo()
        with contextlib.suppress(Exception):
            self._end()
        uninstall_proxied_azurite()


class StorageOutageInDrain(StorageOutage):
    """Storage refusing for `window` seconds from the moment the first drain's `decided`
    notification reaches the `terminate` subscription, so the drain workflow's run meets
    the outage (its Table requests refused) wherever in its run the outage lands.
    `deliveries`: the subscription's maxDeliveryCount lowered to it, so its deliveries run
    out within the outage (as an outage longer than Azure's ten does) and only the drain
    due from the event's row is left."""

    def __init__(self, window: float, deliveries: int | None = None) -> None:
        super().__init__("refusing", window, start=0.0)
        self.deliveries = deliveries
        self.name = f"storage refusing {window:g} s from the drain"
        if deliveries is not None:
            self.name += f", {deliveries} deliveries"
        self.demo: Any = None  # the run's demo, for a test to read once it is over

    def attach(self, demo: Any, t0: float) -> None:
        from functions.model.event import Transition

        self.demo = demo
        if self.deliveries is not None:
            demo.terminate_subscription.max_delivery_count = self.deliveries
        began = threading.Event()

        def decided(note: Any) -> None:
            drain = note.decision is not None and note.decision.action == "drain"
            if note.transition is Transition.DECIDED and drain and not began.is_set():
                began.set()
                self._begin()
                self.note = f"from the drain's start for {self.window:g} s"
                self.trace = f"storage refused {self.note}"
                self._later(self.window, self._end)

        # After the `terminate` subscription (subscribed at start): its run has begun.
        demo.publisher.subscribe("chaos", decided)

    def done_by(self) -> float:
        return self.window


_REAL_AZURITE: Any = None


def install_proxied_azurite(owner: Any = None) -> None:
    """Make the demo's Azurite one behind a RefusingProxy (its `.port` is the proxy's);
    `owner.azurite` is set to it once started."""
    import local.azurite as module

    global _REAL_AZURITE
    if _REAL_AZURITE is None:
        _REAL_AZURITE = module.Azurite
    real = _REAL_AZURITE

    class ProxiedAzurite(real):  # type: ignore[misc, valid-type]
        def start(self, timeout: float = 30.0, attempts: int = 3) -> Any:
            super().start(timeout, attempts)
            self.real_pid = self.proc.pid
            self.proxy = RefusingProxy(self.port).start()
            self.port = self.proxy.port  # connection_string now names the proxy
            if owner is not None:
                owner.azurite = self
            return self

        def stop(self) -> None:
            proxy = getattr(self, "proxy", None)
            if proxy is not None:
                proxy.stop()
            with contextlib.suppress(OSError):  # never leave it stopped
                os.kill(self.real_pid, signal.SIGCONT)
            super().stop()

    module.Azurite = ProxiedAzurite


def uninstall_proxied_azurite() -> None:
    import local.azurite as module

    if _REAL_AZURITE is not None:
        module.Azurite = _REAL_AZURITE


# ------------------------------------------------------------------ relays


class RelayKilledMidDrain(Fault):
    """SIGKILL a VM's relay while its drain hook script runs (the plan's hook takes a
    second), and start it again `restart_after` seconds later, with the same state
    directory, as systemd would."""

    def __init__(self, vm: str, restart_after: float = 1.0) -> None:
        super().__init__()
        self.vm, self.restart_after = vm, restart_after
        self.name = f"relay of {vm} killed mid-drain"

    def attach(self, demo: Any, t0: float) -> None:
        log = demo.workdir / "logs" / f"relay-{self.vm}.log"

        def watch() -> None:
            while not self._stop.wait(0.02):
                text = log.read_text(errors="replace") if log.exists() else ""
                if any("hook started" in line and "drain" in line for line in text.splitlines()):
                    self._kill_and_restart(demo, log)
                    return

        thread = threading.Thread(target=watch, name="chaos-relay-kill", daemon=True)
        thread.start()
        self._threads.append(thread)

    def _kill_and_restart(self, demo: Any, log: Path) -> None:
        from local.relays import relay_env

        proc = demo.relays[self.vm]
        proc.kill()
        proc.wait(timeout=10)
        killed = time.monotonic()
        self.trace = "killed in its drain hook"
        if self._stop.wait(self.restart_after):
            return
        demo.relays[self.vm] = demo.stack.process(
            list(proc.args), log, env=relay_env(demo.options.env)
        )
        self.note = f"SIGKILL in its drain hook, back {time.monotonic() - killed:.1f} s later"


class CallbackUnreachable(Fault):
    """The app cannot reach one VM's relay callback (connections fail, as through a
    network outage or a firewall) for `window` seconds from `start`: every request from
    this process (the host's approvals, the drain worker's hooks) to that address fails.
    The relay itself keeps polling and sending."""

    def __init__(self, vm: str, window: float, start: float = 0.0) -> None:
        super().__init__()
        self.vm, self.window, self.start = vm, window, start
        self.name = f"callback of {vm} unreachable {window:g} s"
        self.refused = 0
        self._real: Any = None

    def attach(self, demo: Any, t0: float) -> None:
        import requests

        target = demo.callback_urls[self.vm].split("://", 1)[1].rstrip("/")
        begin, end = t0 + self.start, t0 + self.start + self.window
        self._real = real = requests.Session.send

        def send(session: Any, request: Any, **kwargs: Any) -> Any:
            if target in request.url and begin <= time.monotonic() < end:
                self.refused += 1
                self.note = f"{self.refused} requests refused over {self.window:g} s"
                self.trace = self.note
                raise requests.ConnectionError(f"chaos: {target} unreachable")
            return real(session, request, **kwargs)

        requests.Session.send = send  # type: ignore[method-assign]

    def done_by(self) -> float:
        return self.start + self.window

    def undo(self) -> None:
        super().undo()
        if self._real is not None:
            import requests

            requests.Session.send = self._real  # type: ignore[method-assign]


class ClockStep(Fault):
    """A VM's guest wall clock steps `seconds` ahead (time sync, a bad NTP source) for
    `window` seconds from `start`, then back: the relay's time.time (its signatures'
    freshness, its liveness row, its ledger) reads the stepped clock
    (simulator/guest_clock.py, CLOCK_FILE.step)."""

    def __init__(self, vm: str, seconds: float, window: float, start: float = 0.0) -> None:
        super().__init__()
        self.vm, self.seconds, self.window, self.start = vm, seconds, window, start
        self.name = f"clock of {vm} {seconds:+g} s for {window:g} s"
        self._file: Path | None = None
        self._running = False

    def attach(self, demo: Any, t0: float) -> None:
        from local.demo_ledger import CLOCK_DIR

        self._file = demo.workdir / CLOCK_DIR / f"{self.vm}.json.step"
        self._file.parent.mkdir(parents=True, exist_ok=True)
        self._running = self.vm in demo.relays  # a relay reads the stepped clock
        self._later(t0 + self.start - time.monotonic(), self._step)
        self._later(t0 + self.start + self.window - time.monotonic(), self._back)

    def _step(self) -> None:
        assert self._file is not None
        self._file.write_text(f"{self.seconds}\n")
        self.note = f"{self.seconds:+g} s for {self.window:g} s"
        if self._running:
            self.trace = f"the clock of {self.vm}'s running relay stepped"

    def _back(self) -> None:
        if self._file is not None:
            self._file.unlink(missing_ok=True)

    def done_by(self) -> float:
        return self.start + self.window

    def undo(self) -> None:
        super().undo()
        self._back()


# ------------------------------------------------------------------ channels


class ChannelsDown(Fault):
    """Channel endpoints answer 503 for `window` seconds from `start`: past the local
    subscription's deliveries and each delivery's retries."""

    def __init__(self, channels: tuple[str, ...], window: float, start: float = 0.0) -> None:
        super().__init__()
        self.channels, self.window, self.start = channels, window, start
        self.name = f"{' and '.join(channels)} down {window:g} s"

    def attach(self, demo: Any, t0: float) -> None:
        receivers = [demo.receivers[c] for c in self.channels if c in demo.receivers]

        def down() -> None:
            for receiver in receivers:
                receiver.fail_next(10**9, 503)
            self.note = f"503 from {self.start:g} s for {self.window:g} s"

        def up() -> None:
            answered = sum(_failed_answers(receiver) for receiver in receivers)
            if answered:
                self.trace = f"{answered} posts answered 503"
            for receiver in receivers:
                receiver.clear_faults()

        self._later(t0 + self.start - time.monotonic(), down)
        self._later(t0 + self.start + self.window - time.monotonic(), up)
        self._up = up

    def done_by(self) -> float:
        return self.start + self.window

    def undo(self) -> None:
        super().undo()
        with contextlib.suppress(AttributeError):
            self._up()


def _failed_answers(receiver: Any) -> int:
    """Requests a receiver answered with the failure `fail_next(10**9, ...)` set."""
    with receiver._lock:
        return sum(10**9 - f.remaining for f in receiver._faults if f.remaining <= 10**9)
