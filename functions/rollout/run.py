"""One rollout, rollback or removal: batch after batch, each one's Run Commands sent,
followed to their end, then its relays' heartbeats awaited; the first batch with a VM that
did not come back stops the run, naming each such VM and why.

What "came back" means: the run command ended Succeeded with exit code 0, and then the
VM's liveness row (functions.store.liveness, verified under the VM's own key) carries the
new `relay_version`, written after the batch started. A relay heartbeats every 300 s, so
a batch waits up to `heartbeat_wait` (420 s by default) for it. For a removal: the run
command succeeded; then the run command resource is deleted and the app forgets the VM's
rows (its identity with its callback keys, its vms row, its liveness rows).

Crash-safe by being idempotent: a VM whose relay already heartbeats the target version is
skipped, so a stopped or interrupted rollout is resumed by running it again; the history
file (functions.rollout.state) remembers what each run did, for `rollback`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from functions.rollout.arm import ArmError, Execution, RunCommands
from functions.rollout.targets import Target

RUN_COMMAND = "scheduled-events-relay"  # one per VM: each rollout replaces it
RUN_TIMEOUT_SECONDS = 600  # the script's own limit on the VM (timeoutInSeconds)
CLOCK_SKEW = 60  # a heartbeat may be dated this much before the batch started


class Heartbeats(Protocol):
    """What the app knows of a VM's relay: (relay_version, unix seconds) of its verified
    liveness row, or None."""

    def latest(self, target: Target) -> tuple[str, int] | None: ...


class AppRows(Protocol):
    """The app's rows about a VM, forgotten when its relay is removed."""

    def forget(self, target: Target) -> list[str]: ...


@dataclass(frozen=True)
class Action:
    """What runs on every VM of the run."""

    verb: str  # "rollout", "rollback" or "remove"
    script: str
    version: str = ""  # the relay_version to wait for (not for "remove")
    package: str = "embedded"
    install_args: str = ""

    def body(self, target: Target, run_id: str) -> dict[str, Any]:
        """The run command resource (runCommand.json VirtualMachineRunCommand): named
        parameters reach a Linux script as environment variables."""
        parameters = [{"name": "ROLLOUT_ID", "value": run_id}]
        if self.verb != "remove":
            parameters.append({"name": "RELAY_PACKAGE", "value": self.package})
            if self.install_args:
                parameters.append({"name": "RELAY_INSTALL_ARGS", "value": self.install_args})
        return {
            "location": target.location,
            "properties": {
                "source": {"script": self.script},
                "parameters": parameters,
                "asyncExecution": False,
                "treatFailureAsDeploymentFailure": True,
                "timeoutInSeconds": RUN_TIMEOUT_SECONDS,
            },
        }


@dataclass
class Outcome:
    """What a run did: the VMs done, skipped (already there), and those that did not come
    back, with why; `stopped` when a batch failed and later batches were not started."""

    done: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    previous: dict[str, str] = field(default_factory=dict)  # vm_id -> version heard before
    stopped: bool = False
    batches: int = 0


