"""Event Grid's side of agentless mode: every status change of an opted-in VM's or set's
events, published as `ScheduledEventEmitted` notifications, the way Event Grid delivers them.

Opt-in is per VM, scale set or availability set (`scheduledEventsPolicy.
scheduledEventsAdditionalPublishingTargets.eventGridAndResourceGraph`); an event is
published when its owner (the set of its VMs, or the VM) opted in. Delivery is at least
once and unordered on Azure, so the publisher can repeat a notification (same `id`) and
hold one back until after the next, at seeded rates: a test with a seed sees the same
duplicates and reorderings every run.

Sinks: a callable (tests), a directory (one JSON file per message, as Service Bus would
hold it: the local host's inbox) or an HTTP URL (POSTed as an array, as Event Grid's
webhook delivery does). Deliveries run on the publisher's own thread, so the simulator's
lock is never held while a sink is slow.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import queue
import random
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

import requests

from simulator import instance
from simulator.engine import Simulator

log = logging.getLogger(__name__)

EVENT_TYPE = "Microsoft.ResourceNotifications.MaintenanceResources.ScheduledEventEmitted"
Schema = Literal["eventgrid", "cloudevents"]
Sink = Callable[[bytes, str], None]  # (message body, message id)


def arm_owner_id(resource_type: str, name: str) -> str:
    return (
        f"/subscriptions/{instance.SUBSCRIPTION_ID}/resourceGroups/{instance.RESOURCE_GROUP}"
        f"/providers/Microsoft.Compute/{resource_type}/{name}"
    )


def notification(
    event: dict[str, Any],
    owner: tuple[str, str],
    *,
    schema: Schema = "eventgrid",
    grid_id: str | None = None,
    at: datetime | None = None,
    location: str = "westeurope",
) -> dict[str, Any]:
    """One notification for `event` (IMDS fields, any status) owned by `owner`."""
    subject = (
        f"{arm_owner_id(*owner)}/providers/microsoft.maintenance/scheduledevents/{event['EventId']}"
    )
    when = (at or datetime.now(UTC)).isoformat()
    data = {
        "resourceInfo": {
            "id": subject,
            "name": event["EventId"],
            "type": "microsoft.maintenance/scheduledEvents",
            "location": location,
            "properties": {**event, "ScheduledEventApiVersion": "2020-07-01"},
        },
        "operationalInfo": {"resourceEventTime": when},
        "apiVersion": "2020-07-01",
    }
    gid = grid_id or str(uuid.uuid4())
    topic = f"/subscriptions/{instance.SUBSCRIPTION_ID}"
    if schema == "cloudevents":
        return {
            "specversion": "1.0",
            "id": gid,
            "source": topic,
            "subject": subject,
            "type": EVENT_TYPE,
            "time": when,
            "data": data,
        }
    return {
        "id": gid,
        "topic": topic,
        "subject": subject,
        "eventType": EVENT_TYPE,
        "eventTime": when,
        "data": data,
        "dataVersion": "3.0",
        "metadataVersion": "1",
    }


# The file names the Event Grid stand-in writes end so; the local host delivers them as
# EVENTGRID_QUEUE's messages (in Azure only the system topic can send to that queue).
EVENT_GRID_SUFFIX = "-eventgrid.json"


def directory_sink(folder: str | Path) -> Sink:
    """One file per message, named to sort in delivery order; written under a dot-name and
    renamed, so a reader never sees half a file (the local host skips dot-files)."""
    path = Path(folder)
    path.mkdir(parents=True, exist_ok=True)
    counter = itertools.count()

    def deliver(body: bytes, message_id: str) -> None:
        name = f"{time.time_ns():020d}-{next(counter):06d}{EVENT_GRID_SUFFIX}"
        temp = path / f".{name}"
        temp.write_bytes(body)
        os.replace(temp, path / name)

    return deliver


def http_sink(url: str, session: requests.Session | None = None) -> Sink:
    """POST an array of one event, as Event Grid's webhook delivery does; retried a few
    times on failure, then dropped with a log line (Event Grid would dead-letter it)."""
    http = session or requests.Session()

    def deliver(body: bytes, message_id: str) -> None:
        payload = b"[" + body + b"]"
        headers = {"Content-Type": "application/json", "aeg-event-type": "Notification"}
        for attempt in range(3):
            try:
                answer = http.post(url, data=payload, headers=headers, timeout=10)
                if answer.status_code < 300:
                    return
            except requests.RequestException:
                pass
            time.sleep(0.5 * (attempt + 1))
        log.warning("Event Grid stand-in: %s not delivered to %s", message_id, url)

    return deliver


class EventGridPublisher:
    """Publish a Simulator's event changes for the opted-in VMs and sets to a sink."""

    def __init__(
        self,
        sim: Simulator,
        sink: Sink,
        *,
        opted_in: Iterable[str] = (),
        schema: Schema = "eventgrid",
        duplicate_rate: float = 0.0,
        reorder_rate: float = 0.0,
        seed: int | None = None,
        hold_seconds: float = 0.5,
    ) -> None:
        if not 0 <= duplicate_rate <= 1 or not 0 <= reorder_rate <= 1:
            raise ValueError("duplicate and reorder rates are between 0 and 1")
        self.sim = sim
        self.sink = sink
        self.schema = schema
        self.opted_in = {name.casefold() for name in opted_in}
        self.duplicate_rate = duplicate_rate
        self.reorder_rate = reorder_rate
        self.hold_seconds = hold_seconds
        self._random = random.Random(seed)  # noqa: S311 - test traffic, not security
        self._queue: queue.Queue[tuple[bytes, str] | None] = queue.Queue()
        self.delivered: list[tuple[str, str, str]] = []  # (grid id, EventId, status)
        self._lock = threading.Lock()
        self._idle = threading.Condition()
        self._pending = 0  # queued or held, not delivered yet
        self._thread = threading.Thread(target=self._run, name="eventgrid-standin", daemon=True)
        self._started = False

    def opt_in(self, *names: str) -> None:
        """Opt a VM, scale set or availability set in (its events are published from now);
        "*" opts every owner in."""
        self.opted_in.update(n.casefold() for n in names)

    def start(self) -> EventGridPublisher:
        if not self._started:
            self._started = True
            self._thread.start()
            self.sim.subscribe_events(self._on_change)
        return self

    def stop(self, timeout: float = 5.0) -> None:
        if self._started:
            self._queue.put(None)
            self._thread.join(timeout)

    def wants(self, owner: tuple[str, str], event: dict[str, Any]) -> bool:
        """Published if the owner opted in (a set opts in for all its VMs; a VM of a set
        cannot opt in on its own: the set's policy is its policy)."""
        return "*" in self.opted_in or owner[1].casefold() in self.opted_in

    def _on_change(self, event: dict[str, Any], owner: tuple[str, str]) -> None:
        # Called under the simulator's lock: render and queue only.
        if not self.wants(owner, event):
            return
        item = notification(event, owner, schema=self.schema, location=self.sim.location)
        body = json.dumps(item).encode()
        with self._idle:
            self._pending += 1
        self._queue.put((body, item["id"]))

    def _run(self) -> None:
        held: tuple[bytes, str] | None = None
        while True:
            try:
                message = self._queue.get(timeout=self.hold_seconds if held else None)
            except queue.Empty:
                message = None
                if held is not None:  # nothing came after it: deliver the held one late
                    self._deliver(*held)
                    held = None
                continue
            if message is None:
                if held is not None:
                    self._deliver(*held)
                return
            with self._lock:
                hold = held is None and self._random.random() < self.reorder_rate
                twice = self._random.random() < self.duplicate_rate
            if hold:
                held = message
                continue
            self._deliver(*message)
            if twice:
                self._deliver(*message, count=False)
            if held is not None:
                self._deliver(*held)  # after the one that came later: out of order
                held = None

    def _deliver(self, body: bytes, message_id: str, count: bool = True) -> None:
        try:
            data = json.loads(body)
            props = data["data"]["resourceInfo"]["properties"]
            with self._lock:
                self.delivered.append((message_id, props["EventId"], props["EventStatus"]))
            self.sink(body, message_id)
        except Exception:  # a sink bug must not stop the publisher
            log.exception("Event Grid stand-in: delivery of %s failed", message_id)
        finally:
            if count:
                with self._idle:
                    self._pending -= 1
                    self._idle.notify_all()

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until everything published so far was delivered; False on timeout."""
        with self._idle:
            return self._idle.wait_for(lambda: self._pending == 0, timeout)
