"""The function app: Flex Consumption, Python 3.11, identity everywhere, no plain secret."""

from __future__ import annotations

import re

from tests.infra.bicep import dotted, load, module_params

FN = load("functionapp")

# Settings that carry a secret (SETTINGS.md): they must be Key Vault references.
SECRET_SETTINGS = {
    "APP_SECRET",
    "PAGERDUTY_ROUTING_KEY",
    "TEAMS_WEBHOOK_URL",
    "WEBHOOK_URL",
    "WEBHOOK_SECRET",
}
SECRET_WORDS = re.compile(r"KEY|SECRET|PASSWORD|TOKEN|SAS|CONNECTION_?STRING", re.I)
# Not secrets: a Microsoft-documented exception, and names of identity settings.
NOT_SECRET = {"APPLICATIONINSIGHTS_CONNECTION_STRING", "RELAY_KEY_FILE"}


def _setting_objects(node):
    """Every object literal that flows into the `appSettings` variable."""
    if isinstance(node, str) and node in FN.variables:
        yield from _setting_objects(FN.variables[node])
    elif isinstance(node, dict) and "function" in node:
        assert node["function"]["type"] == "union"
        for arg in node["function"]["parameters"].values():
            yield from _setting_objects(arg)
    elif isinstance(node, dict) and "operator" in node:
        op = node["operator"]
        assert op["type"] == "conditional", op
        yield from _setting_objects(op["operands"]["true_value"])
        yield from _setting_objects(op["operands"]["false_value"])
    elif isinstance(node, dict):
        yield node
    else:
        raise AssertionError(f"unexpected app settings part: {node!r}")


def settings() -> dict:
    merged: dict = {}
    for obj in _setting_objects("appSettings"):
        for name, value in obj.items():
            assert name not in merged, f"{name} set twice"
            merged[name] = value
    return merged


def _site():
    (site,) = FN.resources("Microsoft.Web/sites")
    return site


def test_site_config_takes_all_settings_from_the_checked_variable() -> None:
    loop = _site().body["properties"]["siteConfig"]["appSettings"]
    assert loop["loop_type"]["detail"]["array_name"] == {
        "function": {"type": "items", "parameters": {"arg_1": "appSettings"}}
    }
    assert dotted(loop["config"]["name"]) == "setting.key"
    assert dotted(loop["config"]["value"]) == "setting.value"
    # App settings live in one place; the only other site config is the sign-in (pages).
    configs = [r.body["name"] for r in FN.resources("Microsoft.Web/sites/config")]
    assert configs == ["authsettingsV2"], "settings must live in one place"


def test_flex_consumption_python_311() -> None:
    (plan,) = FN.resources("Microsoft.Web/serverfarms")
    assert plan.body["sku"] == {"name": "FC1", "tier": "FlexConsumption"}
    assert plan.body["properties"]["reserved"] is True
    config = _site().body["properties"]["functionAppConfig"]
    assert config["runtime"] == {"name": "python", "version": "3.11"}
    storage = config["deployment"]["storage"]
    assert storage["type"] == "blobContainer"
    assert storage["authentication"]["type"] == "UserAssignedIdentity"
    assert storage["authentication"]["userAssignedIdentityResourceId"] == "identityId"
    # Flex rejects these two; the runtime comes from functionAppConfig.
    assert not {"FUNCTIONS_WORKER_RUNTIME", "FUNCTIONS_EXTENSION_VERSION"} & set(settings())


def test_https_only_tls12_no_ftp_no_basic_publishing() -> None:
    site = _site()
    props = site.body["properties"]
    assert props["httpsOnly"] is True
    assert props["siteConfig"]["minTlsVersion"] == "1.2"
    assert props["siteConfig"]["scmMinTlsVersion"] == "1.2"
    # Flex lists ftpsState as deprecated (ARM refused it, error 51021): FTP is off through the
    # ftp publishing policy below instead (test_flex.py holds the Flex rules).
    assert "ftpsState" not in props["siteConfig"]
    policies = {
        r.body["name"]: r.body["properties"]["allow"]
        for r in FN.resources("Microsoft.Web/sites/basicPublishingCredentialsPolicies")
    }
    assert policies == {"ftp": False, "scm": False}


