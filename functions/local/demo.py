"""`make demo`: real maintenance played on one machine, end to end, in about a minute.

The IMDS simulator plays a small fleet's maintenance at 60x speed; one real relay per VM
forwards every changed document into a shared inbox directory (the local stand-in for the
Service Bus queue); the functions' local host runs the same ingest, policy, approval and
fan-out code as Azure, with state in Azurite; local receivers stand in for Teams, PagerDuty
and a webhook unless real URLs are set in the environment. The timeline printed as it goes
is built from what each part actually observed (documents, decisions, HTTP requests that
arrived, StartRequests the simulator received), never from what we expected, so a broken
part shows up as a failed outcome and a non-zero exit, which is how CI uses it.

The orchestration (`Demo`) is a library too: the end-to-end tests and the bench drive it.
"""

from __future__ import annotations

import argparse
import contextlib
import hmac
import os
import queue
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import requests
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from functions.local.receivers import (
    DrainHookReceiver,
    PagerDutyReceiver,
    Received,
    Receiver,
    TeamsReceiver,
    WebhookReceiver,
)
from functions.local.report import Outcome, Timeline, short_id, summary_lines, write_html
from functions.notify.settings import PAGERDUTY_EVENTS_URL
from relay.models import STARTED, parse_document, parse_not_before

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_REPORT = ROOT / "out" / "demo-report.html"
# A PagerDuty routing key has 32 characters; this one only ever reaches the local receiver.
LOCAL_ROUTING_KEY = "demo" + "0" * 28


# --------------------------------------------------------------------------- the fleet


class VmSpec(BaseModel):
    model_config = ConfigDict(frozen=True)

    name: str
    availability_set: str | None = None
    scale_set: str | None = None
    spot: bool = False

    @property
    def group(self) -> str:
        if self.availability_set:
            return f"availability set {self.availability_set}"
        if self.scale_set:
            return f"scale set {self.scale_set}"
        return "Spot VM" if self.spot else "standalone VM"


class Step(BaseModel):
    """One scenario played at `at` seconds (real, already scaled) after the demo starts."""

    model_config = ConfigDict(frozen=True)

    at: float
    scenario: str
    target: str  # a VM name, or an availability set name for set-wide events
    story: str = ""  # what the audience should expect, in words


FLEET: tuple[VmSpec, ...] = (
    VmSpec(name="web-1", availability_set="web-as"),
    VmSpec(name="web-2", availability_set="web-as"),
    VmSpec(name="workers_0", scale_set="workers"),
    VmSpec(name="workers_1", scale_set="workers"),
    VmSpec(name="spot-1", spot=True),
)

PLAN: tuple[Step, ...] = (
    Step(
        at=0.0,
        scenario="live-migration",
        target="web-1",
        story="live-migration Freeze 5 s: approved at once",
    ),
    Step(
        at=1.0,
        scenario="user-reboot",
        target="spot-1",
        story="user-initiated reboot: approved at once",
    ),
    Step(
        at=2.0,
        scenario="platform-reboot",
        target="web-as",
        story="platform reboot of the set: held, announced once",
    ),
    Step(
        at=3.0,
        scenario="terminate",
        target="workers_0",
        story="scale-in: drained first, then approved",
    ),
    Step(
        at=4.0,
        scenario="cancelled",
        target="workers_1",
        story="maintenance that Azure withdraws: cancelled",
    ),
    Step(
        at=12.0, scenario="preempt", target="spot-1", story="Spot eviction with 30 s notice: paged"
    ),
    Step(
        at=14.0,
        scenario="hardware-failure",
        target="workers_1",
        story="host failure: appears already Started",
    ),
)


# --------------------------------------------------------------------------- options


class DemoOptions(BaseModel):
    time_scale: float = Field(default=60.0, gt=0)
    time_limit: float = Field(default=170.0, gt=0)  # the hard limit: all stopped by then
    settle: float = Field(default=3.0, ge=0)  # quiet seconds after the last event went away
    report: Path | None = DEFAULT_REPORT
    fleet: tuple[VmSpec, ...] = FLEET
    plan: tuple[Step, ...] = PLAN
    # The scale set's notBeforeTimeout: PT10M (5 to 15 minutes are allowed).
    terminate_timeout: float = Field(default=600.0, ge=300, le=900)
    poll_interval: float = Field(default=0.25, gt=0)  # relays' IMDS polling (1 s in Azure)
    keep: bool = False  # keep the working directory (relay logs, inbox, processed messages)
    env: dict[str, str] = Field(default_factory=lambda: dict(os.environ))


class DemoAborted(Exception):
    """Stopped by Ctrl-C, SIGTERM or the hard time limit; everything is still cleaned up."""


# --------------------------------------------------------------------------- processes


class Stack:
    """Everything the demo started, stopped in reverse order whatever happens.

    Child processes get their own session so a Ctrl-C in the terminal reaches only the
    demo, which then stops them in order (relays before the host, Azurite last) instead
    of everything dying at once mid-write.
    """

    def __init__(self) -> None:
        self._exit = contextlib.ExitStack()
        self.processes: list[subprocess.Popen[bytes]] = []

    def callback(self, fn: Callable[..., Any], *args: Any) -> None:
        self._exit.callback(fn, *args)

    def enter(self, context: Any) -> Any:
        return self._exit.enter_context(context)

    def process(
        self, argv: list[str], log: Path, env: dict[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        log.parent.mkdir(parents=True, exist_ok=True)
        handle = open(log, "ab")  # noqa: SIM115 - closed by the stack
        self._exit.callback(handle.close)
        proc = subprocess.Popen(  # noqa: S603 - our own interpreter and modules, no shell
            argv,
            stdout=handle,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=ROOT,
            start_new_session=True,
        )
        self.processes.append(proc)
        self._exit.callback(stop_process, proc)
        return proc

    def close(self) -> None:
        self._exit.close()

    def kill_all(self) -> None:
        """Last resort, from the hard-limit timer: no waiting, no cleanup code."""
        for proc in self.processes:
            with contextlib.suppress(OSError):
                proc.kill()


def stop_process(proc: subprocess.Popen[bytes], timeout: float = 5.0) -> None:
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=5)


# --------------------------------------------------------------------------- watching IMDS


class Subscription:
    """One topic subscription: its own queue and worker, so a slow or failing channel
    delays nobody else (not the other channels, not ingest, not an approval).

    Like Service Bus: a handler that raises gets the message again (up to
    `max_delivery_count`), then it is dead-lettered for this subscription only.
    """

    def __init__(
        self,
        name: str,
        handler: Callable[[Any], Any],
        on_done: Callable[[str, Any, Any, str | None], None] | None = None,
        max_delivery_count: int = 3,
    ) -> None:
        self.name = name
        self.handler = handler
        self.on_done = on_done
        self.max_delivery_count = max_delivery_count
        self.dead_letters: list[tuple[Any, str]] = []
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=f"sub-{name}", daemon=True)

    def start(self) -> Subscription:
        self._thread.start()
        return self

    def put(self, note: Any) -> None:
        self._queue.put(note)

    def stop(self, timeout: float = 10.0) -> None:
        self._queue.put(_STOP)
        self._thread.join(timeout=timeout)

    def _run(self) -> None:
        while (note := self._queue.get()) is not _STOP:
            result: Any = None
            error: str | None = None
            for _ in range(self.max_delivery_count):
                try:
                    result = self.handler(note)
                    error = None
                    break
                except Exception as exc:
                    error = f"{type(exc).__name__}: {exc}"
                    time.sleep(0.2)
            if error:
                self.dead_letters.append((note, error))
            if self.on_done is not None:
                self.on_done(self.name, note, result, error)


