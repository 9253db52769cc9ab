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
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import requests

from functions.local.receivers import (
    DrainHookReceiver,
    PagerDutyReceiver,
    Received,
    Receiver,
    TeamsReceiver,
    WebhookReceiver,
)
from functions.local.report import Outcome, Timeline, short_id, summary_lines, write_html
from relay.models import STARTED, parse_document, parse_not_before

ROOT = Path(__file__).resolve().parents[2]
API_VERSION = "2020-07-01"
DEFAULT_REPORT = ROOT / "out" / "demo-report.html"
# A PagerDuty routing key has 32 characters; this one only ever reaches the local receiver.
LOCAL_ROUTING_KEY = "demo" + "0" * 28


# --------------------------------------------------------------------------- the fleet


@dataclass(frozen=True)
class VmSpec:
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


@dataclass(frozen=True)
class Step:
    """One scenario played at `at` seconds (real, already scaled) after the demo starts."""

    at: float
    scenario: str
    target: str  # a VM name, or an availability set name for set-wide events
    story: str  # what the audience should expect, in words


FLEET: tuple[VmSpec, ...] = (
    VmSpec("web-1", availability_set="web-as"),
    VmSpec("web-2", availability_set="web-as"),
    VmSpec("workers_0", scale_set="workers"),
    VmSpec("workers_1", scale_set="workers"),
    VmSpec("spot-1", spot=True),
)

PLAN: tuple[Step, ...] = (
    Step(0.0, "live-migration", "web-1", "live-migration Freeze 5 s: approved at once"),
    Step(1.0, "user-reboot", "spot-1", "user-initiated reboot: approved at once"),
    Step(2.0, "platform-reboot", "web-as", "platform reboot of the set: held, announced once"),
    Step(3.0, "terminate", "workers_0", "scale-in: drained first, then approved"),
    Step(4.0, "cancelled", "workers_1", "maintenance that Azure withdraws: cancelled"),
    Step(12.0, "preempt", "spot-1", "Spot eviction with 30 s notice: paged"),
    Step(14.0, "hardware-failure", "workers_1", "host failure: appears already Started"),
)


# --------------------------------------------------------------------------- options


@dataclass
class DemoOptions:
    time_scale: float = 60.0
    time_limit: float = 170.0  # the hard limit: everything is stopped by then
    settle: float = 3.0  # quiet seconds after the last event went away
    report: Path | None = DEFAULT_REPORT
    fleet: tuple[VmSpec, ...] = FLEET
    plan: tuple[Step, ...] = PLAN
    terminate_timeout: float = 600.0  # the scale set's notBeforeTimeout (PT10M)
    poll_interval: float = 0.25  # the relays' IMDS polling: 1 s in Azure, faster at 60x
    verbose: bool = False
    env: dict[str, str] = field(default_factory=lambda: dict(os.environ))


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
    """Polls every VM's Scheduled Events document and reports each event's changes once.

    It reads IMDS exactly as a relay does (HTTP, `Metadata: true`), so what it prints is
    what the VMs see, and it is independent of the relays it is checking.
    """

    def __init__(
        self,
        urls: dict[str, str],
        timeline: Timeline,
        interval: float = 0.1,
        on_new: Callable[[EventTrack], None] | None = None,
    ) -> None:
        self.urls = urls
        self.timeline = timeline
        self.interval = interval
        self.on_new = on_new
        self.events: dict[str, EventTrack] = {}
        self.incarnations: dict[str, int] = {}
        self.errors = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fleet-watcher", daemon=True)
        self._session = requests.Session()

    def start(self) -> FleetWatcher:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._session.close()

    def active(self) -> list[EventTrack]:
        with self._lock:
            return [e for e in self.events.values() if e.removed_at is None]

    def snapshot(self) -> dict[str, EventTrack]:
        with self._lock:
            return dict(self.events)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.poll_once()
            except Exception as exc:  # keep watching; say why once per streak
                self.errors += 1
                if self.errors == 1:
                    self.timeline.add("demo", "watcher", f"cannot read IMDS: {exc}", ok=False)
            else:
                self.errors = 0
            self._stop.wait(self.interval)

    def poll_once(self) -> None:
        seen: dict[str, dict[str, Any]] = {}
        reporters: dict[str, set[str]] = {}
        for vm, url in self.urls.items():
            response = self._session.get(
                scheduled_events_url(url),
                headers={"Metadata": "true"},
                timeout=5,
            )
            response.raise_for_status()
            raw = response.json()
            document = parse_document(raw)
            self.incarnations[vm] = document.document_incarnation
            for raw_event, event in zip(raw.get("Events", []), document.events, strict=True):
                seen.setdefault(event.event_id, raw_event)
                reporters.setdefault(event.event_id, set()).add(vm)
                if event.is_started:
                    seen[event.event_id] = raw_event  # Started wins over a stale Scheduled
        self._update(seen, reporters)

    def _update(self, seen: dict[str, dict[str, Any]], reporters: dict[str, set[str]]) -> None:
        now = self.timeline.seconds()
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
                        first_status=status,
                        not_before=parse_not_before(raw.get("NotBefore")),
                    )
                    self.events[event_id] = track
                track.reported_by |= reporters[event_id]
                started_now = status == STARTED and track.started_at is None
                if started_now:
                    track.started_at = now
                    track.started_wall = datetime.now(UTC)
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


