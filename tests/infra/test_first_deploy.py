"""Issue #23's first review: what failed a first (or a second) deployment, stated as data."""

from __future__ import annotations

from tests.infra.bicep import INFRA, load, module_params, parse_bicepparam
from tests.infra.bicep_evaluator import Evaluator


def test_the_ssh_key_is_asked_for_only_when_an_example_is_deployed() -> None:
    """Issue 38: SSH_PUBLIC_KEY was required even with the examples off. Now the key is
    optional, and with an example on, a module of nothing but the key (no dependency to
    wait for) refuses an empty one, naming it, instead of the example failing last."""
    main = load("main")
    assert main.params["adminSshPublicKey"]["default"] == ""
    assert main.decorator("adminSshPublicKey", "min_length") is None
    config = main.modules["exampleSshKey"]["config"]
    assert config["condition"] == {
        "operator": {
            "type": "or",
            "operands": {"operand_1": "deployExampleScaleSet", "operand_2": "deployExampleVm"},
        }
    }
    assert config["config"]["params"] == {"adminSshPublicKey": "adminSshPublicKey"}
    assert "dependsOn" not in config["config"]
    check = load("example-ssh-key")
    assert check.decorator("adminSshPublicKey", "min_length") == 1
    assert check.params["adminSshPublicKey"]["default"] is None
    assert "SSH_PUBLIC_KEY" in check.decorator("adminSshPublicKey", "description")
    for module in ("vmss-relay", "vm-relay"):
        assert load(module).decorator("adminSshPublicKey", "min_length") == 1
    # The worked example reads it with a default: unset, only an example asks for it.
    func = parse_bicepparam(INFRA / "main.bicepparam")["adminSshPublicKey"]["function"]
    assert func == {
        "type": "readEnvironmentVariable",
        "parameters": {"arg_1": "SSH_PUBLIC_KEY", "arg_2": ""},
    }


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
