"""The local stand-in for one Service Bus topic subscription: its own queue and worker."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from functions.notify.dispatch import claimant
from functions.notify.kept import MAX_DELIVERY_COUNT
from functions.triggers.later import hold_through_outage


class Subscription:
    """One topic subscription: its own queue and worker, so a slow or failing channel
    delays nobody else (not the other channels, not ingest, not an approval).

    Like Service Bus: a handler that raises gets the message again (up to
    `max_delivery_count`, the channel subscriptions' maxDeliveryCount as deployed: a test
    ties them), then it is dead-lettered for this subscription only.
    """

    def __init__(
        self,
        name: str,
        handler: Callable[[Any], Any],
        on_done: Callable[[str, Any, Any, str | None], None] | None = None,
        max_delivery_count: int = MAX_DELIVERY_COUNT,
        counted: bool = False,
        hold_scale: float = 1.0,
    ) -> None:
        """`counted`: the handler takes the delivery's number too (Service Bus's
        DeliveryCount, 1 first), as the app's channels do to keep a post on the last, and
        the delivery's owner (functions.notify.dispatch.claimant: one per delivery, the
        same for each of its tries through an outage, as functions.triggers.notify)."""
        self.name = name
        self.handler = handler
        self.counted = counted
        self.on_done = on_done
        self.max_delivery_count = max_delivery_count
        self.hold_scale = hold_scale  # an outage's hold, in the demo's faster time
        self.dead_letters: list[tuple[Any, str]] = []
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._unfinished = 0  # messages put and not yet done with (queued or in delivery)
        self._count = threading.Lock()
        self._thread = threading.Thread(target=self._run, name=f"sub-{name}", daemon=True)

    def start(self) -> Subscription:
        self._thread.start()
        return self

    def put(self, note: Any) -> None:
        with self._count:
            self._unfinished += 1
        self._queue.put(note)

    def idle(self) -> bool:
        """No message queued or in its deliveries: each one put is done with (delivered,
        kept or dead-lettered) and `on_done` has seen it. What waits for the channels to
        catch up (the chaos runner's settle) asks this, not the clock."""
        with self._count:
            return self._unfinished == 0

    def stop(self, timeout: float = 10.0) -> None:
        self._queue.put(_STOP)
        self._thread.join(timeout=timeout)

    def _run(self) -> None:
        while (note := self._queue.get()) is not _STOP:
            result: Any = None
            error: str | None = None
            for delivery in range(1, self.max_delivery_count + 1):
                owner = claimant()
                try:
                    # Storage down: held inside the delivery as the app's channel triggers
                    # hold it (functions.triggers.later), in the demo's time.
                    result = hold_through_outage(
                        lambda d=delivery, o=owner: (
                            self.handler(note, d, o) if self.counted else self.handler(note)
                        ),
                        time.sleep,
                        scale=self.hold_scale,
                    )
                    error = None
                    break
                except Exception as exc:
                    error = f"{type(exc).__name__}: {exc}"
                    time.sleep(0.2)
            if error:
                self.dead_letters.append((note, error))
            try:
                if self.on_done is not None:
                    self.on_done(self.name, note, result, error)
            finally:
                with self._count:
                    self._unfinished -= 1


_STOP = object()
