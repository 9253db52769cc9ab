"""Faults the chaos suite injects inside the local host's process (issue 40): the host
dying between two Table requests of a document (and a new one taking over), and one
document dead-lettered. Unlike tests/chaos/faults.py's, which act on the stack from
outside (processes, endpoints, clocks, receivers), these patch the host's entry point
(local.host.ingest_message) and its Table transport, and put them back in `undo()`; the
Fault life cycle is the one tests/chaos/faults.py describes.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from typing import Any

from tests.chaos.faults import Fault

# ------------------------------------------------------------------ the host


class HostKilled(BaseException):
    """The host's process dies: not an Exception, so nothing in the host catches it."""


class HostKilledMidMessage(Fault):
    """The local host dies between two Table requests of a document (after
    `after_requests` of them) and a new host starts on the same inbox `restart_after`
    seconds later, as a new Functions instance takes the session once its lock lapses.
    The document is the first `match` accepts (default: the first with an event)."""

    def __init__(
        self,
        match: Callable[[dict[str, Any]], bool] | None = None,
        after_requests: int = 3,
        restart_after: float = 2.0,
    ) -> None:
        super().__init__()
        self.match = match or _with_events
        self.after_requests, self.restart_after = after_requests, restart_after
        self.name = "host killed mid-message"
        self.killed = threading.Event()
        self._local = threading.local()
        self._patched: list[tuple[Any, str, Any]] = []

    def prepare(self) -> None:
        import local.host as host
        from functions.store.http import Urllib3Transport  # the Table clients' transport

        real_ingest = host.ingest_message
        real_send = Urllib3Transport.send
        fault = self

        def ingest(body: bytes | str, pipeline: Any, message_id: str = "", **more: Any) -> Any:
            if fault.killed.is_set() or not fault._matches(body):
                return real_ingest(body, pipeline, message_id, **more)
            fault._local.countdown = fault.after_requests
            try:
                return real_ingest(body, pipeline, message_id, **more)
            finally:
                fault._local.countdown = None

        def send(transport: Any, request: Any, **kwargs: Any) -> Any:
            countdown = getattr(fault._local, "countdown", None)
            if countdown is not None:
                if countdown <= 0:
                    fault._local.countdown = None
                    fault.trace = f"died after {fault.after_requests} Table requests"
                    fault.killed.set()
                    raise HostKilled()
                fault._local.countdown = countdown - 1
            return real_send(transport, request, **kwargs)

        real_hook = threading.excepthook

        def excepthook(args: Any) -> None:
            if args.exc_type is not HostKilled:  # the host's death is the fault, not news
                real_hook(args)

        self._patched = [
            (host, "ingest_message", real_ingest),
            (Urllib3Transport, "send", real_send),
            (threading, "excepthook", real_hook),
        ]
        threading.excepthook = excepthook
        host.ingest_message = ingest
        Urllib3Transport.send = send  # type: ignore[method-assign]

    def _matches(self, body: bytes | str) -> bool:
        try:
            data = json.loads(body)
        except ValueError:
            return False
        return isinstance(data, dict) and self.match(data)

    def attach(self, demo: Any, t0: float) -> None:
        def restart() -> None:
            if not self.killed.wait(120) or self._stop.is_set():
                return
            died = time.monotonic()
            if self._stop.wait(self.restart_after):
                return
            start_host(demo)
            self.note = (
                f"died after {self.after_requests} Table requests of a document, a new host "
                f"{time.monotonic() - died:.1f} s later"
            )

        thread = threading.Thread(target=restart, name="chaos-host", daemon=True)
        thread.start()
        self._threads.append(thread)

    def undo(self) -> None:
        self.killed.set()
        super().undo()
        for owner, attribute, real in self._patched:
            setattr(owner, attribute, real)
        self._patched = []


def start_host(demo: Any) -> Any:
    """A new local host over the demo's inbox, settings, store and publisher, as
    local.orchestration starts the first one."""
    from local.host import LocalHost

    host = LocalHost(
        demo.inbox,
        demo.settings,
        demo.store,
        demo.publisher,
        watchdog_interval_seconds=5,
        admission=demo.admission,
        credential=demo.credential,
    )
    stop = threading.Event()
    thread = threading.Thread(
        target=host.run_forever,
        args=(stop,),
        kwargs={"poll_seconds": 0.05},
        name="local-functions-host-2",
        daemon=True,
    )
    thread.start()

    def stop_host() -> None:
        stop.set()
        thread.join(timeout=10)

    demo.stack.callback(stop_host)
    demo.host = host
    return host


def _with_events(data: dict[str, Any]) -> bool:
    return data.get("kind") == "document" and bool((data.get("document") or {}).get("Events"))


# ------------------------------------------------------------------ one document


class DeadLetter(Fault):
    """Every delivery of one document fails, with an error that is not an outage (an
    outage's failures are copied for later, functions/triggers/later.py), so the local
    host dead-letters it after its deliveries (`max_delivery_count`, as Service Bus does).
    The document is the first `match` accepts; a copy the relay sends again (`resent`,
    contract §11) goes through, as a document that failed on something passing would."""

    def __init__(self, match: Callable[[dict[str, Any]], bool]) -> None:
        super().__init__()
        self.match = match
        self.name = "a document dead-lettered"
        self.target = ""  # the message (file stem) chosen
        self.hits = 0
        self._lock = threading.Lock()
        self._real: Any = None

    def prepare(self) -> None:
        import local.host as host

        self._real = real = host.ingest_message

        def faulty(body: bytes | str, pipeline: Any, message_id: str = "", **more: Any) -> Any:
            if self._chosen(body, message_id):
                raise RuntimeError("chaos: this delivery fails (dead-letter)")
            return real(body, pipeline, message_id, **more)

        host.ingest_message = faulty

    def _chosen(self, body: bytes | str, message_id: str) -> bool:
        try:
            data = json.loads(body)
        except ValueError:
            return False
        if not isinstance(data, dict) or data.get("resent"):
            return False
        with self._lock:
            if not self.target and self.match(data):
                self.target = message_id
            if self.target and message_id == self.target:
                self.hits += 1
                self.note = f"{self.hits} deliveries of {self.target} failed"
                self.trace = self.note
                return True
        return False

    def undo(self) -> None:
        super().undo()
        if self._real is not None:
            import local.host as host

            host.ingest_message = self._real
            self._real = None

    def __enter__(self) -> DeadLetter:
        self.prepare()
        return self

    def __exit__(self, *exc: object) -> None:
        self.undo()


def end_of(vm: str) -> Callable[[dict[str, Any]], bool]:
    """The document that says `vm`'s events are over: the first with no event after one
    with events."""
    seen: set[str] = set()

    def match(data: dict[str, Any]) -> bool:
        if data.get("kind") != "document" or (data.get("vm") or {}).get("name") != vm:
            return False
        events = (data.get("document") or {}).get("Events") or []
        if events:
            seen.add(vm)
            return False
        return vm in seen

    return match
