"""The app settings the template writes are the ones the function app reads.

Evaluates the template's settings with sample parameter values (Key Vault references
resolved to sample secrets, as the platform does) and loads them with the app's own
pydantic settings models.
"""

from __future__ import annotations

import json
import re

import pytest

from tests.infra.bicep import load
from tests.infra.test_functionapp import FN

SAMPLE = {
    "identityClientId": "11111111-1111-1111-1111-111111111111",
    "storageAccountName": "stsebridgeabc",
    "serviceBusFullyQualifiedNamespace": "sb-sebridge-abc.servicebus.windows.net",
    "appInsightsConnectionString": "InstrumentationKey=0;IngestionEndpoint=https://x/",
    "keyVaultUri": "https://kv-sebridge-abc.vault.azure.net/",
    "name": "func-sebridge-abc",
    # Every optional channel secret given, so each reference is exercised.
    "hasPagerduty": True,
    "hasTeams": True,
    "hasSlack": True,
    "hasWebhookUrl": True,
    "hasWebhookSecret": True,
    "hasAppSecretPrevious": True,
    "hasWebhookSecretPrevious": True,
}
SECRETS = {
    "app-secret": "a" * 64,
    "pagerduty-routing-key": "R" * 32,
    "teams-webhook-url": "https://example.org/teams",
    "slack-webhook-url": "https://hooks.slack.com/services/T0/B0/x",
    "webhook-url": "https://example.org/hook",
    "webhook-secret": "s" * 32,
    "app-secret-previous": "p" * 64,
    "webhook-secret-previous": "q" * 32,
}


def _value(node):
    """Evaluate one setting value with parameter defaults and SAMPLE."""
    params = FN.params
    if isinstance(node, int):
        return node
    if isinstance(node, str):
        if node in SAMPLE:
            return SAMPLE[node]
        if node in params:
            return params[node]["default"]
        return re.sub(r"\$\{([\w.]+)\}", lambda m: str(_ref(m.group(1))), node)
    if isinstance(node, dict) and "function" in node:
        func = node["function"]
        if func["type"] == "join":
            params = func["parameters"]
            return params["delimiter"].join(_value(params["input_array"]))
        (arg,) = func["parameters"].values()
        value = _value(arg)
        if func["type"] == "empty":
            return not value
        assert func["type"] == "string", func
        return json.dumps(value) if isinstance(value, (list, dict)) else str(value)
    if isinstance(node, dict) and "operator" in node:
        ops = node["operator"]["operands"]
        if node["operator"]["type"] == "greater_than":
            return _value(ops["operand_1"]) > _value(ops["operand_2"])
        return _value(ops["true_value"] if _value(ops["condition"]) else ops["false_value"])
    raise AssertionError(node)


def _ref(path: str):
    head, *rest = path.split(".")
    if head == "secretNames":
        return load("keyvault").variables["names"][rest[0]]
    if head in FN.variables and isinstance(FN.variables[head], str):
        return _value(FN.variables[head])
    return _value(head)


def _resolve_key_vault(value: str) -> str:
    m = re.fullmatch(
        r"@Microsoft\.KeyVault\(SecretUri=https://[\w-]+\.vault\.azure\.net/secrets/([\w-]+)\)",
        value,
    )
    return SECRETS[m.group(1)] if m else value


def _objects(node):
    """The settings objects `appSettings` really merges, conditionals decided."""
    if isinstance(node, str):
        yield from _objects(FN.variables[node])
    elif "function" in node:
        assert node["function"]["type"] == "union"
        for arg in node["function"]["parameters"].values():
            yield from _objects(arg)
    elif "operator" in node:
        ops = node["operator"]["operands"]
        yield from _objects(ops["true_value"] if _value(ops["condition"]) else ops["false_value"])
    else:
        yield node


def app_settings() -> dict[str, str]:
    merged = {}
    for obj in _objects("appSettings"):
        for name, node in obj.items():
            merged[name] = _value(node)
    return merged


@pytest.fixture
def app_env(monkeypatch):
    env = {name: _resolve_key_vault(value) for name, value in app_settings().items()}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return env


def test_key_vault_references_are_well_formed(app_env) -> None:
    refs = {n: v for n, v in app_settings().items() if v.startswith("@Microsoft.KeyVault")}
    assert set(refs) == {
        "APP_SECRET",
        "PAGERDUTY_ROUTING_KEY",
        "TEAMS_WEBHOOK_URL",
        "SLACK_WEBHOOK_URL",
        "WEBHOOK_URL",
        "WEBHOOK_SECRET",
        "APP_SECRET_PREVIOUS",
        "WEBHOOK_SECRET_PREVIOUS",
    }
    for name, value in refs.items():
        assert value.startswith(
            "@Microsoft.KeyVault(SecretUri=https://kv-sebridge-abc.vault.azure.net/secrets/"
        )
        assert app_env[name] in SECRETS.values(), name


