"""What a running demo holds, apart from how it starts: the parts read and fill it.

`local.orchestration.Demo` is this state plus the start-up and the play. The parts
(relay_fleet, drain_worker, outcomes, the ledger, the backtest, the report) take the state,
not `Demo`, so none of them imports the orchestration back: local/ has no import cycle
(tests/test_import_cycles.py).
"""

from __future__ import annotations

import os
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from local.channels import Delivery
from local.host_clock import ClockStep, HostClock, describe
from local.options import DemoAborted, DemoOptions
from local.receivers import Receiver
from local.relays import parse_hook_line
from local.report import Outcome, Timeline, short_id
from local.stack import Stack
from local.stopping import StopSignal
from local.subscription import Subscription
from local.watcher import FleetWatcher


class DemoState:
    """Everything the demo's parts observed and started, and the checks they share."""

    # Set as the parts start (local.orchestration, relay_fleet, drain_worker).
    connection_string: str
    callback_port: int
    settings: Any  # functions.settings.Settings
    store: Any  # functions.store.state.Store
    admission: Any  # functions.pipeline.admission.Admission
    host: Any  # local.host.LocalHost
    hook_log: Path
    undrain_log: Path
    relays: dict[str, Any]  # VM -> its relay's Popen
    relay_argv: dict[str, list[str]]  # VM -> its relay's command line (for a restart)
    ready_urls: dict[str, str]  # VM -> its readiness probe's URL, where it has one
    callback_urls: dict[str, str]
    drain_settings: Any
    undrain_settings: Any
    terminate_subscription: Any  # local.bus.LocalQueue: the drain workflow's messages
    backtest: Any = None  # functions.backtest.replay.Backtest, once run
    upgrade_lane: Any = None  # local.demo_upgrade.UpgradeLane, while the plan plays

    def __init__(self, options: DemoOptions | None = None, timeline: Timeline | None = None):
        self.options = options or DemoOptions()
        self.timeline = timeline or Timeline()
        self.stack = Stack()
        # Set first when the demo stops: the host's and the drain's waits and requests end
        # (local/stopping.py), so stopping never waits for a drain run.
        self.stopping = StopSignal()
        self.interrupted: str | None = None  # a stopping signal's name, once one came
        self.missing: dict[str, str] = {}  # part -> why it is not running
        self.receivers: dict[str, Receiver] = {}
        self.external: dict[str, str] = {}  # channel -> where it posts instead
        self.sim: Any = None
        self.server: Any = None
        self.watcher: FleetWatcher | None = None
        self.step_events: dict[Any, str] = {}  # which EventId each step (local.plan.Step)
        self.played: list[Any] = []
        self.workdir = Path(tempfile.mkdtemp(prefix="sebridge-demo-"))
        if not self.options.keep:
            self.stack.callback(_remove_tree, self.workdir)
        self._started = time.monotonic()
        self._lock = threading.Lock()
        self.deliveries: list[Delivery] = []
        self.drain_results: list[Any] = []
        self.publisher: Any = None
        self.channels: list[str] = []
        self.subscriptions: list[Subscription] = []
        self.inbox: Path | None = None
        self.event_grid: Any = None  # the Event Grid stand-in (agentless mode), if any VM opted in
        self.credential: Any = None  # the function app's identity for Resource Manager
        # The functions read POLICY__* from the process environment, so that is what counts.
        self.play_errors: list[Outcome] = []
        self.custom_policy = any(k.upper().startswith("POLICY__") for k in os.environ)
        self.policy_source = (
            "your POLICY__* settings"
            if self.custom_policy
            else "the demo's policy: the default (drain, then approve, every disruptive "
            "event) with two opt-in rules in front and a budget of one VM per service"
        )
        self.hook_runs: list[tuple[float, str, str]] = []  # (time.time(), VM, EventId)
        self.undrain_runs: list[tuple[float, str, str]] = []  # the same, of the undrain hook
        # Each Freeze's impact ledger, (lane label, its LedgerLines), for the report.
        self.ledgers: list[tuple[str, list[Any]]] = []
        self.ready_probes: list[Any] = []  # local.demo_ready.ProbeWatcher, one a drained VM
        # This host's own wall-clock steps (issue 47): said, and counted in the ledger check.
        self.host_clock = HostClock(on_step=self._host_clock_stepped)

    def _host_clock_stepped(self, step: ClockStep) -> None:
        self.timeline.add("demo", "host clock", describe(step))

    def check_deadline(self) -> None:
        if self.interrupted:  # a signal whose KeyboardInterrupt Python dropped (local.cli)
            raise KeyboardInterrupt(self.interrupted)
        if time.monotonic() - self._started > self.options.time_limit:
            raise DemoAborted(f"the hard time limit of {self.options.time_limit:.0f} s passed")

    def hook_script_runs(self) -> None:
        """The drain and undrain scripts write one line per run; show each as it happens."""
        for name, log, runs in (
            ("drain", getattr(self, "hook_log", None), self.hook_runs),
            ("undrain", getattr(self, "undrain_log", None), self.undrain_runs),
        ):
            if log is None or not log.exists():
                continue
            for line in log.read_text().splitlines()[len(runs) :]:
                run = parse_hook_line(line)
                runs.append(run)
                at, vm, event_id = run
                # Read from its log a moment later: say when it ran, so the line is not
                # mistaken for coming after what the timeline printed meanwhile.
                lag = time.time() - at
                when = f" ({lag:.2f} s ago)" if lag >= 0.05 else ""
                self.timeline.add(
                    "drain", short_id(event_id), f"relay of {vm} ran its hook script '{name}'{when}"
                )

    def recorded_deliveries(self) -> list[Delivery]:
        """The deliveries so far, copied: the channels' workers keep appending."""
        with self._lock:
            return list(self.deliveries)


def _remove_tree(path: Path) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)
