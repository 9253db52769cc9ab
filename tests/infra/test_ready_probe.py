"""The load balancer example of issue 33 probes what the relay serves: `Http` on the
relays' ready port, path relay.ready.PATH, and the README shows the same probe."""

from __future__ import annotations

import re

from relay.ready import PATH
from tests.infra.bicep import INFRA, dotted, load, module_params

RELAY_README = INFRA.parent / "relay" / "README.md"
DOCUMENTED_PORT = 8493  # RELAY_READY_LISTEN=0.0.0.0:8493 in relay/README.md and README.md


def test_the_probe_is_the_relays_readiness_path_and_port() -> None:
    template = load("relay-ready-lb")
    [balancer] = template.resources("Microsoft.Network/loadBalancers")
    [probe] = balancer.body["properties"]["probes"]
    settings = probe["properties"]
    assert settings["protocol"] == "Http"
    assert settings["requestPath"] == PATH == "/readyz"
    assert settings["port"] == "readyPort"
    assert template.param_default("readyPort") == DOCUMENTED_PORT
    assert settings["probeThreshold"] == settings["numberOfProbes"] == "probeThreshold"
    [rule] = balancer.body["properties"]["loadBalancingRules"]
    used = rule["properties"]["probe"]["id"]["function"]["parameters"]
    assert used["resource_type"] == "Microsoft.Network/loadBalancers/probes"
    assert used["resource_name_2"] == probe["name"] == "probeName"  # the rule uses this probe
    assert template.variables["probeName"] == "relay-readyz"
    assert balancer.body["sku"]["name"] == "Standard"


def test_the_readme_shows_the_probe_the_module_declares() -> None:
    text = RELAY_README.read_text()
    [snippet] = re.findall(r"```bicep\n(.*?)```", text, re.S)
    assert f"requestPath: '{PATH}'" in snippet
    assert "protocol: 'Http'" in snippet
    module = (INFRA / "modules" / "relay-ready-lb.bicep").read_text()
    for line in ("requestPath: '/readyz'", "protocol: 'Http'", "port: readyPort"):
        assert line in module and line in snippet, line
    assert f"RELAY_READY_LISTEN=0.0.0.0:{DOCUMENTED_PORT}" in text
    assert "168.63.129.16" in text


def test_the_example_scale_set_sits_behind_a_load_balancer_probing_the_relays() -> None:
    """Issue 38: relay-ready-lb.bicep was an example nobody deployed. main.bicep now puts the
    example scale set behind it (whenever the set is deployed with the probe on): the
    balancer probes each relay's /readyz on relayReadyPort, and the set's NICs are in its
    pool, so a drain takes an instance out of rotation before Azure deletes it."""
    main = load("main")
    config = main.modules["exampleLoadBalancer"]["config"]
    assert config["condition"] == "exampleBehindLoadBalancer"
    condition = main.variables["exampleBehindLoadBalancer"]["operator"]
    assert condition["type"] == "and"
    assert condition["operands"]["operand_1"] == "deployExampleScaleSet"
    assert condition["operands"]["operand_2"]["operator"]["operands"]["operand_1"] == (
        "relayReadyPort"
    )
    assert module_params(main, "exampleLoadBalancer")["readyPort"] == "relayReadyPort"
    assert main.param_default("relayReadyPort") == DOCUMENTED_PORT
    pool = module_params(main, "exampleScaleSet")["loadBalancerBackendPoolId"]
    chosen = pool["operator"]["operands"]
    assert chosen["condition"] == "exampleBehindLoadBalancer"
    assert dotted(chosen["true_value"]) == "exampleLoadBalancer.outputs.backendPoolId"
    vmss = load("vmss-relay")
    [scale_set] = vmss.resources("Microsoft.Compute/virtualMachineScaleSets")
    [nic] = scale_set.body["properties"]["virtualMachineProfile"]["networkProfile"][
        "networkInterfaceConfigurations"
    ]
    [ip] = nic["properties"]["ipConfigurations"]
    pools = ip["properties"]["loadBalancerBackendAddressPools"]["operator"]["operands"]
    assert pools["true_value"] == [] and pools["false_value"] == "backendPool"
    assert vmss.variables["backendPool"] == [{"id": "loadBalancerBackendPoolId"}]
