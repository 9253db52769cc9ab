"""The operators' sign-in: App Service Authentication with Entra ID, only when asked for,
never in the way of the function-key APIs, and the settings the pages read."""

from __future__ import annotations

from tests.infra.bicep import load, module_params
from tests.infra.test_functionapp import FN, settings


def test_sign_in_is_configured_only_with_an_app_registration() -> None:
    (auth,) = FN.resources("Microsoft.Web/sites/config")
    assert auth.body["name"] == "authsettingsV2" and auth.body["parent"] == "site"
    condition = auth.condition["operator"]
    assert condition["type"] == "not"
    assert condition["operands"]["bool_value"]["function"] == {
        "type": "empty",
        "parameters": {"item_to_test": "operatorsClientId"},
    }
    assert FN.param_default("operatorsClientId") == ""


def test_sign_in_leaves_anonymous_requests_to_the_app() -> None:
    (auth,) = FN.resources("Microsoft.Web/sites/config")
    props = auth.body["properties"]
    assert props["platform"]["enabled"] is True
    # The function-key APIs and the platform's own webhooks must stay reachable: the pages
    # redirect to /.auth/login/aad themselves.
    assert props["globalValidation"] == {
        "requireAuthentication": False,
        "unauthenticatedClientAction": "AllowAnonymous",
    }
    aad = props["identityProviders"]["azureActiveDirectory"]
    assert aad["enabled"] is True
    assert aad["registration"]["clientId"] == "operatorsClientId"
    assert aad["registration"]["openIdIssuer"].endswith("${operatorsTenantId}/v2.0")
    assert props["httpSettings"]["requireHttps"] is True
    assert props["login"]["tokenStore"]["enabled"] is False  # no tokens kept: nothing to leak


def test_the_pages_settings_come_from_parameters() -> None:
    found = settings()
    assert found["OPERATORS_GROUP_ID"] == "operatorsGroupId"
    assert found["OPERATORS_APP_ROLE"] == "operatorsAppRole"
    assert found["PUBLIC_BASE_URL"] == "publicBaseUrl"
    assert "azurewebsites.net" not in str(FN.variables["bridgeSettings"])


def test_main_passes_the_operators_parameters() -> None:
    params = module_params(load("main"), "functionApp")
    for name in ("operatorsClientId", "operatorsGroupId", "operatorsAppRole", "publicBaseUrl"):
        assert params[name] == name
