"""The relay callback port is reachable from the function subnet and from nothing else."""

from __future__ import annotations

import ipaddress

from tests.infra.bicep import dotted, load, module_params

NET = load("network")
DEFAULT_ALLOW_VNET_PRIORITY = 65000  # AllowVnetInBound


def _rules() -> list[dict]:
    return NET.variables["callbackRules"]


def _covers_port(rule: dict, port_expr: str) -> bool:
    props = rule["properties"]
    ranges = [props.get("destinationPortRange"), *(props.get("destinationPortRanges") or [])]
    return any(r in ("*", port_expr) for r in ranges if r is not None)


PORT = {"function": {"type": "string", "parameters": {"value_to_convert": "callbackPort"}}}


def test_callback_rules_allow_only_the_function_subnet() -> None:
    rules = _rules()
    on_port = [r for r in rules if _covers_port(r, PORT)]
    allows = [r for r in on_port if r["properties"]["access"] == "Allow"]
    denies = [r for r in on_port if r["properties"]["access"] == "Deny"]
    assert len(allows) == 1 and len(denies) == 1
    allow, deny = allows[0]["properties"], denies[0]["properties"]
    assert allow["direction"] == deny["direction"] == "Inbound"
    assert allow["sourceAddressPrefix"] == "functionSubnetPrefix"
    assert "sourceAddressPrefixes" not in allow
    assert allow["protocol"] == "Tcp"
    assert deny["sourceAddressPrefix"] == "*"
    assert deny["protocol"] == "*"
    assert deny["destinationAddressPrefix"] == "*"
    # Evaluated in priority order: allow first, then deny, both before AllowVnetInBound.
    assert allow["priority"] < deny["priority"] < DEFAULT_ALLOW_VNET_PRIORITY


def test_callback_port_default_is_8492_everywhere() -> None:
    main = load("main")
    assert NET.param_default("callbackPort") == 8492
    assert main.param_default("relayCallbackPort") == 8492
    assert module_params(main, "network")["callbackPort"] == "relayCallbackPort"


def test_new_nsg_carries_the_rules_and_sits_on_the_vm_subnet() -> None:
    nsg = NET.resource("nsg")
    rules = nsg.body["properties"]["securityRules"]["operator"]["operands"]
    assert rules["false_value"] == "callbackRules"  # no readiness probe: the callback's two
    assert rules["true_value"]["function"]["parameters"] == {
        "arg_1": "callbackRules",
        "arg_2": "readyRules",
    }
    assert rules["condition"]["operator"]["operands"]["operand_1"] == "readyPort"
    vnet = NET.resource("vnet")
    vm_subnet, fn_subnet = vnet.body["properties"]["subnets"]
    assert vm_subnet["name"] == "vmSubnetName"
    assert vm_subnet["properties"]["networkSecurityGroup"]["id"] == "nsgId"
    ours_or_yours = NET.variables["nsgId"]["operator"]["operands"]
    assert dotted(ours_or_yours["true_value"]) == "nsg.id"
    assert dotted(ours_or_yours["false_value"]) == "existingNsg.id"
    assert fn_subnet["name"] == "functionSubnetName"
    assert fn_subnet["properties"]["addressPrefix"] == "functionSubnetPrefix"


def test_existing_nsg_gets_the_same_rules() -> None:
    added = NET.resources("Microsoft.Network/networkSecurityGroups/securityRules")
    assert len(added) == len(_rules()) == 2
    used = sorted(dotted(r.body["properties"]) for r in added)
    assert used == ["callbackRules[0].properties", "callbackRules[1].properties"]
    for rule in added:
        assert rule.body["parent"] == "existingNsg"


def test_function_subnet_is_delegated_to_flex_in_both_modes() -> None:
    delegations = NET.variables["flexDelegation"]
    assert [d["properties"]["serviceName"] for d in delegations] == ["Microsoft.App/environments"]
    vnet = NET.resource("vnet")
    assert vnet.body["properties"]["subnets"][1]["properties"]["delegations"] == "flexDelegation"
    added = NET.resource("addedFunctionSubnet")
    assert added.body["properties"]["delegations"] == "flexDelegation"
    assert added.body["properties"]["addressPrefix"] == "functionSubnetPrefix"


def test_default_prefixes_nest_and_do_not_overlap() -> None:
    main = load("main")
    vnet = ipaddress.ip_network(main.param_default("vnetAddressPrefix"))
    vm = ipaddress.ip_network(main.param_default("vmSubnetPrefix"))
    fn = ipaddress.ip_network(main.param_default("functionSubnetPrefix"))
    assert vm.subnet_of(vnet) and fn.subnet_of(vnet)
    assert not vm.overlaps(fn)
    for name in ("addressPrefix", "vmSubnetPrefix", "functionSubnetPrefix"):
        assert ipaddress.ip_network(NET.param_default(name))
    assert NET.param_default("functionSubnetPrefix") == main.param_default("functionSubnetPrefix")


def test_new_subnets_get_explicit_outbound_through_a_nat_gateway() -> None:
    vnet = NET.resource("vnet")
    for subnet in vnet.body["properties"]["subnets"]:
        assert subnet["properties"]["natGateway"] == "natGatewayRef"
    ref = NET.variables["natGatewayRef"]["operator"]["operands"]
    assert ref["condition"] == "natGatewayEnabled"
    assert dotted(ref["true_value"]["id"]) == "natGateway.id"
    assert NET.param_default("createNatGateway") is True
    assert load("main").param_default("createNatGateway") is True


def test_the_readiness_port_is_open_to_the_load_balancers_probes_only() -> None:
    """Issue 38: every relay now serves /readyz (port 8493 by default, relayReadyPort). In
    the NSG the template creates, Azure Load Balancer's probes (service tag
    AzureLoadBalancer, 168.63.129.16) may reach it; every other source is denied, before
    AllowVnetInBound, so nothing else in the VNet polls a VM's drain state."""
    allow, deny = NET.variables["readyRules"]
    for rule in (allow, deny):
        assert rule["properties"]["destinationPortRange"]["function"]["parameters"] == {
            "value_to_convert": "readyPort"
        }
        assert rule["properties"]["direction"] == "Inbound"
    assert allow["properties"]["access"] == "Allow"
    assert allow["properties"]["sourceAddressPrefix"] == "AzureLoadBalancer"
    assert (
        deny["properties"]["access"] == "Deny" and deny["properties"]["sourceAddressPrefix"] == "*"
    )
    callback = max(r["properties"]["priority"] for r in _rules())
    assert callback < allow["properties"]["priority"] < deny["properties"]["priority"]
    assert deny["properties"]["priority"] < DEFAULT_ALLOW_VNET_PRIORITY
    assert module_params(load("main"), "network")["readyPort"] == "relayReadyPort"