def test_managed_identity_and_vnet_integration() -> None:
    site = _site()
    identity = site.body["identity"]
    assert identity["type"] == "UserAssigned"
    assert list(identity["userAssignedIdentities"]) == ["'${identityId}'"]
    props = site.body["properties"]
    assert props["keyVaultReferenceIdentity"] == "identityId"
    assert props["virtualNetworkSubnetId"] == "functionSubnetId"
    main = load("main")
    assert dotted(module_params(main, "functionApp")["functionSubnetId"]) == (
        "network.outputs.functionSubnetId"
    )


def test_identity_based_connections() -> None:
    s = settings()
    for conn in ("ServiceBusConnection", "AzureWebJobsStorage", "StateStorage"):
        assert s[f"{conn}__credential"] == "managedidentity"
        assert s[f"{conn}__clientId"] == "identityClientId"
    assert s["ServiceBusConnection__fullyQualifiedNamespace"] == "serviceBusFullyQualifiedNamespace"
    assert s["AzureWebJobsStorage__accountName"] == "storageAccountName"
    assert s["StateStorage__accountName"] == "storageAccountName"
    assert s["AZURE_CLIENT_ID"] == "identityClientId"
    assert s["APPLICATIONINSIGHTS_AUTHENTICATION_STRING"] == (
        "ClientId=${identityClientId};Authorization=AAD"
    )
    # No connection string for Service Bus or storage anywhere.
    assert not {"ServiceBusConnection", "AzureWebJobsStorage", "StateStorage"} & set(s)


def test_every_secret_setting_is_a_key_vault_reference() -> None:
    s = settings()
    assert set(s) >= SECRET_SETTINGS
    secretish = {n for n in s if SECRET_WORDS.search(n) and n not in NOT_SECRET}
    for name in secretish | SECRET_SETTINGS:
        value = FN.expand(s[name])
        assert re.fullmatch(
            r"@Microsoft\.KeyVault\(SecretUri=\$\{keyVaultUri\}secrets/\$\{secretNames\.\w+\}\)",
            value,
        ), f"{name} is not a Key Vault reference: {value}"


def test_secret_references_name_the_secrets_the_vault_creates() -> None:
    s = settings()
    kv = load("keyvault")
    names = kv.variables["names"]
    for setting, key in (
        ("APP_SECRET", "appSecret"),
        ("PAGERDUTY_ROUTING_KEY", "pagerdutyRoutingKey"),
        ("TEAMS_WEBHOOK_URL", "teamsWebhookUrl"),
        ("SLACK_WEBHOOK_URL", "slackWebhookUrl"),
        ("WEBHOOK_URL", "webhookUrl"),
        ("WEBHOOK_SECRET", "webhookSecret"),
        ("APP_SECRET_PREVIOUS", "appSecretPrevious"),
        ("WEBHOOK_SECRET_PREVIOUS", "webhookSecretPrevious"),
    ):
        assert s[setting].endswith(f"${{secretNames.{key}}})"), setting
        assert key in names


def test_no_secure_value_reaches_the_function_app_module() -> None:
    main = load("main")
    secure = {n for n in main.params if main.decorator(n, "secure")}
    params = module_params(main, "functionApp")
    for name, value in params.items():
        assert not (isinstance(value, str) and value in secure), f"{name} gets secret {value}"
    assert not any(FN.decorator(n, "secure") for n in FN.params)
    # The secrets go to Key Vault and nowhere else.
    users = {
        symbol
        for symbol in main.modules
        for value in module_params(main, symbol).values()
        if isinstance(value, str) and value in secure
    }
    assert users == {"keyVault"}