@dataclass
class Runner:
    """Runs an Action over batches of targets. Every wait has a deadline; `poll` seconds
    between looks (0 in tests); `say` prints a progress line."""

    arm: RunCommands
    heartbeats: Heartbeats
    rows: AppRows | None = None
    say: Callable[[str], None] = print
    poll: float = 5.0
    run_timeout: float = RUN_TIMEOUT_SECONDS + 120
    heartbeat_wait: float = 420.0
    clock: Callable[[], float] = time.time
    sleep: Callable[[float], None] = time.sleep

    def run(self, action: Action, batches: Sequence[Sequence[Target]], run_id: str) -> Outcome:
        outcome = Outcome()
        total = sum(len(b) for b in batches)
        for number, batch in enumerate(batches, 1):
            names = ", ".join(t.name for t in batch[:6]) + (" ..." if len(batch) > 6 else "")
            self.say(f"batch {number}/{len(batches)}: {len(batch)} VM(s): {names}")
            failed = self._batch(action, batch, run_id, outcome)
            outcome.batches = number
            outcome.failed.update(failed)
            outcome.done.extend(t.vm_id for t in batch if t.vm_id not in failed)
            self.say(
                f"batch {number}/{len(batches)}: {len(batch) - len(failed)} of {len(batch)} "
                f"came back; {len(outcome.done)} of {total} VM(s) done"
            )
            if failed:
                outcome.stopped = number < len(batches)
                for target in batch:
                    if target.vm_id in failed:
                        why = failed[target.vm_id]
                        self.say(f"  did not come back: {target.name} ({target.id}): {why}")
                if outcome.stopped:
                    self.say(f"stopped: {len(batches) - number} batch(es) not started")
                break
        return outcome

    def _batch(
        self, action: Action, batch: Sequence[Target], run_id: str, outcome: Outcome
    ) -> dict[str, str]:
        failed: dict[str, str] = {}
        started = self.clock()
        for target in batch:
            before = self.heartbeats.latest(target)
            if before:
                outcome.previous[target.vm_id] = before[0]
            try:
                self.arm.put(target.id, RUN_COMMAND, action.body(target, run_id))
            except ArmError as exc:
                failed[target.vm_id] = f"run command not accepted: {exc}"
        running = [t for t in batch if t.vm_id not in failed]
        failed.update(self._follow(running))
        if action.verb == "remove":
            for target in batch:
                if target.vm_id not in failed:
                    self._forget(target, failed)
            return failed
        waiting = [t for t in batch if t.vm_id not in failed]
        failed.update(self._await_heartbeats(waiting, action.version, started))
        return failed

    def _follow(self, targets: Sequence[Target]) -> dict[str, str]:
        """Each run command to its end (or the deadline): the VMs whose script failed."""
        failed: dict[str, str] = {}
        left = list(targets)
        deadline = self.clock() + self.run_timeout
        while left:
            still = []
            for target in left:
                try:
                    execution = self.arm.get(target.id, RUN_COMMAND)
                except ArmError as exc:
                    failed[target.vm_id] = f"run command status unreadable: {exc}"
                    continue
                if not execution.done:
                    still.append(target)
                elif not execution.succeeded:
                    failed[target.vm_id] = _why(execution)
            left = still
            if left and self.clock() >= deadline:
                for target in left:
                    failed[target.vm_id] = (
                        f"run command still not finished after {self.run_timeout:g} s"
                    )
                break
            if left:
                self.sleep(self.poll)
        ran = len(targets) - len(failed)
        self.say(f"  run command ended on {ran} of {len(targets)} VM(s)")
        return failed

    def _await_heartbeats(
        self, targets: Sequence[Target], version: str, started: float
    ) -> dict[str, str]:
        """Until each VM's relay heartbeats `version` (dated after the batch started)."""
        left = list(targets)
        deadline = self.clock() + self.heartbeat_wait
        last: dict[str, tuple[str, int] | None] = {}
        while left:
            still = []
            for target in left:
                seen = last[target.vm_id] = self.heartbeats.latest(target)
                if not (seen and seen[0] == version and seen[1] >= started - CLOCK_SKEW):
                    still.append(target)
            if len(still) != len(left) or not still:
                came = len(targets) - len(still)
                self.say(f"  heartbeats from {version}: {came} of {len(targets)} VM(s)")
            left = still
            if left and self.clock() >= deadline:
                break
            if left:
                self.sleep(self.poll)
        failed: dict[str, str] = {}
        for target in left:
            seen = last.get(target.vm_id)
            heard = f"last heard {seen[0]!r}" if seen else "no heartbeat verified"
            failed[target.vm_id] = (
                f"no heartbeat from {version} within {self.heartbeat_wait:g} s ({heard})"
            )
        return failed

    def _forget(self, target: Target, failed: dict[str, str]) -> None:
        try:
            self.arm.delete(target.id, RUN_COMMAND)
        except ArmError as exc:  # the relay is gone; the leftover resource is only noise
            self.say(f"  {target.name}: run command resource not deleted: {exc}")
        if self.rows is None:
            return
        try:
            gone = self.rows.forget(target)
        except Exception as exc:  # the table's trouble: say so, the VM's relay is gone
            failed[target.vm_id] = (
                f"relay removed, but the app's rows were not: {type(exc).__name__}: {exc}"
            )
            return
        forgotten = ", ".join(gone) or "nothing (no rows)"
        self.say(f"  {target.name}: relay removed; the app forgot {forgotten}")


def _why(execution: Execution) -> str:
    tail = (execution.error or execution.output or execution.message).strip().splitlines()
    said = tail[-1][:300] if tail else "(no output)"
    return f"script {execution.state}, exit code {execution.exit_code}: {said}"