_STOP = object()


@dataclass(frozen=True)
class Delivery:
    """One notification handed to one channel, and what came of it."""

    channel: str
    message_id: str
    event_id: str | None
    transition: str
    posted: bool  # False: the channel does not send this transition (or it is off)
    error: str | None
    action: str | None = None  # PagerDuty: trigger / resolve
    at: float = field(default_factory=time.time)


@dataclass
class EventTrack:
    """One EventId as the simulator's documents showed it, fleet-wide."""

    event_id: str
    event_type: str
    source: str | None
    duration: int | None
    resources: tuple[str, ...]
    description: str | None
    first_seen: float  # seconds since the demo started
    first_seen_wall: datetime
    first_status: str
    not_before: datetime | None
    reported_by: set[str] = field(default_factory=set)
    started_at: float | None = None  # seconds
    started_wall: datetime | None = None
    removed_at: float | None = None
    step: Step | None = None

    @property
    def what(self) -> str:
        if self.event_type == "Freeze" and self.duration is not None and self.duration >= 0:
            return f"Freeze {self.duration} s"
        return self.event_type


class FleetWatcher:
    """Follows every VM's Scheduled Events document and the StartRequests IMDS received.

    It listens to the simulator itself (not through a relay), so what it prints is the
    ground truth the relays and functions are judged against, timed to the moment each
    document changed.
    """

    def __init__(
        self,
        sim: Any,
        timeline: Timeline,
        on_new: Callable[[EventTrack], None] | None = None,
    ) -> None:
        self.sim = sim
        self.timeline = timeline
        self.on_new = on_new
        self.events: dict[str, EventTrack] = {}
        self.approvals: list[Any] = []
        self._documents: dict[str, dict[str, Any]] = {}
        self._changes: queue.SimpleQueue[tuple[str, dict[str, Any]]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fleet-watcher", daemon=True)

    def start(self) -> FleetWatcher:
        for vm in self.sim.vm_names:
            self._documents[vm] = self.sim.document(vm)
        # Called under the simulator's lock: only queue, never block.
        self.sim.subscribe(lambda vm, _incarnation, doc: self._changes.put((vm, doc)))
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def active(self) -> list[EventTrack]:
        with self._lock:
            return [e for e in self.events.values() if e.removed_at is None]

    def snapshot(self) -> dict[str, EventTrack]:
        with self._lock:
            return dict(self.events)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                vm, document = self._changes.get(timeout=0.05)
            except queue.Empty:
                self._approvals()
                continue
            # One simulator tick changes several VMs' documents back to back: take them all
            # before comparing, so an event moving between VMs is not reported as removed.
            self._documents[vm] = document
            time.sleep(0.005)
            while True:
                try:
                    vm, document = self._changes.get_nowait()
                except queue.Empty:
                    break
                self._documents[vm] = document
            self._approvals()  # an approval is what made an event start: tell it first
            try:
                self._update()
            except Exception as exc:  # keep watching; a malformed document is itself news
                self.timeline.add("demo", "watcher", f"cannot read a document: {exc}", ok=False)

    def _approvals(self) -> None:
        known = len(self.approvals)
        fresh = self.sim.approvals[known:]
        for approval in fresh:
            self.approvals.append(approval)
            track = self.events.get(approval.event_id)
            when = ""
            if track is not None and track.not_before is not None:
                lead = (track.not_before - approval.at).total_seconds()
                when = f", {lead:.1f} s before NotBefore"
            counted = "" if approval.counted else " (not named in the event: does not count)"
            self.timeline.add(
                "approve",
                short_id(approval.event_id),
                f"IMDS received StartRequests from {approval.vm}{when}{counted}",
            )

    def _update(self) -> None:
        now, wall = self.timeline.seconds(), datetime.now(UTC)
        seen: dict[str, dict[str, Any]] = {}
        reporters: dict[str, set[str]] = {}
        for vm, raw in self._documents.items():
            for event in parse_document(raw).events:
                entry = next(e for e in raw["Events"] if e.get("EventId") == event.event_id)
                if event.event_id not in seen or event.is_started:
                    seen[event.event_id] = entry
                reporters.setdefault(event.event_id, set()).add(vm)
        for event_id, raw in seen.items():
            status = raw.get("EventStatus", "?")
            with self._lock:
                track = self.events.get(event_id)
                new = track is None
                if track is None:
                    track = EventTrack(
                        event_id=event_id,
                        event_type=raw.get("EventType", "?"),
                        source=raw.get("EventSource"),
                        duration=raw.get("DurationInSeconds"),
                        resources=tuple(raw.get("Resources") or ()),
                        description=raw.get("Description"),
                        first_seen=now,
                        first_seen_wall=wall,
                        first_status=status,
                        not_before=parse_not_before(raw.get("NotBefore")),
                    )
                    self.events[event_id] = track
                track.reported_by |= reporters[event_id]
                started_now = status == STARTED and track.started_at is None
                if started_now:
                    track.started_at, track.started_wall = now, wall
            if new:
                if self.on_new is not None:
                    self.on_new(track)
                self.timeline.add("imds", short_id(event_id), describe_new(track))
            elif started_now:
                self.timeline.add("imds", short_id(event_id), f"{track.what} is now Started")
        for track in self.active():
            if track.event_id not in seen:
                with self._lock:
                    track.removed_at = now
                ending = "it is over" if track.started_at is not None else "it never started"
                self.timeline.add(
                    "imds",
                    short_id(track.event_id),
                    f"{track.what} removed from the documents: {ending}",
                )


def describe_new(track: EventTrack) -> str:
    parts = [f"{track.what} ({track.source or 'unknown source'}) {track.first_status}"]
    parts.append(f"for {', '.join(track.resources) or 'no VM named'}")
    if track.not_before is not None:
        left = (track.not_before - track.first_seen_wall).total_seconds()
        parts.append(f"NotBefore in {left:.1f} s")
    others = sorted(track.reported_by - set(track.resources))
    if others:
        parts.append(f"also in the documents of {', '.join(others)}")
    return ", ".join(parts)


# --------------------------------------------------------------------------- the demo


class Demo:
    """Starts everything, plays the plan, checks the outcomes, stops everything."""

    def __init__(self, options: DemoOptions | None = None, timeline: Timeline | None = None):
        self.options = options or DemoOptions()
        self.timeline = timeline or Timeline()
        self.stack = Stack()
        self.missing: dict[str, str] = {}  # part -> why it is not running
        self.receivers: dict[str, Receiver] = {}
        self.external: dict[str, str] = {}  # channel -> where it posts instead
        self.sim: Any = None
        self.server: Any = None
        self.watcher: FleetWatcher | None = None
        self.step_events: dict[Step, str] = {}  # which EventId each step produced
        self.played: list[Step] = []
        self.workdir = Path(tempfile.mkdtemp(prefix="sebridge-demo-"))
        if not self.options.keep:
            self.stack.callback(_remove_tree, self.workdir)
        self._started = time.monotonic()
        self._pending_steps: list[Step] = []
        self._lock = threading.Lock()
        self.deliveries: list[Delivery] = []
        self.drain_results: list[Any] = []
        self.publisher: Any = None
        self.channels: list[str] = []
        self.subscriptions: list[Subscription] = []
        self.inbox: Path | None = None
        # The functions read POLICY__* from the process environment, so that is what counts.
        self.play_errors: list[Outcome] = []
        self.custom_policy = any(k.upper().startswith("POLICY__") for k in os.environ)
        self.hook_runs: list[tuple[float, str, str]] = []  # (time.time(), VM, EventId)

    # ------------------------------------------------------------------ start-up
    def start(self) -> Demo:
        o = self.options
        self.timeline.add(
            "demo",
            "demo",
            f"{len(o.fleet)} VMs, {len(o.plan)} scenarios at {o.time_scale:g}x "
            f"(15 min of notice takes {900 / o.time_scale:.0f} s)",
        )
        self._find_missing_parts()
        if self.custom_policy:
            self.timeline.add(
                "decide", "policy", "your POLICY__* settings decide; policy checks only inform"
            )
        self._start_receivers()
        self._start_simulator()
        if "local functions host" not in self.missing:
            self._start_host()
        if "relays" not in self.missing:
            self._start_relays()
        self.watcher = FleetWatcher(self.sim, self.timeline, on_new=self._attach_step).start()
        self.stack.callback(self.watcher.stop)
        return self

    def _find_missing_parts(self) -> None:
        """Say clearly which part of the pipeline is not there, instead of failing on it."""
        import importlib.util

        parts = {
            "relays": ("relay.__main__", "python -m relay is not available"),
            "local functions host": ("functions.local.host", "functions/local/host.py is missing"),
            "terminate workflow": ("functions.terminate", "functions/terminate.py is missing"),
        }
        for part, (module, why) in parts.items():
            try:
                found = importlib.util.find_spec(module) is not None
            except ImportError:
                found = False
            if not found:
                self.missing[part] = why
                self.timeline.add("demo", part, f"not running: {why}", ok=False)

    def _start_receivers(self) -> None:
        env = self.options.env
        wanted: list[tuple[str, Callable[[], Receiver], str | None]] = [
            ("teams", lambda: TeamsReceiver(on_receive=self._told), env.get("TEAMS_WEBHOOK_URL")),
            (
                "pagerduty",
                lambda: PagerDutyReceiver(on_receive=self._told),
                # A routing key alone means PagerDuty itself (PAGERDUTY_EVENTS_URL optional).
                (env.get("PAGERDUTY_EVENTS_URL") or PAGERDUTY_EVENTS_URL)
                if env.get("PAGERDUTY_ROUTING_KEY")
                else None,
            ),
            ("webhook", lambda: WebhookReceiver(on_receive=self._told), env.get("WEBHOOK_URL")),
        ]
        for channel, make, external in wanted:
            if external:
                self.external[channel] = external
                self.timeline.add("demo", channel, "posting to the URL from the environment")
                continue
            self.receivers[channel] = self.stack.enter(make())
        self.receivers["drain"] = self.stack.enter(DrainHookReceiver(on_receive=self._told))
        local = ", ".join(f"{name} {r.url}" for name, r in self.receivers.items())
        self.timeline.add("demo", "receivers", f"listening: {local}")

    def _start_simulator(self) -> None:
        from relay.simulator import Simulator, SimulatorServer

        self.sim = Simulator(time_scale=self.options.time_scale)
        scale_sets: dict[str, list[str]] = {}
        for vm in self.options.fleet:
            if vm.scale_set:
                scale_sets.setdefault(vm.scale_set, []).append(vm.name)
                continue
            self.sim.add_vm(vm.name, availability_set=vm.availability_set, spot=vm.spot)
        for name, members in scale_sets.items():
            # Instances are NAME_0..NAME_{n-1}, with terminate notifications on (notBeforeTimeout).
            added = self.sim.add_scale_set(
                name, len(members), terminate_timeout=self.options.terminate_timeout
            )
            if sorted(added) != sorted(members):
                raise ValueError(f"scale set {name}: instances must be named {added}")
        self.server = SimulatorServer(self.sim, host="127.0.0.1", port=0).start()
        self.stack.callback(self.server.stop)
        groups = ", ".join(f"{vm.name} ({vm.group})" for vm in self.options.fleet)
        self.timeline.add("demo", "simulator", f"IMDS simulator at {self.server.url}: {groups}")

    def _start_host(self) -> None:
        """Azurite, the local host over the shared inbox, channels and timeline subscribers."""
        from functions.local.azurite import Azurite
        from functions.local.host import LocalHost
        from functions.publish import LocalPublisher
        from functions.settings import load_settings
        from functions.state import Store

        azurite = self.stack.enter(Azurite())
        self.connection_string = azurite.connection_string
        self.timeline.add("demo", "azurite", f"Table storage on 127.0.0.1:{azurite.port}")
        self.relay_key = secrets.token_hex(24)
        self.key_file = self.workdir / "relay.key"
        self.key_file.write_text(self.relay_key)
        self.key_file.chmod(0o600)
        self.inbox = self.workdir / "inbox"
        self.settings = load_settings(
            state_storage=azurite.connection_string,
            relay_key=self.relay_key,
            # Real-world margins, scaled like the simulator's clock.
            approval_margin_seconds=max(0, round(10 / self.options.time_scale)),
            approval_budget_seconds=max(1, round(60 / self.options.time_scale)),
        )
        if self.settings.policy.error:
            self.timeline.add("decide", "policy", f"INVALID: {self.settings.policy.error}", False)
        self.store = Store.from_settings(self.settings).ensure_tables()
        self.publisher = LocalPublisher()
        # The timeline first (it notes what is announced), then one subscription per channel.
        self.publisher.subscribe("timeline", self._announced)
        self._subscribe_channels()
        if "terminate workflow" not in self.missing:
            self._start_terminate()
        self.host = LocalHost(
            self.inbox, self.settings, self.store, self.publisher, watchdog_interval_seconds=5
        )
        stop = threading.Event()
        thread = threading.Thread(
            target=self.host.run_forever,
            args=(stop,),
            kwargs={"poll_seconds": 0.05},
            name="local-functions-host",
            daemon=True,
        )
        thread.start()

        def stop_host() -> None:
            stop.set()
            thread.join(timeout=10)

        self.stack.callback(stop_host)
        self.timeline.add("demo", "functions", f"local host reading {self.inbox}")

    def _subscribe_channels(self) -> None:
        """Each channel is its own subscription, as on the topic; every delivery is recorded."""
        from functions.notify.delivery import RetryPolicy, Transport
        from functions.notify.dispatch import CHANNELS, deliver
        from functions.notify.settings import ChannelSettings

        env = self.options.env
        local: dict[str, Any] = {}
        # Real endpoints from the environment, passed explicitly (the demo may run with an
        # environment of its own, as the end-to-end tests do).
        if "teams" in self.external:
            local["teams_webhook_url"] = env["TEAMS_WEBHOOK_URL"]
        if "pagerduty" in self.external:
            local["pagerduty_routing_key"] = env["PAGERDUTY_ROUTING_KEY"]
            local["pagerduty_events_url"] = self.external["pagerduty"]
        if "webhook" in self.external:
            local["webhook_url"] = env["WEBHOOK_URL"]
            local["webhook_secret"] = env.get("WEBHOOK_SECRET", "")
        if "teams" in self.receivers:
            local["teams_webhook_url"] = self.receivers["teams"].url
        if "pagerduty" in self.receivers:
            local["pagerduty_routing_key"] = LOCAL_ROUTING_KEY
            local["pagerduty_events_url"] = self.receivers["pagerduty"].url
        if "webhook" in self.receivers:
            secret = secrets.token_hex(16)
            local["webhook_url"] = self.receivers["webhook"].url
            local["webhook_secret"] = secret
            receiver = self.receivers["webhook"]
            assert isinstance(receiver, WebhookReceiver)
            receiver.verify = webhook_verifier(secret.encode())
        channel_settings = ChannelSettings(**local)
        session = requests.Session()
        self.stack.callback(session.close)
        # Short waits: at 60x a real retry schedule would outlast the event.
        transport = Transport(session=session, policy=_short_retries(RetryPolicy))
        for channel in CHANNELS:
            off = channel_settings.off_reason(channel)
            if off:
                self.timeline.add("demo", channel, f"channel off: {off}")
                continue

            def handler(note: Any, channel: str = channel) -> bool:
                return deliver(
                    channel, note.to_json(), settings=channel_settings, transport=transport
                )

            subscription = Subscription(channel, handler, on_done=self._channel_done).start()
            self.subscriptions.append(subscription)
            self.stack.callback(subscription.stop)
            self.channels.append(channel)
            self.publisher.subscribe(channel, subscription.put)

    def _record_delivery(self, channel: str, note: Any, posted: bool, error: str | None) -> None:
        with self._lock:
            self.deliveries.append(
                Delivery(
                    channel=channel,
                    message_id=note.message_id(),
                    event_id=note.event.event_id if note.event else None,
                    transition=note.transition.value,
                    posted=posted,
                    error=error,
                    action=_pagerduty_action(channel, note) if posted else None,
                )
            )

    def _start_terminate(self) -> None:
        """The `terminate` subscription: drain, then approve, on its own worker.

        In Azure it is its own function, so a drain that takes seconds never holds up
        ingest; the worker thread keeps that true here.
        """
        from functions.approve import approve_event
        from functions.clock import SystemClock
        from functions.terminate import DrainContext, DrainSettings, run_drain, wants
        from functions.terminate_store import DrainStore

        scale = self.options.time_scale
        self.drain_settings = DrainSettings(
            http_url=self.receivers["drain"].url,
            relay_hook="drain",
            # The real-world defaults, scaled like the simulator's clock.
            step_timeout_seconds=max(1.0, 120 / scale),
            safety_margin_seconds=30 / scale,
            approve_reserve_seconds=max(0.5, 10 / scale),
            poll_seconds=0.1,
        )
        drains = DrainStore.from_connection_string(
            self.connection_string, self.settings.state_table_prefix
        ).ensure_table()
        session = requests.Session()
        self.stack.callback(session.close)
        clock = SystemClock()

        def callback_url(vm: str) -> str | None:
            record = self.store.get_vm(vm)
            return record.callback_url if record else None

        def approve(event_id: str, until: datetime) -> Any:
            return approve_event(
                event_id,
                self.store,
                self.settings,
                session,
                clock,
                publisher=self.publisher,
                give_up_at=until,
                by="terminate",
            )

        ctx = DrainContext(
            store=drains,
            session=session,
            publish=self.publisher.publish,
            approve=approve,
            callback_url=callback_url,
            relay_key=self.relay_key.encode(),
        )
        work: queue.SimpleQueue[Any] = queue.SimpleQueue()

        def worker() -> None:
            while True:
                note = work.get()
                if note is None:
                    return
                try:
                    result = run_drain(note, self.drain_settings, ctx)
                except Exception as exc:
                    self.timeline.add("drain", "terminate", f"workflow failed: {exc}", ok=False)
                    continue
                self.drain_results.append(result)

        thread = threading.Thread(target=worker, name="terminate-workflow", daemon=True)
        thread.start()

        def stop() -> None:
            work.put(None)
            thread.join(timeout=10)

        self.stack.callback(stop)
        self.publisher.subscribe("terminate", lambda note: work.put(note) if wants(note) else None)

    def _start_relays(self) -> None:
        """One real relay process per VM, forwarding into the shared inbox."""
        hook = self.workdir / "drain-hook.sh"
        self.hook_log = self.workdir / "drain-hook.log"
        hook.write_text(
            "#!/bin/sh\n"
            "# The demo's drain step on the VM: what a real one would do is stop taking new\n"
            "# work and finish what is in flight. The relay runs only scripts from its config.\n"
            f"log='{self.hook_log}'\n"
            'echo "$(date +%s.%N) $SCHEDULED_EVENT_VM_NAME $SCHEDULED_EVENT_ID" >> "$log"\n'
            'echo "drained $SCHEDULED_EVENT_VM_NAME for $SCHEDULED_EVENT_ID"\n'
        )
        hook.chmod(0o755)
        self.relays: dict[str, subprocess.Popen[bytes]] = {}
        self.callback_urls: dict[str, str] = {}
        for vm in self.options.fleet:
            port = free_port()
            url = f"http://127.0.0.1:{port}"
            argv = [
                sys.executable,
                "-m",
                "relay",
                "--imds-url",
                self.server.vm_url(vm.name),
                "--vm-name",
                vm.name,
                "--forward",
                f"file:{self.inbox}",
                "--state-dir",
                str(self.workdir / "relays" / vm.name),
                "--poll-interval",
                str(self.options.poll_interval),
                "--callback-listen",
                f"127.0.0.1:{port}",
                "--callback-key-file",
                str(self.key_file),
                "--callback-url",
                url,
                "--log-format",
                "text",
                "--hook",
                f"drain={hook}",
                "--hook-timeout",
                "5",
            ]
            if vm.availability_set:
                argv += ["--availability-set", vm.availability_set]
            log = self.workdir / "logs" / f"relay-{vm.name}.log"
            self.relays[vm.name] = self.stack.process(argv, log, env=self._child_env())
            self.callback_urls[vm.name] = url
        for vm, url in self.callback_urls.items():
            self._wait_healthy(vm, url)
        self.timeline.add(
            "demo",
            "relays",
            f"{len(self.relays)} relays polling every "
            f"{self.options.poll_interval:g} s, forwarding to {self.inbox}",
        )

    def _child_env(self) -> dict[str, str]:
        env = {k: v for k, v in self.options.env.items() if not k.startswith("RELAY_")}
        env["PYTHONUNBUFFERED"] = "1"
        return env

    def _wait_healthy(self, vm: str, url: str, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        proc = self.relays[vm]
        while time.monotonic() < deadline:
            self.check_deadline()
            if proc.poll() is not None:
                log = (self.workdir / "logs" / f"relay-{vm}.log").read_text(errors="replace")
                raise DemoAborted(f"relay of {vm} exited ({proc.returncode}): {log[-400:]}")
            with contextlib.suppress(requests.RequestException):
                if requests.get(f"{url}/v1/health", timeout=1).status_code < 500:
                    return
            time.sleep(0.1)
        raise DemoAborted(f"relay of {vm} did not answer on {url}/v1/health in {timeout:.0f} s")

    # ------------------------------------------------------------------ playing
    def play(self) -> None:
        """Play each step at its time; return once the fleet is quiet again."""
        o = self.options
        pending = sorted(o.plan, key=lambda s: s.at)
        began = time.monotonic()
        quiet_since: float | None = None
        while True:
            self.check_deadline()
            elapsed = time.monotonic() - began
            while pending and pending[0].at <= elapsed:
                step = pending.pop(0)
                self._play_step(step)
            self._hook_script_runs()
            if pending:
                quiet_since = None
            elif self.watcher is not None and not self.watcher.active() and self._all_seen():
                quiet_since = quiet_since or time.monotonic()
                if time.monotonic() - quiet_since >= o.settle:
                    return
            else:
                quiet_since = None
            time.sleep(0.1)

    def _hook_script_runs(self) -> None:
        """The drain script writes one line per run; show each run as it happens."""
        hook_log = getattr(self, "hook_log", None)
        if hook_log is None or not hook_log.exists():
            return
        lines = hook_log.read_text().splitlines()
        for line in lines[len(self.hook_runs) :]:
            stamp, vm, event_id = [*line.split(), "0", "?", "?"][:3]
            self.hook_runs.append((float(stamp), vm, event_id))
            self.timeline.add(
                "drain", short_id(event_id), f"relay of {vm} ran its hook script 'drain'"
            )

    def _all_seen(self) -> bool:
        return all(step in self.step_events for step in self.played)

    def _play_step(self, step: Step) -> None:
        self.timeline.add("demo", step.scenario, f"playing on {step.target}: {step.story}")
        from relay.simulator import SimulatorError

        try:
            result = self.sim.play(step.scenario, target=step.target)
        except SimulatorError as exc:
            self.timeline.add("demo", step.scenario, f"cannot play: {exc}", ok=False)
            self.play_errors.append(Outcome(f"{step.scenario} on {step.target}", False, str(exc)))
            return
        self._pending_steps.append(step)
        self.played.append(step)
        event_id = _event_id(result)
        if event_id:
            self.step_events[step] = event_id

    def _attach_step(self, track: EventTrack) -> None:
        for step, event_id in self.step_events.items():
            if event_id == track.event_id:
                track.step = step
                return
        # The simulator did not return the id: the first new event after a step is its own.
        if self._pending_steps:
            step = self._pending_steps.pop(0)
            self.step_events.setdefault(step, track.event_id)
            track.step = step

    def check_deadline(self) -> None:
        if time.monotonic() - self._started > self.options.time_limit:
            raise DemoAborted(f"the hard time limit of {self.options.time_limit:.0f} s passed")

    # ------------------------------------------------------------------ observing
    def _told(self, record: Received) -> None:
        """Receivers speak up only for what the timeline would not show otherwise."""
        if record.channel == "drain":
            body = record.body if isinstance(record.body, dict) else {}
            vms = ", ".join(body.get("Resources") or []) or "?"
            self.timeline.add("drain", "drain-hook", f"customer's HTTP drain hook called for {vms}")
            return
        if not record.accepted:
            detail = "; ".join(record.problems) or "injected failure"
            self.timeline.add(
                "notify", record.channel, f"answered {record.status}: {detail}", ok=False
            )

    def _announced(self, note: Any) -> None:
        """The timeline's subscription: what was announced and whom it is going to.

        Printed at once, so the story keeps its causal order; the channels deliver on their
        own workers and only a failed delivery adds a line of its own.
        """
        from functions.notify.describe import headline

        event = note.event
        subject = short_id(event.event_id) if event else (note.vm or "fleet")
        transition = note.transition.value
        decision = note.decision
        if transition == "decided" and decision is not None:
            kind = "decide"
            text = f"decided {decision.action.upper()} by rule {decision.rule}"
            generic = f"rule '{decision.rule}': {decision.action}"
            if decision.reason and decision.reason != generic:
                text += f": {decision.reason}"
            if decision.dry_run:
                text += " [dry run]"
            if decision.policy_error:
                text += f" [policy invalid: {decision.policy_error}]"
        elif transition in ("approved", "approval_failed"):
            kind, text = "relay", headline(note)
        elif transition.startswith("drain"):
            kind, text = "drain", headline(note)
        else:
            kind, text = "decide", f"announced: {headline(note)}"
        if note.detail and transition != "decided":
            text += f" ({note.detail})"
        going = [name for channel in self.channels if (name := _routed(channel, note))]
        text += f" → {', '.join(going)}" if going else " → no channel sends this"
        self.timeline.add(kind, subject, text)

    def _channel_done(self, channel: str, note: Any, posted: Any, error: str | None) -> None:
        """Called by each channel's subscription when it is done with a notification."""
        self._record_delivery(channel, note, bool(posted) and error is None, error)
        if error:
            subject = short_id(note.event.event_id) if note.event else (note.vm or "fleet")
            self.timeline.add(
                "notify",
                subject,
                f"{channel} did not take '{note.transition.value}': {error}",
                ok=False,
            )

    # ------------------------------------------------------------------ outcomes
    def outcomes(self) -> list[Outcome]:
        """What the demo promised, checked against what each part actually observed."""
        results: list[Outcome] = list(self.play_errors)
        events = self.watcher.snapshot() if self.watcher else {}
        for step in self.played:
            event_id = self.step_events.get(step)
            track = events.get(event_id) if event_id else None
            name = f"{step.scenario} on {step.target}"
            if track is None:
                results.append(Outcome(f"{name}: IMDS showed the event", False, "never seen"))
                continue
            results.extend(self._imds_outcomes(name, step, track))
            if self.publisher is not None:
                pipeline = self._pipeline_outcomes(name, step, track)
                if self.custom_policy:
                    # Your policy decides these: show what it did, do not judge it.
                    pipeline = [
                        o
                        if "announced" in o.name and "'approved'" not in o.name
                        else Outcome(f"{o.name} [default policy]", o.ok, o.detail, skipped=True)
                        for o in pipeline
                    ]
                results.extend(pipeline)
        if self.publisher is not None:
            results.extend(self._fleet_outcomes())
        for part, why in self.missing.items():
            results.append(Outcome(f"{part} running", False, why, skipped=True))
        return results

    def _imds_outcomes(self, name: str, step: Step, track: EventTrack) -> list[Outcome]:
        if step.scenario == "hardware-failure":
            ok = track.first_status == STARTED
            return [Outcome(f"{name}: appeared already Started", ok, track.first_status)]
        if step.scenario == "cancelled":
            ok = track.started_at is None and track.removed_at is not None
            return [Outcome(f"{name}: withdrawn by Azure without starting", ok)]
        ok = track.removed_at is not None and track.started_at is not None
        return [Outcome(f"{name}: went Scheduled → Started → removed", ok)]

    def _pipeline_outcomes(self, name: str, step: Step, track: EventTrack) -> list[Outcome]:
        event_id = track.event_id
        notes = [n for n in self.publisher.published if n.event and n.event.event_id == event_id]
        transitions = [n.transition.value for n in notes]
        decision = next((n.decision for n in notes if n.transition.value == "decided"), None)
        approvals = [
            a for a in (self.watcher.approvals if self.watcher else []) if a.event_id == event_id
        ]
        first_approval = approvals[0] if approvals else None
        out: list[Outcome] = []

        def expect_action(action: str) -> None:
            got = f"{decision.action} by rule {decision.rule}" if decision else "no decision"
            ok = decision is not None and decision.action == action
            out.append(Outcome(f"{name}: decided {action}", ok, got))

        def expect_approved_in_time() -> None:
            if first_approval is None:
                out.append(Outcome(f"{name}: approved before NotBefore", False, "no StartRequests"))
                return
            lead = (
                (track.not_before - first_approval.at).total_seconds() if track.not_before else None
            )
            ok = lead is not None and lead > 0 and first_approval.counted
            detail = f"StartRequests from {first_approval.vm}"
            if lead is not None:
                detail += f", {lead:.1f} s before NotBefore"
            out.append(Outcome(f"{name}: approved before NotBefore", ok, detail))

        def expect_no_approval() -> None:
            detail = ", ".join(f"{a.vm} at {a.at:%H:%M:%S}" for a in approvals) or "none"
            out.append(Outcome(f"{name}: never approved", not approvals, detail))

        def expect_announced(transition: str) -> None:
            count = transitions.count(transition)
            out.append(
                Outcome(f"{name}: '{transition}' announced once", count == 1, f"{count} time(s)")
            )

        scenario = step.scenario
        if scenario in ("live-migration", "user-reboot"):
            expect_action("approve")
            expect_approved_in_time()
            expect_announced("approved")
        elif scenario == "platform-reboot":
            expect_action("hold")
            expect_no_approval()
            at_not_before = (
                track.started_wall is not None
                and track.not_before is not None
                and track.started_wall >= track.not_before - timedelta(seconds=0.5)
            )
            out.append(Outcome(f"{name}: started at NotBefore, not earlier", at_not_before))
            out.append(self._announced_once(name, track))
        elif scenario == "preempt":
            out.append(self._paged(name, event_id))
        elif scenario == "terminate" and "terminate workflow" in self.missing:
            expect_action("drain")
            why = self.missing["terminate workflow"]
            out.append(Outcome(f"{name}: drained, then approved", False, why, skipped=True))
        elif scenario == "terminate":
            expect_action("drain")
            out.append(self._drained_before_approval(name, event_id, first_approval))
            expect_approved_in_time()
        elif scenario == "cancelled":
            expect_no_approval()
            expect_announced("cancelled")
        elif scenario == "hardware-failure":
            expect_no_approval()
            expect_announced("started")
        return out

    def _announced_once(self, name: str, track: EventTrack) -> Outcome:
        """N VMs reported it; Teams got one decision card, and each transition at most once."""
        label = f"{name}: reported by {len(track.reported_by)} VMs, announced once"
        with self._lock:
            teams = [
                d
                for d in self.deliveries
                if d.channel == "teams" and d.event_id == track.event_id and d.posted
            ]
        cards = [d for d in teams if d.transition == "decided"]
        detail = f"{len(cards)} decision card(s), {len(teams)} Teams post(s) in all"
        ok = len(cards) == 1 and len(track.reported_by) >= 2
        ok = ok and len({d.message_id for d in teams}) == len(teams)
        receiver = self.receivers.get("teams")
        if receiver is not None:
            arrived = [r for r in receiver.accepted() if track.event_id.encode() in r.raw]
            detail += f"; the Teams receiver got {len(arrived)}"
            ok = ok and len(arrived) == len(teams)
        elif "teams" not in self.external:
            return Outcome(label, False, "Teams is off", skipped=True)
        return Outcome(label, ok, detail)

    def _paged(self, name: str, event_id: str) -> Outcome:
        label = f"{name}: paged on-call once (PagerDuty trigger, dedup_key = EventId)"
        receiver = self.receivers.get("pagerduty")
        if receiver is not None:
            triggers = [
                r
                for r in receiver.accepted()
                if isinstance(r.body, dict)
                and r.body.get("event_action") == "trigger"
                and r.body.get("dedup_key") == event_id
            ]
            return Outcome(label, len(triggers) == 1, f"{len(triggers)} trigger(s) received")
        with self._lock:
            sent = [
                d
                for d in self.deliveries
                if d.channel == "pagerduty" and d.event_id == event_id and d.action == "trigger"
            ]
        ok = len(sent) == 1 and sent[0].posted
        return Outcome(label, ok, f"{len(sent)} trigger(s) sent to {self.external['pagerduty']}")

    def _drained_before_approval(self, name: str, event_id: str, approval: Any) -> Outcome:
        label = f"{name}: drained (HTTP hook and relay hook script) before approval"
        http = [
            r
            for r in self.receivers["drain"].accepted()
            if isinstance(r.body, dict) and r.body.get("EventId") == event_id
        ]
        self._hook_script_runs()
        script = [at for at, _vm, logged in self.hook_runs if logged == event_id]
        if not http or not script:
            return Outcome(label, False, f"HTTP hook calls {len(http)}, script runs {len(script)}")
        if approval is None:
            return Outcome(label, False, "drained, but never approved")
        drained_at = max(http[0].at, script[0])
        lead = approval.at.timestamp() - drained_at
        detail = f"script ran once, approval {lead:.2f} s after the drain finished"
        return Outcome(label, lead >= 0 and len(script) == 1, detail)

    def _fleet_outcomes(self) -> list[Outcome]:
        out = []
        with self._lock:
            errors = [d for d in self.deliveries if d.error]
        # A payload the service would refuse (not an injected outage) is a failure.
        rejected = [r for rec in self.receivers.values() for r in rec.received if r.problems]
        detail = "; ".join(
            [f"{d.channel} {d.message_id}: {d.error}" for d in errors[:3]]
            + [f"{r.channel} answered {r.status}: {'; '.join(r.problems)}" for r in rejected[:3]]
        )
        dead = len(self.publisher.dead_letters) + sum(
            len(sub.dead_letters) for sub in self.subscriptions
        )
        out.append(
            Outcome(
                "every notification was accepted by its channel",
                not errors and not rejected and not dead,
                detail or f"{len(self.deliveries)} deliveries",
            )
        )
        dead_letters = list((self.inbox / "deadletter").glob("*.json")) if self.inbox else []
        out.append(
            Outcome(
                "every forwarded document was processed",
                not dead_letters,
                f"{len(list((self.inbox / 'processed').glob('*.json')))} processed, "
                f"{len(dead_letters)} dead-lettered",
            )
        )
        relays = getattr(self, "relays", {})
        exited = [vm for vm, proc in relays.items() if proc.poll() is not None]
        out.append(
            Outcome(
                f"all {len(relays)} relays kept running",
                bool(relays) and not exited,
                f"exited: {', '.join(exited)}" if exited else "",
            )
        )
        return out

    # ------------------------------------------------------------------ shutting down
    def close(self) -> None:
        self.stack.close()

    def __enter__(self) -> Demo:
        try:
            return self.start()
        except BaseException:
            self.close()
            raise

    def __exit__(self, *exc: object) -> None:
        self.close()

    def facts(self) -> dict[str, str]:
        facts = {
            "fleet": ", ".join(f"{vm.name} ({vm.group})" for vm in self.options.fleet),
            "time scale": f"{self.options.time_scale:g}x",
        }
        for channel, url in self.external.items():
            facts[channel] = f"real endpoint {url.split('?')[0]}"
        for part, why in self.missing.items():
            facts[f"missing: {part}"] = why
        return facts


def check_plan(plan: tuple[Step, ...], fleet: tuple[VmSpec, ...]) -> str | None:
    """A plan that cannot play says so before anything starts."""
    from relay.simulator import SCENARIOS

    targets = {vm.name for vm in fleet}
    targets |= {s for vm in fleet for s in (vm.availability_set, vm.scale_set) if s}
    for step in plan:
        if step.scenario not in SCENARIOS:
            return f"unknown scenario {step.scenario!r}; known: {', '.join(SCENARIOS)}"
        if step.target not in targets:
            return f"unknown target {step.target!r}; the fleet has {', '.join(sorted(targets))}"
    return None


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def webhook_verifier(secret: bytes) -> Callable[[dict[str, str], bytes], str | None]:
    """Check the bridge's webhook signature the way a customer's receiver would."""
    from relay.signing import signature

    def verify(headers: dict[str, str], raw: bytes) -> str | None:
        lowered = {k.lower(): v for k, v in headers.items()}
        stamp = lowered.get("x-bridge-timestamp", "")
        given = lowered.get("x-bridge-signature", "")
        if not stamp.isdigit() or not given:
            return "missing X-Bridge-Timestamp / X-Bridge-Signature"
        if abs(time.time() - int(stamp)) > 300:
            return "stale timestamp"
        expected = signature(secret, stamp, "POST", WebhookReceiver.path, raw)
        return None if hmac.compare_digest(expected, given) else "bad signature"

    return verify


def _short_retries(policy_type: Any) -> Any:
    """The channels' retry policy with waits fit for a 60x demo (same attempts, short waits)."""
    return policy_type(
        backoff_seconds=0.2, max_wait_seconds=1.0, connect_timeout=2.0, read_timeout=5.0
    )


def _routed(channel: str, note: Any) -> str | None:
    """Whether a channel sends this notification, as the channel code itself decides it."""
    from functions.notify import pagerduty, teams

    decision = note.decision
    if decision is not None and channel not in decision.channels:
        return None
    if channel == "teams":
        return "Teams card" if teams.wants(note) else None
    if channel == "pagerduty":
        action = pagerduty.action_for(note)
        return f"PagerDuty {action}" if action else None
    return channel


def _pagerduty_action(channel: str, note: Any) -> str | None:
    if channel != "pagerduty":
        return None
    from functions.notify.pagerduty import action_for

    return action_for(note)


def _event_id(result: Any) -> str | None:
    if isinstance(result, str):
        return result
    for attr in ("event_id", "EventId", "id"):
        value = getattr(result, attr, None)
        if isinstance(value, str):
            return value
    if isinstance(result, dict):
        return result.get("EventId") or result.get("event_id")
    if isinstance(result, list | tuple) and result:
        return _event_id(result[0])
    return None


def _remove_tree(path: Path) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)


# --------------------------------------------------------------------------- CLI


@contextlib.contextmanager
def _signals_stop_the_demo() -> Iterator[None]:
    """SIGTERM and SIGINT (Ctrl-C) unwind the demo, stopping everything in order."""

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    previous = {sig: signal.signal(sig, interrupt) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def run(options: DemoOptions, timeline: Timeline | None = None) -> int:
    timeline = timeline or Timeline()
    demo = Demo(options, timeline)
    # The backstop: if stopping itself hangs, kill the children and leave.
    backstop = threading.Timer(options.time_limit + 20, _hard_exit, args=(demo,))
    backstop.daemon = True
    backstop.start()
    outcomes: list[Outcome] = []
    aborted: str | None = None
    try:
        with _signals_stop_the_demo():
            try:
                demo.start()
                demo.play()
                outcomes = demo.outcomes()
            except KeyboardInterrupt:
                aborted = "interrupted"
            except DemoAborted as exc:
                aborted = str(exc)
            finally:
                try:
                    timeline.add("demo", "demo", "stopping everything it started")
                finally:
                    _stop_patiently(demo)
    finally:
        backstop.cancel()
    if aborted:
        timeline.add("demo", "demo", f"stopped early: {aborted}", ok=False)
        outcomes = outcomes or [Outcome("the demo ran to the end", False, aborted)]
    print("\nSummary")
    for line in summary_lines(outcomes):
        print(line)
    if options.report is not None:
        path = write_html(
            options.report,
            "Scheduled Events bridge: demo report",
            timeline.snapshot(),
            outcomes,
            demo.facts(),
        )
        print(f"  report: {path}")
    if options.keep:
        print(f"  working directory (relay logs, inbox): {demo.workdir}")
    failed = [o for o in outcomes if not o.ok and not o.skipped]
    if aborted == "interrupted":
        return 130
    return 1 if failed or aborted else 0


def _stop_patiently(demo: Demo, limit: float = 30.0) -> None:
    """Stop in order; a second Ctrl-C must not leave relays behind half-stopped."""

    def wait(signum: int, frame: object) -> None:
        print("demo: still stopping what it started, a moment", file=sys.stderr, flush=True)

    previous = {sig: signal.signal(sig, wait) for sig in (signal.SIGINT, signal.SIGTERM)}
    backstop = threading.Timer(limit, _hard_exit, args=(demo,))
    backstop.daemon = True
    backstop.start()
    try:
        demo.close()
    finally:
        backstop.cancel()
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _hard_exit(demo: Demo) -> None:
    print("demo: stopping took too long; killing what is left", file=sys.stderr, flush=True)
    demo.stack.kill_all()
    os._exit(3)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m functions.local.demo",
        description="Play real maintenance through the whole bridge on this machine.",
    )
    parser.add_argument("--time-scale", type=float, default=60.0, help="60: 15 min in 15 s")
    parser.add_argument("--time-limit", type=float, default=170.0, help="hard stop, seconds")
    parser.add_argument("--report", type=Path, default=DEFAULT_REPORT, help="HTML report path")
    parser.add_argument("--no-report", action="store_true")
    parser.add_argument(
        "--plan",
        type=Path,
        help='JSON list of steps to play instead of the built-in plan: [{"at": 0, '
        '"scenario": "platform-reboot", "target": "web-as"}, ...] (fleet: '
        + ", ".join(vm.name for vm in FLEET)
        + "; sets web-as, workers)",
    )
    parser.add_argument(
        "--keep",
        action="store_true",
        help="keep the working directory (relay logs, inbox, processed messages) and say where",
    )
    args = parser.parse_args(argv)
    plan = PLAN
    if args.plan is not None:
        try:
            plan = tuple(TypeAdapter(list[Step]).validate_json(args.plan.read_bytes()))
        except (OSError, ValidationError) as exc:
            parser.error(f"--plan {args.plan}: {exc}")
        problem = check_plan(plan, FLEET)
        if problem:
            parser.error(f"--plan {args.plan}: {problem}")
    options = DemoOptions(
        plan=plan,
        time_scale=args.time_scale,
        time_limit=args.time_limit,
        report=None if args.no_report else args.report,
        keep=args.keep,
    )
    try:
        return run(options)
    except BrokenPipeError:  # the reader went away after everything was stopped
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


if __name__ == "__main__":
    sys.exit(main())
