"""The demo's upgrade lane (issue 44): while the plan's events flow, half the fleet's relays
are upgraded in batches by the rollout's own code (functions.rollout: the plan within the
demo policy's disruption budgets, the Runner that waits for each batch's heartbeats from
the new version in the liveness table, verified under each VM's key), then one VM is given
a build that cannot start, and one relay is killed outright (SIGKILL) and started again as
systemd's `Restart=always` would.

On a VM the run command runs `rollout-prologue.sh` + `add-relay.sh`, which refuses a relay
that does not run (`--help`) and otherwise replaces the pyz and restarts the unit. Here
`LocalRunCommands` stands in for ARM's managed Run Command and does the same to the demo's
relay process: the new build is a real pyz (relay/deploy/build_pyz.py) whose
`__version__` says `UPGRADE_VERSION`, started under the VM's guest clock as before.

What is checked (`upgrade_outcomes`): the upgraded half heartbeats the new version and the
others the old one; the bad build is refused and its VM keeps its relay; the killed relay
heartbeats again; no event of the plan is lost (every event the simulator played reached
the app); and, from each probed VM's readiness timeline (every answer, a refused
connection included), that no VM left its load balancer because of its relay: the probe is
the readiness responder's (relay/responder.py, local/relay_fleet.py), which keeps
answering while the relay restarts. A tree without the responder (`relay_fails_open`)
shows the count on the timeline instead of judging it.
"""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from local.report import Outcome

if TYPE_CHECKING:
    from local.demo_state import DemoState

GOOD = "https://releases.example/relay-demo-upgrade.pyz#sha256=" + "0" * 64
BAD = "https://releases.example/relay-demo-broken.pyz#sha256=" + "b" * 64
KILLED_RESTART_SECONDS = 2.0  # the unit's RestartSec
START_AT = 8.0  # plan seconds: after the last step of the first burst (local/plan.py)
QUIET_WAIT = 45.0  # seconds a VM's restart waits for its VM's event to be over
PROBE_EVERY = 0.1  # as local/demo_ready.py's probe


def upgrade_version() -> str:
    import relay

    return f"{relay.__version__}+demo-upgrade"


