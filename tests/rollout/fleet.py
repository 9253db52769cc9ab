"""A recorded fleet for the rollout tests: a Uniform set, a Flexible set, standalone VMs
and a Windows VM, and the world (clients) the CLI runs with against the recorder."""

from __future__ import annotations

import argparse
import time
import uuid
from types import SimpleNamespace
from typing import Any

import requests

from functions.identity.resource_graph import ResourceGraph
from functions.rollout.arm import RunCommands
from functions.rollout.run import Runner
from functions.rollout.targets import Target
from tests.rollout.arm_recorder import Vm

SUB = "00000000-0000-0000-0000-000000000001"
RG = f"/subscriptions/{SUB}/resourceGroups/rg-web"
COMPUTE = f"{RG}/providers/Microsoft.Compute"
UNIFORM = f"{COMPUTE}/virtualMachineScaleSets/vmss-web"
FLEX = f"{COMPUTE}/virtualMachineScaleSets/vmss-flex"


def vm_id(n: int) -> str:
    return str(uuid.UUID(int=n))


def fleet(uniform: int = 20, flexible: int = 10, standalone: int = 5) -> list[Vm]:
    vms = [Vm(f"{UNIFORM}/virtualMachines/{i}", vm_id(100 + i)) for i in range(uniform)]
    vms += [
        Vm(f"{COMPUTE}/virtualMachines/flex_{i}", vm_id(200 + i), scale_set_id=FLEX)
        for i in range(flexible)
    ]
    vms += [Vm(f"{COMPUTE}/virtualMachines/app-{i}", vm_id(300 + i)) for i in range(standalone)]
    vms.append(Vm(f"{COMPUTE}/virtualMachines/win-1", vm_id(999), os_type="Windows"))
    return vms


class Token:
    def get_token(self, *scopes: str, **kwargs: object) -> object:
        return SimpleNamespace(token="t0k3n", expires_on=int(time.time()) + 3600)


class Beats:
    """The liveness rows the app would verify: vm_id -> (relay_version, at)."""

    def __init__(self) -> None:
        self.rows: dict[str, tuple[str, int]] = {}

    def latest(self, target: Target) -> tuple[str, int] | None:
        return self.rows.get(target.vm_id)


class Rows:
    def __init__(self) -> None:
        self.forgotten: list[str] = []

    def forget(self, target: Target) -> list[str]:
        self.forgotten.append(target.vm_id)
        return ["vms row", "identity (callback keys)"]


class World:
    """The CLI's clients, pointed at the recorder; progress lines kept in `lines`."""

    def __init__(self, url: str, beats: Beats, rows: Rows | None = None) -> None:
        session = requests.Session()
        self.graph = ResourceGraph(session, Token(), url, [SUB])
        self.arm = RunCommands(session, Token(), url, sleep=lambda s: None)
        self.state = beats
        self.rows = rows or Rows()
        self.lines: list[str] = []

    def runner(self, wait: float) -> Runner:
        return Runner(
            self.arm, self.state, self.rows, say=self.lines.append, poll=0.01, heartbeat_wait=0.3
        )


def args(command: str, scope: str = RG, **extra: Any) -> argparse.Namespace:
    base = {
        "relay_command": command,
        "scope": scope,
        "version": None,
        "package": None,
        "install_args": "",
        "percent": 10.0,
        "canary": 1,
        "max_batch": None,
        "wait": 0.3,
        "dry_run": False,
        "history": "relay-rollout-history.json",
    }
    return argparse.Namespace(**{**base, **extra})
