"""A Key Vault reference App Service could not resolve arrives as its own text; no secret
setting may take it for the secret (issue #23: the shared relay key passed the length check
and every relay answered 401; APP_SECRET would wrap keys no instance could read)."""

from __future__ import annotations

import pytest
from pydantic import SecretStr

from functions.notify.settings import ChannelSettings
from functions.settings import SettingsInvalid, load_settings, unresolved_reference

REF = "@Microsoft.KeyVault(SecretUri=https://kv-x.vault.azure.net/secrets/{name})"


@pytest.mark.parametrize(
    ("setting", "field"),
    [
        ("APP_SECRET", "app_secret"),
        ("ServiceBusConnection", "service_bus_connection"),
        ("StateStorage", "state_storage"),
        ("AzureWebJobsStorage", "webjobs_storage"),
    ],
)
def test_an_unresolved_reference_stops_the_app_naming_the_setting(setting, field) -> None:
    with pytest.raises(SettingsInvalid) as exc:
        load_settings(**({"app_secret": "k" * 32} | {field: REF.format(name="x")}))
    assert setting in str(exc.value)
    assert "unresolved Key Vault reference" in str(exc.value)


def test_the_same_from_the_environment(monkeypatch) -> None:
    monkeypatch.setenv("APP_SECRET", REF.format(name="app-secret"))
    with pytest.raises(SettingsInvalid, match="APP_SECRET is an unresolved Key Vault reference"):
        load_settings()


def test_a_resolved_secret_passes() -> None:
    assert load_settings(app_secret="k" * 32).app_secret_bytes == b"k" * 32


def test_the_old_shared_relay_key_is_not_a_setting_any_more(monkeypatch) -> None:
    monkeypatch.setenv("RELAY_KEY", REF.format(name="relay-key"))
    settings = load_settings(app_secret="k" * 32)  # ignored: nothing signs with it
    assert not hasattr(settings, "relay_key")


def test_detection_is_on_the_prefix_only() -> None:
    assert unresolved_reference(SecretStr("  @microsoft.keyvault(VaultName=kv;SecretName=s)"))
    assert not unresolved_reference(SecretStr("a-secret-containing-@Microsoft.KeyVault("))
    assert not unresolved_reference(None)


@pytest.mark.parametrize(
    ("channel", "settings", "named"),
    [
        ("teams", {"teams_webhook_url": REF}, "TEAMS_WEBHOOK_URL"),
        ("pagerduty", {"pagerduty_routing_key": REF}, "PAGERDUTY_ROUTING_KEY"),
        ("webhook", {"webhook_url": REF, "webhook_secret": "whsec_x"}, "WEBHOOK_URL"),
        (
            "webhook",
            {"webhook_url": "https://example.test/hook", "webhook_secret": REF},
            "WEBHOOK_SECRET",
        ),
    ],
)
def test_a_channel_with_an_unresolved_secret_is_off_and_reported(channel, settings, named) -> None:
    channels = ChannelSettings(**settings)
    reason = channels.off_reason(channel)
    assert reason is not None and named in reason and "Key Vault" in reason
    assert channels.misconfigured(channel)
