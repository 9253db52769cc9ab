"""The run command requests are the ones Azure documents: held to
Azure/azure-rest-api-specs, specification/compute/resource-manager/Microsoft.Compute/
ComputeRP/stable/2024-11-01/runCommand.json @ 05b997f68b4a1377dff93ececf55cf76cb13c9e8
and its examples VirtualMachineRunCommand_CreateOrUpdate.json @ da3b89e4 and
VirtualMachineScaleSetVMRunCommand_CreateOrUpdate.json @ 2af25c7f (copied in
tests/conformance/samples/, SOURCES.md there)."""

from __future__ import annotations

import json
from pathlib import Path

from functions.rollout.arm import API_VERSION, RunCommands
from functions.rollout.run import RUN_COMMAND, Action
from functions.rollout.targets import Target
from tests.rollout.arm_recorder import check_body

SAMPLES = Path(__file__).resolve().parents[1] / "conformance" / "samples"
VM_PATH = (
    "/subscriptions/{subscriptionId}/resourceGroups/{resourceGroupName}/providers/"
    "Microsoft.Compute/virtualMachines/{vmName}/runCommands/{runCommandName}"
)
VMSS_VM_PATH = (
    "/subscriptions/{subscriptionId}/resourceGroups/{resourceGroupName}/providers/"
    "Microsoft.Compute/virtualMachineScaleSets/{vmScaleSetName}/virtualMachines/{instanceId}/"
    "runCommands/{runCommandName}"
)


def _example(name: str) -> dict:
    return json.loads((SAMPLES / f"{name}.2024-11-01.json").read_text())


def _fill(template: str, params: dict) -> str:
    for key, value in params.items():
        template = template.replace("{" + key + "}", str(value))
    return template


def test_the_recorder_accepts_the_specs_own_examples() -> None:
    for name in (
        "VirtualMachineRunCommand_CreateOrUpdate",
        "VirtualMachineScaleSetVMRunCommand_CreateOrUpdate",
    ):
        params = _example(name)["parameters"]
        assert params["api-version"] == API_VERSION
        assert check_body(params["runCommand"]) is None


def test_the_paths_are_the_specs_for_a_vm_and_a_uniform_instance() -> None:
    arm = RunCommands(session=None, credential=None, endpoint="https://management.azure.com")  # type: ignore[arg-type]
    for name, template in (
        ("VirtualMachineRunCommand_CreateOrUpdate", VM_PATH),
        ("VirtualMachineScaleSetVMRunCommand_CreateOrUpdate", VMSS_VM_PATH),
    ):
        params = _example(name)["parameters"]
        expected = _fill(template, params)
        parent = expected.rsplit("/runCommands/", 1)[0]
        url = arm.url(parent, params["runCommandName"])
        assert url == "https://management.azure.com" + expected


def test_the_body_is_a_virtual_machine_run_command() -> None:
    target = Target(
        id="/subscriptions/s/resourceGroups/rg/providers/Microsoft.Compute/virtualMachines/vm1",
        name="vm1",
        vm_id="00000000-0000-0000-0000-000000000001",
        location="westeurope",
        subscription="s",
        resource_group="rg",
    )
    body = Action("rollout", "#!/bin/sh\necho hi\n", "0.2.0", "embedded").body(target, "r1")
    assert check_body(body) is None
    example = _example("VirtualMachineRunCommand_CreateOrUpdate")["parameters"]["runCommand"]
    assert set(body["properties"]) <= set(example["properties"]) | {"source", "parameters"}
    # Linux: named parameters reach the script as environment variables (Learn, managed
    # Run Command): the prologue reads RELAY_PACKAGE; none is nameless.
    assert {p["name"] for p in body["properties"]["parameters"]} == {"ROLLOUT_ID", "RELAY_PACKAGE"}
    assert RUN_COMMAND == "scheduled-events-relay"