def test_policy_settings_default_to_the_reference_policy() -> None:
    s = settings()
    assert s["POLICY__DRY_RUN"]["operator"]["operands"]["condition"] == "policyDryRun"
    assert FN.param_default("policyDryRun") is False
    assert s["POLICY__TIMEZONE"] == "policyTimezone"
    assert FN.param_default("policyTimezone") == "UTC"
    assert FN.param_default("policyMaxConcurrentPerSet") == 1
    assert FN.param_default("policyWindows") == []
    # No budgets of one's own: only max_concurrent_per_set's, over sets.
    converted = s["POLICY__BUDGETS"]["function"]
    assert converted == {"type": "string", "parameters": {"value_to_convert": "policyBudgets"}}
    assert FN.param_default("policyBudgets") == []
    # Empty rules = the app's built-in default policy (drain, then approve).
    assert FN.param_default("policyRules") == []
    main = load("main")
    passed = module_params(main, "functionApp")
    for name in ("policyRules", "policyDryRun", "policyWindows", "policyTimezone", "policyBudgets"):
        assert passed[name] == name
        assert main.param_default(name) == FN.param_default(name)


def test_bridge_settings_match_the_contract() -> None:
    s = settings()
    for name in (
        "DOCUMENTS_QUEUE",
        "HEARTBEATS_QUEUE",
        "RETENTION_DAYS",
        "NOTIFICATIONS_TOPIC",
        "STATE_TABLE_PREFIX",
        "PUBLIC_BASE_URL",
        "RELAY_SILENT_AFTER_SECONDS",
        "APPROVAL_MARGIN_SECONDS",
        "DRAIN__ON_FAILURE",
    ):
        assert name in s, name
    assert FN.param_default("drainOnFailure") == "hold"
    assert FN.param_default("documentsQueueName") == "documents"
    assert FN.param_default("heartbeatsQueueName") == "heartbeats"
    assert FN.param_default("retentionDays") == 30
    main = load("main")
    passed = module_params(main, "functionApp")
    assert dotted(passed["heartbeatsQueueName"]) == "serviceBus.outputs.heartbeatsQueueName"
    assert FN.param_default("notificationsTopicName") == "notifications"
    assert FN.param_default("stateTablePrefix") == "sebridge"


def test_per_vm_identity_settings() -> None:
    """Contract §6: APP_SECRET from Key Vault, the callback port, the subscription allow-list;
    no shared relay key."""
    s = settings()
    assert not {"RELAY_KEY", "RELAY_KEY_PREVIOUS"} & set(s)
    assert s["RELAY_CALLBACK_PORT"] == {
        "function": {"type": "string", "parameters": {"value_to_convert": "relayCallbackPort"}}
    }
    assert FN.param_default("relayCallbackPort") == 8492
    assert s["ALLOWED_SUBSCRIPTIONS"]["function"] == {
        "type": "join",
        "parameters": {"input_array": "allowedSubscriptions", "delimiter": ","},
    }
    main = load("main")
    passed = module_params(main, "functionApp")
    assert passed["relayCallbackPort"] == "relayCallbackPort"
    assert passed["allowedSubscriptions"] == "effectiveAllowedSubscriptions"


def test_the_worker_has_a_thread_for_every_invocation_host_json_allows_at_once() -> None:
    """Issue 46: on 2f59d6a PYTHON_THREADPOOL_THREAD_COUNT was unset, so the worker ran
    ThreadPoolExecutor's default (min(32, CPUs + 4) threads) while host.json allows 16
    reconcile items and 16 sessions at once, and drains sleep in those threads."""
    import json
    from pathlib import Path

    bus = json.loads((Path(__file__).resolve().parents[2] / "host.json").read_text())
    bus = bus["extensions"]["serviceBus"]
    s = settings()
    assert s["PYTHON_THREADPOOL_THREAD_COUNT"] == {
        "function": {"type": "string", "parameters": {"value_to_convert": "pythonThreadCount"}}
    }
    threads = FN.variables["pythonThreadCount"]
    assert threads >= bus["maxConcurrentCalls"] + bus["maxConcurrentSessions"], threads
