"""`python -m functions relay rollout | rollback | remove | versions` against a recorder of
Azure Resource Manager (tests/rollout/arm_recorder.py: it checks what ARM checks, from
azure-rest-api-specs' runCommand.json 2024-11-01 @ 05b997f6) and a fake relay on each VM
that heartbeats the version its package carries. Issue 44, "Rollout, upgrade and removal":
every documented path was all at once (no canary, no batches, nothing for Flexible sets or
standalone VMs), nothing rolled back, removal did not exist."""

from __future__ import annotations

from pathlib import Path

import pytest

from functions.rollout import cli
from functions.rollout.arm import API_VERSION
from tests.rollout.arm_recorder import Recorder, Vm
from tests.rollout.fleet import FLEX, RG, UNIFORM, Beats, World, args, fleet

V1 = "https://releases.example/relay-0.1.0.pyz#sha256=" + "1" * 64
V2 = "https://releases.example/relay-0.2.0.pyz#sha256=" + "2" * 64
VERSIONS = {V1: "0.1.0", V2: "0.2.0"}


class FakeVm:
    """The relay side: a run command's script ends 0 and the relay heartbeats the version
    of the package it was given, except on VMs told to fail or to stay silent."""

    def __init__(self, beats: Beats, clock: list[int]) -> None:
        self.beats, self.clock = beats, clock
        self.silent: set[str] = set()
        self.broken: set[str] = set()
        self.runs: list[tuple[str, dict[str, str]]] = []

    def __call__(self, vm: Vm, script: str, env: dict[str, str], argv: list[str]):
        self.runs.append((vm.vm_id, env))
        if vm.vm_id in self.broken:
            return 1, "", "add-relay.sh: the relay does not run on /usr/bin/python3"
        if script.startswith("#!/bin/sh\n# Takes the Scheduled Events relay off"):
            self.beats.rows.pop(vm.vm_id, None)
            return 0, "remove-relay.sh: removed", ""
        assert script.startswith("#!/bin/sh\n# The head of what")  # the prologue, then
        assert "add-relay.sh" in script and "RELAY_PACKAGE" in script  # add-relay.sh
        if vm.vm_id not in self.silent:
            self.beats.rows[vm.vm_id] = (VERSIONS[env["RELAY_PACKAGE"]], self.clock[0])
        return 0, "add-relay.sh: relay running", ""


