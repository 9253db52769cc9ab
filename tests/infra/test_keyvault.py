"""Key Vault: RBAC mode, recoverable, secrets only when given, all secret inputs @secure."""

from __future__ import annotations

from tests.infra.bicep import dotted, load, module_params

KV = load("keyvault")
SECRET_PARAMS = (
    "appSecret",
    "pagerdutyRoutingKey",
    "teamsWebhookUrl",
    "slackWebhookUrl",
    "webhookUrl",
    "webhookSecret",
    "appSecretPrevious",
    "webhookSecretPrevious",
)


def test_vault_is_rbac_soft_delete_purge_protected() -> None:
    (vault,) = KV.resources("Microsoft.KeyVault/vaults")
    props = vault.body["properties"]
    assert props["enableRbacAuthorization"] is True
    assert props["enableSoftDelete"] is True
    assert props["enablePurgeProtection"] is True
    assert props["softDeleteRetentionInDays"] >= 7
    assert "accessPolicies" not in props
    acls = props["networkAcls"]
    assert acls["defaultAction"] == "networkDefaultAction"
    assert KV.param_default("networkDefaultAction") == "Deny"
    main = load("main")
    assert module_params(main, "keyVault")["networkDefaultAction"] == "keyVaultNetworkDefaultAction"
    assert main.param_default("keyVaultNetworkDefaultAction") == "Deny"


def test_secret_inputs_are_secure_everywhere() -> None:
    main = load("main")
    for name in SECRET_PARAMS:
        assert KV.decorator(name, "secure"), f"keyvault.{name}"
        assert main.decorator(name, "secure"), f"main.{name}"
    assert KV.decorator("appSecret", "min_length") >= 32
    assert main.decorator("appSecret", "min_length") >= 32
    assert KV.params["appSecret"]["default"] is None
    assert main.params["appSecret"]["default"] is None
    # No shared relay key any more (contract §4): no parameter, secret or output for one.
    for template in (KV, main):
        assert not {n for n in template.params if "relaykey" in n.lower()}, template.path.name
        assert not {n for n in template.outputs if "relaykey" in n.lower()}, template.path.name
    for name in SECRET_PARAMS[1:]:
        assert KV.param_default(name) == ""


def test_each_secret_is_created_only_when_given() -> None:
    secrets = {
        r.symbol: r for r in KV.resources("Microsoft.KeyVault/vaults/secrets") if not r.existing
    }
    assert len(secrets) == 8
    by_value = {r.body["properties"]["value"]: r for r in secrets.values()}
    assert set(by_value) == set(SECRET_PARAMS)
    assert by_value["appSecret"].condition is None  # always: the app opens its stored keys with it
    for name in SECRET_PARAMS[1:]:
        condition = by_value[name].condition
        assert condition == {
            "operator": {
                "type": "not",
                "operands": {
                    "bool_value": {
                        "function": {"type": "empty", "parameters": {"item_to_test": name}}
                    }
                },
            }
        }, name
    for secret in secrets.values():
        assert secret.body["properties"]["contentType"].startswith("text/")
        assert dotted(secret.body["name"]).startswith("names.")


def test_has_flags_match_the_secret_conditions() -> None:
    for flag, param in (
        ("hasPagerduty", "pagerdutyRoutingKey"),
        ("hasTeams", "teamsWebhookUrl"),
        ("hasSlack", "slackWebhookUrl"),
        ("hasWebhookUrl", "webhookUrl"),
        ("hasWebhookSecret", "webhookSecret"),
        ("hasAppSecretPrevious", "appSecretPrevious"),
        ("hasWebhookSecretPrevious", "webhookSecretPrevious"),
    ):
        value = KV.outputs[flag]["value"]
        assert value["operator"]["operands"]["bool_value"]["function"]["parameters"] == {
            "item_to_test": param
        }


def _secret_uses(node, secrets):
    """Secret params a value exposes; `empty(secret)` only tells whether one is set."""
    if isinstance(node, str):
        return {node} & secrets
    if isinstance(node, dict):
        if node.get("function", {}).get("type") == "empty":
            return set()
        return set().union(*(_secret_uses(v, secrets) for v in node.values()))
    if isinstance(node, list):
        return set().union(*(_secret_uses(v, secrets) for v in node))
    return set()


def test_no_secret_value_is_output() -> None:
    assert _secret_uses({"a": ["appSecret"]}, set(SECRET_PARAMS)) == {"appSecret"}
    for template in (KV, load("main")):
        for name, output in template.outputs.items():
            used = _secret_uses(output["value"], set(SECRET_PARAMS))
            assert not used, f"{template.path.name} output {name} exposes {used}"


def test_only_the_function_subnet_passes_the_vault_firewall() -> None:
    """Relays read nothing in the vault any more: their subnet is not let through."""
    main = load("main")
    subnets = module_params(main, "keyVault")["allowedSubnetIds"]
    assert [dotted(s) for s in subnets] == ["network.outputs.functionSubnetId"]
    assert "existingVmSubnetHasKeyVaultEndpoint" not in main.params
    assert "relayPrincipalId" not in KV.params
