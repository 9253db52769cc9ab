"""main.bicep outputs the names an operator needs next (publish, relay setup, rotation)."""

from __future__ import annotations

from tests.infra.bicep import dotted, load


def test_outputs_for_the_next_steps() -> None:
    outputs = load("main").outputs
    expected = {
        "functionAppName": "functionApp.outputs.name",
        "serviceBusFullyQualifiedNamespace": "serviceBus.outputs.fullyQualifiedNamespace",
        "documentsQueue": "serviceBus.outputs.queueName",
        "keyVaultName": "keyVault.outputs.vaultName",
        "relayIdentityId": "relayIdentity.id",
        "relayIdentityClientId": "relayIdentity.properties.clientId",
        "vmSubnetId": "network.outputs.vmSubnetId",
    }
    for name, source in expected.items():
        assert dotted(outputs[name]["value"]) == source, name
    assert outputs["relayCallbackPort"]["value"] == "relayCallbackPort"
    assert outputs["relayForward"]["value"].startswith("servicebus://")
    # No shared relay key any more: nothing about one is output.
    assert not {name for name in outputs if "relaykey" in name.lower() or "secret" in name.lower()}
    assert dotted(outputs["relayHeartbeatTable"]["value"]) == "storage.outputs.livenessTableUrl"


def test_outputs_are_not_marked_or_typed_as_secrets() -> None:
    for name, output in load("main").outputs.items():
        assert output["type"] in {"string", "int"}, name
        assert not any(d["type"] == "secure" for d in output["decorators"]), name