@pytest.fixture
def world(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    beats = Beats()
    clock = [2_000_000_000]
    vm = FakeVm(beats, clock)
    with Recorder(fleet(), vm) as recorder:
        world = World(recorder.url, beats)
        world.recorder, world.vm = recorder, vm
        for target in fleet()[:-1]:  # every Linux VM runs 0.1.0 (from customData)
            beats.rows[target.vm_id] = ("0.1.0", clock[0] - 600)
        yield world


def test_a_rollout_covers_uniform_flexible_and_standalone_vms_in_batches(world, capsys) -> None:
    code = cli.run(args("rollout", version="0.2.0", package=V2, percent=10.0), world)
    out = capsys.readouterr().out
    assert code == 0, out + "\n".join(world.lines)
    puts = world.recorder.puts()
    assert world.recorder.refusals == []
    # Every Linux VM once, the Windows VM never; each kind at its own ARM path.
    assert len(puts) == 35
    paths = [p for p, _ in puts]
    assert sum(p.startswith(UNIFORM + "/virtualMachines/") for p in paths) == 20
    assert sum("/virtualMachines/flex_" in p for p in paths) == 10
    assert sum("/virtualMachines/app-" in p for p in paths) == 5
    assert not any("win-1" in p for p in paths)
    assert all(p.endswith("/runCommands/scheduled-events-relay") for p in paths)
    assert all(b["properties"]["treatFailureAsDeploymentFailure"] for _, b in puts)
    # The default budget (max_concurrent_per_set 1) allows one VM of a set at a time, under
    # 10 % of vmss-web (2): a canary of 1, then one VM of each set (and one standalone).
    batches = [line for line in world.lines if line.startswith("batch ") and "VM(s):" in line]
    assert batches[0].startswith("batch 1/") and ": 1 VM(s)" in batches[0]
    assert all(": 3 VM(s)" in b or ": 2 VM(s)" in b or ": 1 VM(s)" in b for b in batches)
    assert "vmss-web [uniform]: 0.1.0: 20" in out
    assert "vmss-flex [flexible]: 0.1.0: 10" in out
    assert "(standalone VMs) [vm]: 0.1.0: 5" in out
    assert "rollout done: 35 VM(s)" in out
    assert {v for v, _ in world.state.rows.values()} == {"0.2.0"}


def test_batches_never_exceed_a_budget_or_ten_percent_of_a_set(world, capsys, monkeypatch) -> None:
    monkeypatch.setenv("POLICY__MAX_CONCURRENT_PER_SET", "10")
    monkeypatch.setenv(
        "POLICY__BUDGETS", '[{"name": "web-zone", "group_by": "set", "max_unavailable": "15%"}]'
    )
    code = cli.run(args("rollout", version="0.2.0", package=V2, canary=2), world)
    assert code == 0
    order = [p for p, _ in world.recorder.puts()]
    sizes = []
    for line in world.lines:
        if line.startswith("batch ") and "VM(s):" in line:
            sizes.append(int(line.split(": ")[1].split()[0]))
    assert sizes[0] == 2  # the canary
    # Later batches: 10 % of vmss-web (2), 10 % of vmss-flex (1), of the 5 standalone (1).
    assert max(sizes[1:]) == 4
    assert len(order) == 35


def test_a_vm_that_does_not_come_back_stops_the_rollout_and_is_named(world, capsys) -> None:
    # Batch 2 holds app-1, flex_0 and vmss-web/0 (standalone VMs sort first, then by set).
    world.vm.silent.add(str(fleet()[20].vm_id))  # flex_0: the script runs, no heartbeat
    world.vm.broken.add(str(fleet()[0].vm_id))  # vmss-web/0: the script fails
    code = cli.run(args("rollout", version="0.2.0", package=V2), world)
    out = capsys.readouterr().out
    text = "\n".join(world.lines)
    assert code == 1
    assert "did not come back" in text
    assert "vmss-web/virtualMachines/0): script Failed, exit code 1" in text
    assert "flex_0): no heartbeat from 0.2.0 within 0.3 s (last heard '0.1.0')" in text
    assert len(world.recorder.puts()) == 4  # the canary and batch 2: no later batch started
    assert "stopped:" in text and "batch(es) not started" in text
    assert "relay rollback --scope" in out


def test_rollback_returns_the_last_rollouts_vms_to_the_version_before(world, capsys) -> None:
    assert cli.run(args("rollout", version="0.1.0", package=V1), world) == 0  # all there
    assert "already at 0.1.0" in capsys.readouterr().out
    assert world.recorder.puts() == []  # nothing to do: crash-safe by being idempotent
    world.vm.silent.add(str(fleet()[6].vm_id))
    assert cli.run(args("rollout", version="0.2.0", package=V2), world) == 1
    upgraded = {vm for vm, env in world.vm.runs}
    world.vm.runs.clear()
    world.vm.silent.clear()
    # The history of the first run knows 0.1.0's package only if a rollout recorded it.
    history = Path("relay-rollout-history.json")
    assert history.exists()
    code = cli.run(args("rollback", package=V1, version="0.1.0"), world)
    out = capsys.readouterr().out
    assert code == 0, out + "\n".join(world.lines)
    assert {vm for vm, env in world.vm.runs} == upgraded
    assert {env["RELAY_PACKAGE"] for vm, env in world.vm.runs} == {V1}


def test_rollback_finds_the_previous_package_in_the_history(world, capsys) -> None:
    for target in fleet()[:-1]:
        world.state.rows[target.vm_id] = ("0.0.9", 1)
    assert cli.run(args("rollout", version="0.1.0", package=V1), world) == 0
    assert cli.run(args("rollout", version="0.2.0", package=V2), world) == 0
    world.vm.runs.clear()
    assert cli.run(args("rollback"), world) == 0
    assert {env["RELAY_PACKAGE"] for _, env in world.vm.runs} == {V1}
    assert len(world.vm.runs) == 35


def test_remove_takes_the_relay_off_and_forgets_the_vms_rows(world, capsys) -> None:
    code = cli.run(args("remove", scope=FLEX), world)
    assert code == 0
    puts = world.recorder.puts()
    assert len(puts) == 10  # the Flexible set's members only, by its id
    script = puts[0][1]["properties"]["source"]["script"]
    assert script.startswith("#!/bin/sh\n# Takes the Scheduled Events relay off this VM")
    deletes = [p for m, p, _ in world.recorder.requests if m == "DELETE"]
    assert len(deletes) == 10 and world.recorder.commands == {}
    assert len(world.rows.forgotten) == 10


def test_versions_shows_the_fleet_and_changes_nothing(world, capsys) -> None:
    assert cli.run(args("versions", scope=UNIFORM), world) == 0
    out = capsys.readouterr().out
    assert "20 Linux VM(s) in scope" in out
    assert world.recorder.puts() == []


def test_a_bad_scope_or_package_is_a_clear_error(world, capsys) -> None:
    assert cli.run(args("rollout", scope="/subscriptions/x';drop", version="1"), world) == 2
    assert "is not /subscriptions/ID" in capsys.readouterr().err
    assert cli.run(args("rollout", version="0.2.0", package="http://x/relay.pyz"), world) == 2
    assert "https://...#sha256=HEX or embedded" in capsys.readouterr().err
    assert world.recorder.puts() == []


def test_requests_use_the_specs_api_version_and_arms_bearer_token(world) -> None:
    assert API_VERSION == "2024-11-01"
    assert cli.run(args("rollout", version="0.2.0", package=V2, scope=RG), world) == 0
    assert world.recorder.refusals == []
