"""Issue #23's first review: what failed a first (or a second) deployment, stated as data."""

from __future__ import annotations

from tests.infra.bicep import INFRA, load, module_params, parse_bicepparam
from tests.infra.schema_check import Evaluator


def test_ssh_key_is_required_and_the_example_reads_it_without_a_fallback() -> None:
    main = load("main")
    assert main.params["adminSshPublicKey"]["default"] is None
    assert main.decorator("adminSshPublicKey", "min_length") == 1
    value = parse_bicepparam(INFRA / "main.bicepparam")["adminSshPublicKey"]
    func = value["function"]
    assert func["type"] == "readEnvironmentVariable"
    # One argument: an unset SSH_PUBLIC_KEY fails the parameter file, before anything deploys.
    assert func["parameters"] == {"arg_1": "SSH_PUBLIC_KEY"}


def test_custom_role_names_are_unique_per_subscription_and_group() -> None:
    # Role names are unique in a tenant: the group's name alone collides across subscriptions.
    for module, symbol in (("eventgrid", "acknowledgeRole"), ("storage", "heartbeatWriterRole")):
        role = load(module).resource(symbol).body["properties"]
        assert "${uniqueString(resourceGroup().id)}" in role["roleName"], module


def test_key_vault_name_can_move_off_a_soft_deleted_vault_or_recover_it() -> None:
    main = load("main")
    names = main.tree["variables"]["names"]["value"]
    assert main.param_default("keyVaultNameSeed") == ""
    assert main.param_default("keyVaultCreateMode") == "default"
    assert module_params(main, "keyVault")["createMode"] == "keyVaultCreateMode"
    kv = load("keyvault")
    assert kv.resource("vault").body["properties"]["createMode"] == "createMode"
    assert set(kv.decorator("createMode", "allowed")) == {"default", "recover"}

    def name(seed: str) -> object:
        evaluator = Evaluator(main, {"prefix": "sebridge", "keyVaultNameSeed": seed})
        return evaluator.eval(names["keyVault"])

    # Unknown offline (uniqueString), but an empty seed keeps the name of existing deployments:
    # the expression is the old one in its empty-seed arm.
    text = (INFRA / "main.bicep").read_text()
    assert "empty(keyVaultNameSeed) ? suffix : uniqueString(" in text
    assert name("") is not None