def test_the_function_settings_model_reads_them(app_env) -> None:
    from functions.settings import Settings

    s = Settings()
    assert s.service_bus_namespace == SAMPLE["serviceBusFullyQualifiedNamespace"]
    assert s.state_storage_account == SAMPLE["storageAccountName"]
    assert s.webjobs_storage_account == SAMPLE["storageAccountName"]
    assert s.service_bus_connection is None and s.state_storage is None
    # The shared relay key is gone (contract §4, §6): no setting reads it.
    assert "relay_key" not in type(s).model_fields
    assert s.app_secret is not None
    assert s.app_secret.get_secret_value() == SECRETS["app-secret"]
    assert s.relay_callback_port == 8492
    assert app_env["RELAY_CALLBACK_PORT"] == "8492"
    assert s.documents_queue == "documents"
    assert s.heartbeats_queue == "heartbeats"
    assert s.retention_days == 30
    assert s.notifications_topic == "notifications"
    # No PUBLIC_BASE_URL by default: the app takes its real host name from WEBSITE_HOSTNAME.
    assert s.public_base_url is None


def test_the_policy_defaults_are_the_reference_policy(app_env) -> None:
    from functions.model.policy import PolicySettings, default_rules, load_policy

    policy = PolicySettings()
    assert policy.rules == tuple(default_rules())
    assert policy.dry_run is False
    assert policy.windows == ()
    assert policy.timezone == "UTC"
    assert policy.max_concurrent_per_set == 1
    assert load_policy().error is None
    assert "POLICY__RULES" not in app_env


def test_channels_stay_off_when_their_secret_is_not_given(monkeypatch) -> None:
    for flag in ("hasPagerduty", "hasTeams", "hasWebhookUrl", "hasWebhookSecret"):
        monkeypatch.delitem(SAMPLE, flag)
    names = set(app_settings())
    assert not names & {"PAGERDUTY_ROUTING_KEY", "TEAMS_WEBHOOK_URL", "WEBHOOK_URL"}
    assert "APP_SECRET" in names


def test_undrain_settings_reach_their_model(monkeypatch) -> None:
    from functions.terminate.workflow import UndrainSettings

    monkeypatch.setitem(SAMPLE, "undrainHttpUrl", "https://drain.example.org/undrain")
    monkeypatch.setitem(SAMPLE, "undrainRelayHook", "undrain")
    for name, value in app_settings().items():
        monkeypatch.setenv(name, _resolve_key_vault(value))
    undrain = UndrainSettings()
    assert (undrain.http_url, undrain.relay_hook) == (
        "https://drain.example.org/undrain",
        "undrain",
    )


def test_no_relay_key_no_undrain_by_default() -> None:
    settings = app_settings()
    assert not {
        "RELAY_KEY",
        "RELAY_KEY_PREVIOUS",
        "UNDRAIN__HTTP_URL",
        "UNDRAIN__RELAY_HOOK",
    } & set(settings)


def test_allowed_subscriptions_is_a_comma_separated_list(monkeypatch) -> None:
    """ALLOWED_SUBSCRIPTIONS: what main.bicep passes (by default the subscriptions of
    vmScopes, i.e. this deployment's), joined with commas as the app splits it."""
    assert app_settings()["ALLOWED_SUBSCRIPTIONS"] == ""  # the module default: any
    subs = ["11111111-2222-3333-4444-555555555555", "66666666-7777-8888-9999-000000000000"]
    monkeypatch.setitem(SAMPLE, "allowedSubscriptions", subs)
    assert app_settings()["ALLOWED_SUBSCRIPTIONS"] == ",".join(subs)
    main = load("main")
    assert main.param_default("allowedSubscriptions") == []
    effective = main.variables["effectiveAllowedSubscriptions"]["operator"]
    assert effective["type"] == "conditional"
    ops = effective["operands"]
    assert ops["condition"]["function"] == {
        "type": "empty",
        "parameters": {"item_to_test": "allowedSubscriptions"},
    }
    assert ops["true_value"]["function"]["type"] == "union"
    assert "vmScopeSubscriptions" in ops["true_value"]["function"]["parameters"].values()
    assert ops["false_value"] == "allowedSubscriptions"
    per_scope = main.variables["vmScopeSubscriptions"]
    assert per_scope["loop_type"]["detail"]["array_name"] == "vmScopes"


# ATTESTATION_CA_PEM replaces the public roots that sign IMDS attested documents: set, it
# would let anyone holding that CA's key forge any VM. It is the simulator's only.
NEVER_IN_AZURE = {"ATTESTATION_CA_PEM"}


def test_the_bicep_never_writes_the_simulators_attestation_roots() -> None:
    from tests.infra.bicep import INFRA
    from tests.infra.test_functionapp import settings as every_setting

    assert not NEVER_IN_AZURE & set(every_setting())  # every arm of every conditional
    assert not NEVER_IN_AZURE & set(app_settings())
    for path in [*INFRA.rglob("*.bicep"), *INFRA.rglob("*.bicepparam")]:
        for line in path.read_text().splitlines():
            code = line.split("//", 1)[0]
            assert not any(name in code for name in NEVER_IN_AZURE), f"{path.name}: {line}"
    # Settings are written in one place only (the site's siteConfig.appSettings).
    assert [r.body["name"] for r in FN.resources("Microsoft.Web/sites/config")] == [
        "authsettingsV2"
    ]