def build_relays(work: Path, version: str) -> tuple[Path, Path]:
    """Two pyz of relay/ (the build `make relay` runs, done once): one that reports
    `version`, and a bad build of it whose every start fails at once."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "build_pyz", Path(__file__).resolve().parents[1] / "relay" / "deploy" / "build_pyz.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    plain = module.build(work / "plain.pyz")
    good, bad = work / "upgrade.pyz", work / "broken.pyz"
    stamp = f'__version__="{version}"'.encode()
    with zipfile.ZipFile(plain) as source:
        entries = [(item, source.read(item)) for item in source.infolist()]
    for out, broken in ((good, False), (bad, True)):
        with zipfile.ZipFile(out, "w") as target:
            for item, data in entries:
                if item.filename == "relay/__init__.py":
                    data = re.sub(rb"__version__\s*=\s*['\"][^'\"]*['\"]", stamp, data)
                if broken and item.filename == "__main__.py":
                    data = b"raise SystemExit('this relay build cannot start')\n"
                copy = zipfile.ZipInfo(item.filename, date_time=item.date_time)
                copy.compress_type, copy.external_attr = item.compress_type, item.external_attr
                target.writestr(copy, data)
    plain.unlink()
    return good, bad


class LaneProbe:
    """A load balancer's probe of one VM's `/readyz`: every answer kept with its time (a
    refused connection is 0), so a relay restart that closes the port shows."""

    def __init__(self, vm: str, url: str) -> None:
        self.vm, self.url = vm, url
        self.answers: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"lane-probe-{vm}")
        self._thread.start()

    def _ask(self) -> int:
        try:
            with urllib.request.urlopen(self.url, timeout=1) as answer:  # noqa: S310
                return answer.status
        except urllib.error.HTTPError as exc:
            return exc.code
        except OSError:
            return 0

    def _run(self) -> None:
        while not self._stop.wait(PROBE_EVERY):
            self.answers.append((time.time(), self._ask()))

    def refused(self, since: float, until: float) -> int:
        return sum(1 for at, status in self.answers if since <= at <= until and status == 0)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=3)


class LocalRunCommands:
    """ARM's managed Run Command for the demo's relays (functions.rollout.arm.RunCommands'
    put/get/delete): what add-relay.sh does on a VM, done to the local relay process."""

    def __init__(self, lane: UpgradeLane) -> None:
        self.lane = lane
        self.state: dict[str, Any] = {}

    def put(self, vm_path: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
        from functions.rollout.arm import Execution

        params = {p["name"]: p["value"] for p in body["properties"].get("parameters", [])}
        pyz = self.lane.packages[params["RELAY_PACKAGE"]]
        vm = self.lane.names[vm_path]
        self.lane.until_quiet(vm)
        check = subprocess.run(  # noqa: S603 - our own build
            [sys.executable, "-I", str(pyz), "--help"], capture_output=True, timeout=60
        )
        if check.returncode != 0:  # add-relay.sh: nothing installed, the old relay stays
            why = f"add-relay.sh: the relay does not run on {sys.executable}"
            self.state[vm_path] = Execution("Failed", 1, "", why, "")
            return {}
        self.lane.restart(vm, pyz)
        self.state[vm_path] = Execution("Succeeded", 0, "add-relay.sh: relay running", "", "")
        return {}

    def get(self, vm_path: str, name: str) -> Any:
        return self.state[vm_path]

    def delete(self, vm_path: str, name: str) -> None:
        self.state.pop(vm_path, None)


class UpgradeLane:
    """Runs in a thread beside the plan; `outcomes` joins it."""

    def __init__(self, demo: DemoState) -> None:
        self.demo = demo
        self.version = upgrade_version()
        self.lines: list[str] = []
        self.outcome: Any = None
        self.broken_outcome: Any = None
        self.error: str | None = None
        self.began = self.ended = 0.0
        relays = sorted(vm.name for vm in demo.options.fleet if vm.relay)
        self.upgraded = relays[::2]  # half the fleet's relays
        rest = [name for name in relays if name not in self.upgraded]
        self.broken = rest[0] if rest else None
        self.killed = next((n for n in rest[1:] if n in demo.ready_urls), None)
        self.names: dict[str, str] = {}
        # Built before the plan plays, so the build takes no time from its events.
        work = demo.workdir / "upgrade"
        work.mkdir(parents=True, exist_ok=True)
        good, bad = build_relays(work, self.version)
        self.packages: dict[str, Path] = {GOOD: good, BAD: bad}
        self.probes = [
            LaneProbe(vm, url)
            for vm, url in sorted(demo.ready_urls.items())
            if vm in (*self.upgraded, self.broken, self.killed)
        ]
        self.thread = threading.Thread(target=self._run, daemon=True, name="upgrade-lane")

    def say(self, line: str) -> None:
        self.lines.append(line)
        self.demo.timeline.add("rollout", "relays", line)

    def start_at(self, elapsed: float) -> None:
        """Start once the plan's burst of scheduling is over (its events still in flight):
        the lane then adds no load while the budget's pair is decided in order."""
        if elapsed >= START_AT and not self.thread.is_alive() and not self.began:
            self.began = time.time()
            self.thread.start()

    def until_quiet(self, vm: str, timeout: float = QUIET_WAIT) -> None:
        """Until IMDS shows no event naming the VM (or `timeout`): a relay is not restarted
        while its VM's event may need its callback, which would send the approval through
        Resource Manager instead."""
        watcher = self.demo.watcher
        deadline = time.monotonic() + timeout
        while watcher is not None and time.monotonic() < deadline:
            if not any(vm in track.resources for track in watcher.active()):
                return
            time.sleep(0.2)

    def restart(self, vm: str, pyz: Path | None, kill: bool = False) -> None:
        """Stop the VM's relay (SIGTERM, or SIGKILL) and start it again, from `pyz`."""
        from local.demo_ledger import relay_command
        from local.relays import relay_env
        from local.stack import stop_process

        demo = self.demo
        old = demo.relays[vm]
        if kill:
            old.kill()
            old.wait(timeout=10)
            time.sleep(KILLED_RESTART_SECONDS)
        else:
            stop_process(old)
        argv = list(demo.relay_argv[vm])
        if pyz is not None:
            argv[1:3] = [str(pyz)]  # `-m relay` -> the new build
        log = demo.workdir / "logs" / f"relay-{vm}.log"
        demo.relays[vm] = demo.stack.process(
            relay_command(demo, vm, argv), log, env=relay_env(demo.options.env)
        )

    def _targets(self, names: list[str]) -> list[Any]:
        from functions.rollout.targets import Target
        from simulator import instance

        by_name = {vm.name: vm for vm in self.demo.options.fleet}
        targets = []
        for name in names:
            spec = by_name[name]
            described = {"name": name, "scale_set": spec.scale_set}
            rid = instance.resource_id(described)
            self.names[rid] = name
            targets.append(
                Target(
                    id=rid,
                    name=name,
                    vm_id=instance.vm_id(described),
                    location="westeurope",
                    subscription=instance.SUBSCRIPTION_ID,
                    resource_group=instance.RESOURCE_GROUP,
                    scale_set=spec.scale_set or "",
                    availability_set=spec.availability_set or "",
                    zone=spec.zone or "",
                    tags=dict(spec.tags),
                )
            )
        return targets

    def _run(self) -> None:
        try:
            self._lane()
        except Exception as exc:  # the lane's trouble is an outcome, never a crash
            self.error = f"{type(exc).__name__}: {exc}"
            self.say(f"upgrade lane failed: {self.error}")
        finally:
            self.ended = time.time()

    def _lane(self) -> None:
        from functions.identity.registry import IdentityStore
        from functions.model.budgets import effective_budgets
        from functions.rollout.app import AppState
        from functions.rollout.plan import plan_batches
        from functions.rollout.run import Action, Runner

        demo = self.demo
        registry = IdentityStore.from_service(
            demo.store.service, demo.settings.app_secret_bytes, demo.settings.state_table_prefix
        )
        self.state = AppState(demo.store, registry)
        beat = max(1.0, round(300 / demo.options.time_scale, 1))
        runner = Runner(
            LocalRunCommands(self),  # type: ignore[arg-type]
            self.state,
            None,
            say=self.say,
            poll=0.5,
            heartbeat_wait=4 * beat + 10,
        )
        policy = demo.host.pipeline.policy
        budgets = effective_budgets(policy.budgets, policy.max_concurrent_per_set) if policy else ()
        targets = self._targets(self.upgraded)
        batches = plan_batches(targets, budgets, percent=50.0, canary=1)
        self.say(
            f"upgrade lane: {len(targets)} of {len(demo.relays)} relays to {self.version} in "
            f"{len(batches)} batch(es), within the policy's budgets, each awaiting heartbeats"
        )
        action = Action("rollout", "(rollout-prologue.sh + add-relay.sh)", self.version, GOOD)
        self.outcome = runner.run(action, batches, "demo-upgrade")
        if self.broken:
            broken = Action("rollout", "(rollout-prologue.sh + add-relay.sh)", self.version, BAD)
            self.broken_outcome = runner.run(broken, [self._targets([self.broken])], "demo-bad")
        if self.killed:
            self.say(f"relay of {self.killed} killed outright (SIGKILL), restarted by its unit")
            self.killed_at = time.time()
            self.restart(self.killed, None, kill=True)
            self.killed_back = self._heard_after(self.killed, self.killed_at, 4 * beat + 10)

    def _heard_after(self, vm: str, since: float, timeout: float) -> bool:
        target = self._targets([vm])[0]
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            seen = self.state.latest(target)
            if seen and seen[1] >= since - 5:
                return True
            time.sleep(0.2)
        return False

    def join(self, timeout: float) -> None:
        self.thread.join(timeout)
        self.stop_probes()

    def stop_probes(self) -> None:
        """The load balancer's probes stopped, whether or not the outcomes were read: a
        demo closed early (Ctrl-C, a test that stops it mid-plan) leaves no thread probing
        its relays after it (a test later in the same process once met one)."""
        for probe in self.probes:
            probe.stop()


