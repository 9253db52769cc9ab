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


def _drain_output(**params: object) -> object:
    from tests.infra.bicep import INFRA, Template
    from tests.infra.bicep_evaluator import Evaluator

    main = Template.load(INFRA / "main.bicep")
    defaults = {"drainHttpUrl": "", "drainRelayHook": "", "relayReadyPort": 8493}
    return Evaluator(main, {**defaults, **params}).eval(main.outputs["drain"]["value"])


def test_the_drain_output_says_which_drain_applies() -> None:
    """Issue 38: the deploy says which drain a `drain` decision runs. With the README's
    exports (no drain step set), the relays' readiness probe; a step of the operator's wins
    where it applies (functions/terminate/plan.py); with the probe off too, nothing, said so."""
    default = _drain_output()
    assert str(default).startswith(
        "readiness (the default): on each VM a load balancer probes (its relay reports the "
        "Azure probes), the /readyz probe of its relay (port 8493) answers 503"
    )
    # Issue 44: only where a load balancer probes; elsewhere no drain, said so.
    assert str(default).endswith(
        "a VM no load balancer probes has no drain (a Platform event or a scale-in held until "
        "NotBefore, a User Reboot or Redeploy approved at once)"
    )
    hook = str(_drain_output(drainRelayHook="drain"))
    assert hook == "relay hook drain on each VM; the readiness probe where a relay lacks it"
    http = str(_drain_output(drainHttpUrl="https://x/drain", drainRelayHook="drain"))
    assert http == "HTTP hook DRAIN__HTTP_URL, then the relay hook drain"
    assert str(_drain_output(relayReadyPort=0)).startswith("NONE: no drain step")
    assert str(_drain_output(relayReadyPort=0, drainRelayHook="d")) == "relay hook d on each VM"
    outputs = load("main").outputs
    assert outputs["drain"]["value"] == "drainSummary"
    assert "readinessProbe" in outputs


def test_the_app_drains_through_the_probe_only_where_relays_serve_it() -> None:
    """DRAIN__READINESS follows relayReadyPort: with the probe off on the relays, the app
    must not plan a drain through it (it would fail on every VM), and the drain output says
    NONE instead."""
    from tests.infra.bicep import module_params

    main = load("main")
    assert module_params(main, "functionApp")["relayReadyPort"] == "relayReadyPort"
    settings = load("functionapp").variables["drainBaseSettings"]["DRAIN__READINESS"]
    ternary = settings["operator"]["operands"]
    assert (ternary["true_value"], ternary["false_value"]) == ("true", "false")
    assert ternary["condition"]["operator"]["operands"] == {
        "operand_1": "relayReadyPort",
        "operand_2": 0,
    }
