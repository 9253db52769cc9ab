"""`python -m functions settings check`: each typo the issue found exits 2 naming the
setting, the app refuses the same settings with the same message (failing closed and
announcing `policy_invalid`), and what is valid passes."""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from functions.model.policy import load_policy
from functions.settings import SettingsInvalid, load_settings
from functions.settings_check import (
    app_prefixes,
    check_settings,
    checked_settings,
    known_names,
    settings_models,
)

ROOT = Path(__file__).resolve().parents[2]
# A deployment's settings that pass: connections present (never contacted), the secret.
BASE = {
    "ServiceBusConnection": "Endpoint=sb://sb-test.servicebus.windows.net/;"
    "SharedAccessKeyName=send;SharedAccessKey=c2VjcmV0",
    "StateStorage": "UseDevelopmentStorage=true",
    "APP_SECRET": "s" * 40,
    # Someone hears of events (without a channel or an alert receiver: a warning).
    "PAGERDUTY_ROUTING_KEY": "0123456789abcdef0123456789abcdef",
}
TERMINATE_DRAIN = {
    "name": "terminate-drain",
    "match": {"event_types": ["Terminate"]},
    "action": "drain",
}


def rules(*match: dict, action: str = "approve") -> str:
    return json.dumps(
        [{"name": f"r{i}", "match": m, "action": action} for i, m in enumerate(match)]
        + [{"name": "default-hold", "action": "hold"}]
    )


def budgets(*changes: dict) -> str:
    """POLICY__BUDGETS: one valid budget per `changes`, each changed by it."""
    base = {"name": "checkout", "group_by": "tag:service", "max_unavailable": 1}
    return json.dumps([{**base, **change} for change in changes])


# (environment, the setting the error must name, words it must contain)
TYPOS = [
    ({"POLICY__DRYRUN": "true"}, "POLICY__DRYRUN", "did you mean POLICY__DRY_RUN"),
    ({"POLICY_DRY_RUN": "true"}, "POLICY_DRY_RUN", "did you mean POLICY__DRY_RUN"),
    (
        {"POLICY__RULES": rules({"event_types": ["Reboots"]})},
        "POLICY__RULES[0].match.event_types",
        "'Reboot'",
    ),
    (
        {"POLICY__RULES": rules({"sources": ["Platfrom"]})},
        "POLICY__RULES[0].match.sources",
        "'Platform'",
    ),
    (
        {"POLICY__RULES": rules({"statuses": ["Schedulled"]})},
        "POLICY__RULES[0].match.statuses",
        "'Scheduled'",
    ),
    ({"POLICY__PAGE__EVENT_TYPES": '["Premept"]'}, "POLICY__PAGE__EVENT_TYPES", "'Preempt'"),
    ({"POLICY__RULES": rules({"sorces": ["User"]})}, "POLICY__RULES[0].match.sorces", "'sources'"),
    (
        {"POLICY__RULES": rules({"duration_at_least": -1})},
        "POLICY__RULES[0].match.duration_at_least",
        "greater than or equal to 0",
    ),
    ({"DRAIN__ON_FAILURE": "aprove"}, "DRAIN__ON_FAILURE", "did you mean approve"),
    ({"DRAIN__ONFAILURE": "hold"}, "DRAIN__ONFAILURE", "did you mean DRAIN__ON_FAILURE"),
    ({"DRAIN_ON_FAILURE": "hold"}, "DRAIN_ON_FAILURE", "did you mean DRAIN__ON_FAILURE"),
    ({"APP_SECRET_PREVIOS": "p" * 40}, "APP_SECRET_PREVIOS", "did you mean APP_SECRET_PREVIOUS"),
    ({"TEAMS_WEBHOOK_URI": "https://x"}, "TEAMS_WEBHOOK_URI", "did you mean TEAMS_WEBHOOK_URL"),
    ({"APPROVAL_MARGIN_SECOND": "5"}, "APPROVAL_MARGIN_SECOND", "APPROVAL_MARGIN_SECONDS"),
    ({"RETENTION_DAYS": "0"}, "RETENTION_DAYS", "greater than or equal to 1"),
    ({"ALLOWED_SUBSCRIPTIONS": "0000-typo"}, "ALLOWED_SUBSCRIPTIONS", "is not a subscription id"),
    (
        {"POLICY__WINDOWS": '[{"days":["Satu"],"start":"01:00","end":"05:00"}]'},
        "POLICY__WINDOWS[0].days[0]",
        "did you mean Sat",
    ),
    ({"ATTESTATION_MODE": "reprot"}, "ATTESTATION_MODE", "did you mean report"),
    (
        {"POLICY__BUDGETS": budgets({"group_by": ["tag:service", "zones"]})},
        "POLICY__BUDGETS[0].group_by",
        "did you mean 'zone'",
    ),
    (
        {"POLICY__BUDGETS": budgets({"group_by": "tags:service"})},
        "POLICY__BUDGETS[0].group_by",
        "did you mean 'tag:service'",
    ),
    (
        {"POLICY__BUDGETS": budgets({"max_unavailble": 2})},
        "POLICY__BUDGETS[0].max_unavailble",
        "did you mean 'max_unavailable'",
    ),
    (
        {"POLICY__BUDGETS": budgets({"max_unavailable": "10 percent"})},
        "POLICY__BUDGETS[0].max_unavailable",
        "a percentage like '10%'",
    ),
    (
        {"POLICY__BUDGETS": budgets({"match": {"event_type": ["Reboot"]}})},
        "POLICY__BUDGETS[0].match.event_type",
        "did you mean 'event_types'",
    ),
    (
        {"POLICY__BUDGETS": budgets({}, {})},
        "POLICY__BUDGETS",
        "budget names must be unique",
    ),
    (
        {
            "POLICY__RULES": json.dumps(
                [
                    {"name": "user-initiated", "match": {"sources": ["User"]}, "action": "approve"},
                    TERMINATE_DRAIN,
                    {"name": "default-hold", "action": "hold"},
                ]
            )
        },
        "POLICY__RULES",
        "takes the Terminate events from User",
    ),
]