def relay_fails_open() -> bool:
    """Whether the probe is the readiness responder's, which keeps answering while the
    relay restarts (issue 44 item 1, relay/responder.py)."""
    import importlib.util

    return importlib.util.find_spec("relay.responder") is not None


def prepare_upgrade_lane(demo: DemoState) -> UpgradeLane | None:
    """The lane with its builds made, before the plan plays; None without relays or host,
    or when the run's options leave it out."""
    if not demo.options.upgrade_lane:
        return None
    if not getattr(demo, "relays", None) or getattr(demo, "host", None) is None:
        return None
    return UpgradeLane(demo)


def upgrade_outcomes(demo: DemoState) -> list[Outcome]:
    lane: UpgradeLane | None = getattr(demo, "upgrade_lane", None)
    if lane is None:
        return []
    lane.join(timeout=120)
    if lane.thread.is_alive() or lane.error or lane.outcome is None:
        why = lane.error or ("still running after 120 s" if lane.began else "never started")
        return [Outcome("upgrade lane: half the relays upgraded in batches", False, why)]
    outcomes = []
    done, failed = lane.outcome.done, lane.outcome.failed
    batches = lane.outcome.batches
    heard = {t.name: lane.state.latest(t) for t in lane._targets(sorted(demo.relays))}
    upgraded = sorted(n for n, seen in heard.items() if seen and seen[0] == lane.version)
    outcomes.append(
        Outcome(
            "upgrade lane: half the relays upgraded in batches while events flowed",
            not failed and upgraded == sorted(lane.upgraded) and batches >= 2,
            f"{len(done)} of {len(lane.upgraded)} in {batches} batches; heartbeating "
            f"{lane.version}: {', '.join(upgraded) or 'none'}"
            + (f"; did not come back: {failed}" if failed else ""),
        )
    )
    events = sorted(set(demo.step_events.values()))
    lost = [e for e in events if demo.store.get_event(e) is None]
    outcomes.append(
        Outcome(
            "upgrade lane: no event lost while relays were upgraded",
            bool(events) and not lost,
            f"{len(events) - len(lost)} of {len(events)} events the simulator played reached "
            "the app" + (f"; lost: {', '.join(lost)}" if lost else ""),
        )
    )
    versions: dict[str, int] = {}
    for seen in heard.values():
        key = seen[0] if seen else "no relay heard"
        versions[key] = versions.get(key, 0) + 1
    shown = ", ".join(f"{v}: {n}" for v, n in sorted(versions.items()))
    outcomes.append(Outcome("upgrade lane: relay versions in the liveness table", True, shown))
    if lane.broken and lane.broken_outcome is not None:
        why = lane.broken_outcome.failed.get(lane._targets([lane.broken])[0].vm_id, "")
        kept = heard.get(lane.broken)
        outcomes.append(
            Outcome(
                f"upgrade lane: a build that cannot start is refused on {lane.broken}, "
                "its relay kept",
                "does not run" in why and bool(kept) and kept[0] != lane.version,
                f"{why}; still heartbeating {kept[0] if kept else 'nothing'}",
            )
        )
    if lane.killed:
        outcomes.append(
            Outcome(
                f"upgrade lane: the relay of {lane.killed} killed outright heartbeats again",
                bool(getattr(lane, "killed_back", False)),
                "restarted by its unit (Restart=always)",
            )
        )
    for probe in lane.probes:
        refused = probe.refused(lane.began, lane.ended)
        name = f"upgrade lane: {probe.vm} never left its load balancer because of its relay"
        detail = f"{refused} of {len(probe.answers)} probe answers refused during the lane"
        if relay_fails_open():
            outcomes.append(Outcome(name, refused == 0, detail))
        else:  # measured and shown, not promised: this relay is not fail-open yet
            demo.timeline.add(
                "rollout",
                probe.vm,
                f"readiness probe during the lane: {detail} (the relay closes its probe "
                "port while it restarts: not fail-open yet, so not judged)",
                ok=None if refused == 0 else False,
            )
    return outcomes