def scheduled_events_url(base: str) -> str:
    if "/metadata/scheduledevents" in base:
        return base if "api-version" in base else f"{base}?api-version={API_VERSION}"
    return f"{base.rstrip('/')}/metadata/scheduledevents?api-version={API_VERSION}"


def describe_new(track: EventTrack) -> str:
    parts = [f"{track.what} ({track.source or 'unknown source'}) {track.first_status}"]
    parts.append(f"for {', '.join(track.resources) or 'no VM named'}")
    if track.not_before is not None:
        left = (track.not_before - datetime.now(UTC)).total_seconds()
        parts.append(f"NotBefore in {left:.0f} s")
    others = sorted(track.reported_by - {r for r in track.resources})
    if others:
        parts.append(f"also seen by {', '.join(others)}")
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
        self.stack.callback(_remove_tree, self.workdir)
        self._started = time.monotonic()
        self._pending_steps: list[Step] = []

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
        self._start_receivers()
        self._start_simulator()
        self.watcher = FleetWatcher(
            {vm.name: self.server.vm_url(vm.name) for vm in o.fleet},
            self.timeline,
            on_new=self._attach_step,
        ).start()
        self.stack.callback(self.watcher.stop)
        return self

    def _find_missing_parts(self) -> None:
        """Say clearly which part of the pipeline is not there, instead of failing on it."""
        import importlib.util

        parts = {
            "relays": ("relay.__main__", "python -m relay is not available"),
            "local functions host": ("functions.local.host", "functions/local/host.py is missing"),
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
                env.get("PAGERDUTY_EVENTS_URL") if env.get("PAGERDUTY_ROUTING_KEY") else None,
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
        from relay.simulator.engine import Simulator
        from relay.simulator.server import SimulatorServer

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
            if pending:
                quiet_since = None
            elif self.watcher is not None and not self.watcher.active() and self._all_seen():
                quiet_since = quiet_since or time.monotonic()
                if time.monotonic() - quiet_since >= o.settle:
                    return
            else:
                quiet_since = None
            time.sleep(0.1)

    def _all_seen(self) -> bool:
        return all(step in self.step_events for step in self.played)

    def _play_step(self, step: Step) -> None:
        self.timeline.add("demo", step.scenario, f"playing on {step.target}: {step.story}")
        self._pending_steps.append(step)
        self.played.append(step)
        result = self.sim.play(step.scenario, target=step.target)
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
        if record.channel == "drain":
            text = f"drain hook called ({record.status})"
            self.timeline.add("drain", "drain-hook", text)
            return
        status = "accepted" if record.accepted else f"answered {record.status}"
        detail = "; ".join(record.problems)
        self.timeline.add(
            "notify",
            record.channel,
            f"{_message_title(record)} — {status}{': ' + detail if detail else ''}",
            ok=None if record.accepted else False,
        )

    # ------------------------------------------------------------------ outcomes
    def outcomes(self) -> list[Outcome]:
        results: list[Outcome] = []
        events = self.watcher.snapshot() if self.watcher else {}
        for step in self.played:
            event_id = self.step_events.get(step)
            track = events.get(event_id) if event_id else None
            name = f"{step.scenario} on {step.target}"
            if track is None:
                results.append(Outcome(f"{name}: IMDS showed the event", False, "never seen"))
                continue
            results.extend(self._imds_outcomes(name, step, track))
        for part, why in self.missing.items():
            results.append(Outcome(f"{part} running", False, why, skipped=True))
        return results

    def _imds_outcomes(self, name: str, step: Step, track: EventTrack) -> list[Outcome]:
        if step.scenario == "hardware-failure":
            ok = track.first_status == STARTED
            return [Outcome(f"{name}: appeared already Started", ok, track.first_status)]
        if step.scenario == "cancelled":
            ok = track.started_at is None and track.removed_at is not None
            return [Outcome(f"{name}: withdrawn without starting", ok)]
        ok = track.removed_at is not None and track.started_at is not None
        return [Outcome(f"{name}: went Scheduled → Started → removed", ok)]

    # ------------------------------------------------------------------ shutting down
    def close(self) -> None:
        self.stack.close()

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


def _message_title(record: Received) -> str:
    body = record.body if isinstance(record.body, dict) else {}
    if record.channel == "pagerduty":
        summary = (body.get("payload") or {}).get("summary", "")
        return f"{body.get('event_action', '?')} {body.get('dedup_key', '')[:8]} {summary}".strip()
    if record.channel == "teams":
        return TeamsReceiver.card_text(record)[:140]
    if record.channel == "webhook":
        event = body.get("event") or {}
        return f"{body.get('transition', '?')} {event.get('EventId') or event.get('event_id', '')}"
    return record.path


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
                timeline.add("demo", "demo", "stopping everything it started")
                demo.close()
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
    failed = [o for o in outcomes if not o.ok and not o.skipped]
    if aborted == "interrupted":
        return 130
    return 1 if failed or aborted else 0


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
    parser.add_argument("--verbose", action="store_true", help="also print the parts' logs")
    args = parser.parse_args(argv)
    options = DemoOptions(
        time_scale=args.time_scale,
        time_limit=args.time_limit,
        report=None if args.no_report else args.report,
        verbose=args.verbose,
    )
    return run(options)


if __name__ == "__main__":
    sys.exit(main())