# Settings the app cannot start without getting right: load_settings raises, naming it.
STOPS = {
    "RETENTION_DAYS": "retention_days",
    "ALLOWED_SUBSCRIPTIONS": "ALLOWED_SUBSCRIPTIONS",
    "ATTESTATION_MODE": "attestation_mode",
}


def run_check(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    """`python -m functions settings check ARGS` with only `env` (and PATH, HOME) in the
    environment: in this process (a child per call cost the suite a minute of Python
    start-ups), its exit code, stdout and stderr as a child's would be.
    test_the_module_runs_as_a_program runs the real command once."""
    from functions.__main__ import main

    clean = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": os.environ.get("HOME", "/")}
    saved = dict(os.environ)
    out, err = io.StringIO(), io.StringIO()
    os.environ.clear()
    os.environ.update({**clean, **env})
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(["settings", "check", *args])
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else 1
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return subprocess.CompletedProcess(
        ["settings", "check", *args], code, out.getvalue(), err.getvalue()
    )


def test_the_module_runs_as_a_program():
    clean = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": os.environ.get("HOME", "/")}
    for env, code in ((BASE, 0), ({**BASE, "POLICY__DRYRUN": "true"}, 2)):
        done = subprocess.run(
            [sys.executable, "-m", "functions", "settings", "check"],
            cwd=ROOT,
            env={**clean, **env},
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == code, done.stderr
        assert done.returncode == run_check(env).returncode
    assert "did you mean POLICY__DRY_RUN" in done.stderr


@pytest.fixture
def bare_env(monkeypatch):
    """The process environment holding only BASE (and what tests add)."""
    for name in list(os.environ):
        if name not in ("PATH", "HOME"):
            monkeypatch.delenv(name)
    for name, value in BASE.items():
        monkeypatch.setenv(name, value)
    return monkeypatch


def test_valid_settings_pass_and_strict_counts_warnings():
    done = run_check(BASE)
    assert done.returncode == 0, done.stderr
    assert "settings OK" in done.stdout
    # The default policy drains; with no drain step configured the readiness probe drains
    # (issue 38): nothing to warn about, unless that is turned off too.
    assert "drain, but neither" not in done.stderr
    off = {**BASE, "DRAIN__READINESS": "false"}
    assert (
        "warning: POLICY__RULES: rule(s) 'terminate-drain', 'drain-then-approve' drain"
        in run_check(off).stderr
    )
    strict = run_check(off, "--strict")
    assert strict.returncode == 2 and "1 warning(s) (--strict)" in strict.stderr
    hooked = run_check({**off, "DRAIN__RELAY_HOOK": "drain"}, "--strict")
    assert hooked.returncode == 0, hooked.stderr


@pytest.mark.parametrize(("env", "setting", "words"), TYPOS, ids=[t[1] for t in TYPOS])
def test_each_typo_exits_2_naming_the_setting(env, setting, words):
    done = run_check({**BASE, **env})
    assert done.returncode == 2, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert any(setting in line and words in line for line in errors), done.stderr


@pytest.mark.parametrize(("env", "setting", "words"), TYPOS, ids=[t[1] for t in TYPOS])
def test_the_app_refuses_the_same_settings_with_the_same_message(bare_env, env, setting, words):
    for name, value in env.items():
        bare_env.setenv(name, value)
    done = run_check({**BASE, **env})
    printed = [line.removeprefix("error: ") for line in done.stderr.splitlines()]
    printed = [line for line in printed if setting in line and words in line]
    if setting in STOPS:  # a Settings value: the app stops at start, naming it
        with pytest.raises(SettingsInvalid, match=STOPS[setting]):
            load_settings()
        return
    settings = checked_settings(load_settings())
    load = settings.policy
    assert load.policy is None  # fails closed: nothing is approved
    assert printed and all(line in load.error for line in printed)


def test_missing_connections_are_errors_unless_local():
    done = run_check({"APP_SECRET": "s" * 40})
    assert done.returncode == 2
    assert "no Service Bus" in done.stderr and "no state storage" in done.stderr
    assert run_check({}, "--local").returncode == 0


def test_platform_and_host_names_are_not_the_apps(bare_env):
    for name in (
        "FUNCTIONS_WORKER_RUNTIME",
        "FUNCTIONS_EXTENSION_VERSION",
        "WEBSITE_SITE_NAME",
        "WEBSITE_HOSTNAME",
        "AzureWebJobsFeatureFlags",
        "AzureWebJobsStorage__accountName",
        "APPLICATIONINSIGHTS_CONNECTION_STRING",
        "AZURE_CLIENT_ID",
        "ServiceBusConnection__credential",
        "StateStorage__clientId",
        "IDENTITY_ENDPOINT",
        "RELAY_CONFIG",  # the relay's, in a local run's environment
    ):
        bare_env.setenv(name, "x")
    report = check_settings(for_azure=False)
    assert report.errors() == [], report.errors()


def test_unknown_connection_property_is_named(bare_env):
    bare_env.setenv("StateStorage__acountName", "x")
    (finding,) = [f for f in check_settings(for_azure=False).errors()]
    assert finding.setting == "StateStorage__acountName"
    assert "did you mean StateStorage__accountName" in finding.message


def test_known_names_come_from_every_settings_model():
    models = {m.__name__ for m in settings_models()}
    assert {"Settings", "PolicySettings", "ChannelSettings", "DrainSettings"} <= models
    names = {n.casefold() for n in known_names(settings_models())}
    for name in (
        "APP_SECRET",
        "APP_SECRET_PREVIOUS",
        "WEBHOOK_SECRET_PREVIOUS",
        "POLICY__PAGE__EVENT_TYPES",
        "DRAIN__ON_FAILURE",
        "UNDRAIN__RELAY_HOOK",
        "TEAMS_WEBHOOK_URL",
        "ServiceBusConnection__fullyQualifiedNamespace",
    ):
        assert name.casefold() in names, name
    prefixes = app_prefixes(settings_models())
    assert {"POLICY__", "DRAIN__", "TEAMS_", "PAGERDUTY_", "WEBHOOK_"} <= prefixes
    assert "RELAY_" not in prefixes and "WEBSITE_" not in prefixes


def test_retired_and_simulator_only_settings_are_warnings(bare_env):
    bare_env.setenv("RELAY_KEY", "old")
    bare_env.setenv("ATTESTATION_CA_PEM", "-----BEGIN CERTIFICATE-----")
    report = check_settings(for_azure=True)
    assert report.errors() == []
    assert {f.setting for f in report.warnings()} >= {"RELAY_KEY", "ATTESTATION_CA_PEM"}


def test_a_half_configured_channel_is_a_warning(bare_env):
    bare_env.setenv("WEBHOOK_URL", "https://example.org/hook")
    (warning,) = [f for f in check_settings().warnings() if f.setting == "webhook"]
    assert "WEBHOOK_SECRET is not" in warning.message


def test_exported_app_settings_file_with_key_vault_references(tmp_path):
    exported = [
        {"name": k, "value": v, "slotSetting": False}
        for k, v in {
            **BASE,
            "APP_SECRET": "@Microsoft.KeyVault(SecretUri=https://kv.vault.azure.net/secrets/app-secret)",
            "POLICY__DRY_RUN": "true",
        }.items()
    ]
    path = tmp_path / "settings.json"
    path.write_text(json.dumps(exported))
    done = run_check({}, "--file", str(path))
    assert done.returncode == 0, done.stderr
    assert "note: APP_SECRET: a Key Vault reference" in done.stderr
    path.write_text(json.dumps({"Values": {**BASE, "POLICY__DRYRUN": "true"}}))
    done = run_check({}, "--file", str(path))
    assert done.returncode == 2 and "POLICY__DRYRUN" in done.stderr
    path.write_text("[1, 2]")
    assert run_check({}, "--file", str(path)).returncode == 2


def test_policy_check_refuses_unknown_policy_names_too(bare_env):
    bare_env.setenv("POLICY__DRYRUN", "true")
    load = load_policy()
    assert load.policy is None
    assert load.problems == (
        "POLICY__DRYRUN is not a policy setting; did you mean POLICY__DRY_RUN?",
    )


def test_the_function_app_start_refuses_them(bare_env, azurite):
    """Through the handlers' own start (functions.triggers.core.pipeline): the host fails
    closed with the check's message, and each event is held, saying why."""
    from functions.model.policy import decide
    from functions.triggers import core as handlers
    from tests.functions.conftest import T0
    from tests.functions.test_policy import ev

    bare_env.setenv("StateStorage", azurite)
    bare_env.setenv("POLICY__DRYRUN", "true")
    bare_env.setenv("DRAIN__ON_FAILURE", "aprove")
    printed = run_check({**BASE, "POLICY__DRYRUN": "true", "DRAIN__ON_FAILURE": "aprove"})
    errors = [
        line.removeprefix("error: ")
        for line in printed.stderr.splitlines()
        if line.startswith("error: ")
    ]
    errors = [line for line in errors if "DRYRUN" in line or "ON_FAILURE" in line]
    assert len(errors) == 2
    handlers.use_pipeline(None)
    try:
        load = handlers.pipeline().settings.policy
    finally:
        handlers.use_pipeline(None)
    assert load.policy is None and all(line in load.error for line in errors)
    decision = decide(load, ev(source="User"), T0)
    assert decision.action == "hold" and decision.policy_error == load.error
    assert all(line in decision.reason for line in errors)
