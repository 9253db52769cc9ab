"""The example scale set and VM: relay identity, SSH only, Terminate notifications in range."""

from __future__ import annotations

import pytest

from tests.infra.bicep import dotted, iso_minutes, load, module_params

VMSS = load("vmss-relay")
VM = load("vm-relay")


def _scale_set():
    (ss,) = VMSS.resources("Microsoft.Compute/virtualMachineScaleSets")
    return ss


def test_terminate_notification_enabled_with_timeout_in_range() -> None:
    profile = _scale_set().body["properties"]["virtualMachineProfile"]["scheduledEventsProfile"]
    terminate = profile["terminateNotificationProfile"]
    assert terminate["enable"] is True
    param = terminate["notBeforeTimeout"]
    assert param == "terminateNotBeforeTimeout"
    allowed = VMSS.decorator(param, "allowed")
    assert allowed, "notBeforeTimeout must be restricted with @allowed"
    for value in [VMSS.param_default(param), *allowed]:
        assert 5 <= iso_minutes(value) <= 15, value


def test_main_passes_a_checked_timeout() -> None:
    main = load("main")
    assert module_params(main, "exampleScaleSet")["terminateNotBeforeTimeout"] == (
        "terminateNotBeforeTimeout"
    )
    allowed = main.decorator("terminateNotBeforeTimeout", "allowed")
    assert allowed and set(allowed) <= set(VMSS.decorator("terminateNotBeforeTimeout", "allowed"))
    assert 5 <= iso_minutes(main.param_default("terminateNotBeforeTimeout")) <= 15


@pytest.mark.parametrize("duration", ["PT4M", "PT16M", "PT1H", "P1D", "PT0M"])
def test_out_of_range_timeouts_are_not_allowed(duration) -> None:
    assert duration not in VMSS.decorator("terminateNotBeforeTimeout", "allowed")
    assert duration not in load("main").decorator("terminateNotBeforeTimeout", "allowed")


def test_the_single_vm_has_no_terminate_profile() -> None:
    assert "scheduledEventsProfile" not in str(VM.tree)


@pytest.mark.parametrize(
    ("template", "type_"),
    [
        (VMSS, "Microsoft.Compute/virtualMachineScaleSets"),
        (VM, "Microsoft.Compute/virtualMachines"),
    ],
    ids=["vmss", "vm"],
)
def test_relay_identity_ssh_keys_and_cloud_init(template, type_) -> None:
    (machine,) = template.resources(type_)
    identity = machine.body["identity"]
    assert identity["type"] == "UserAssigned"
    assert list(identity["userAssignedIdentities"]) == ["'${relayIdentityId}'"]
    props = machine.body["properties"]
    os_profile = props.get("osProfile") or props["virtualMachineProfile"]["osProfile"]
    assert os_profile["linuxConfiguration"]["disablePasswordAuthentication"] is True
    assert "adminPassword" not in os_profile
    assert os_profile["customData"] == {
        "function": {"type": "base64", "parameters": {"input_string": "customData"}}
    }
    assert template.decorator("adminSshPublicKey", "secure") is None  # a public key


def test_example_machines_sit_on_the_vm_subnet_without_public_ips() -> None:
    main = load("main")
    for symbol in ("exampleScaleSet", "exampleVm"):
        params = module_params(main, symbol)
        assert dotted(params["subnetId"]) == "network.outputs.vmSubnetId"
        assert params["customData"] == "relayCloudInit"
    for template in (VMSS, VM):
        assert "publicIPAddress" not in str(template.tree)
        assert not template.resources("Microsoft.Network/publicIPAddresses")


def test_examples_are_opt_in() -> None:
    main = load("main")
    assert main.param_default("deployExampleScaleSet") is False
    assert main.param_default("deployExampleVm") is False
    assert main.modules["exampleScaleSet"]["config"]["condition"] == "deployExampleScaleSet"
    assert main.modules["exampleVm"]["config"]["condition"] == "deployExampleVm"
