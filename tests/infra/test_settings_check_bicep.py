"""The app settings the template writes pass the app's own `settings check`: every name is
one the app (or the platform) reads, every value validates. A template that writes a name
the app does not read (a typo, a renamed setting) fails here, before a deployment."""

from __future__ import annotations

import os

from functions.settings_check import check_settings
from tests.infra.test_settings_contract import app_env, app_settings  # noqa: F401


def test_the_templates_settings_pass_the_check(app_env, monkeypatch) -> None:  # noqa: F811
    for name in list(os.environ):
        if name not in app_env and name not in ("PATH", "HOME"):
            monkeypatch.delenv(name)
    report = check_settings()
    assert report.errors() == [], [str(e) for e in report.errors()]
    assert set(app_env) <= set(os.environ)


def test_previous_secrets_are_key_vault_references_when_given() -> None:
    settings = app_settings()
    for name in ("APP_SECRET_PREVIOUS", "WEBHOOK_SECRET_PREVIOUS"):
        assert settings[name].startswith("@Microsoft.KeyVault(SecretUri="), name
