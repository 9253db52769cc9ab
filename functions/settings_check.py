"""Every app setting checked the way the app reads it: `python -m functions settings check`.

The same models and loaders the app uses at start (functions.settings, the policy, the
channels, the drain workflow, and any other pydantic-settings model under functions/) read
the same environment, so the check and the app cannot disagree. On top of what each model
validates:

- **Names.** A name under one of the app's prefixes that no model reads is an error with
  the closest known name (`POLICY__DRYRUN`, `POLICY_DRY_RUN`, `DRAIN__ONFAILURE`,
  `TEAMS_WEBHOOK_URI`). The prefixes are the models' `env_prefix`es and the first word of
  each flat setting (`APPROVAL_`, `MAX_`, `TEAMS_`, ...), except words other software owns
  (`RELAY_` is the relay's own, `WEBSITE_`/`FUNCTIONS_`/... the platform's). Elsewhere a
  name very close to a known one is a warning (it may be someone else's).
- **Order of rules** (functions.model.policy_lint) and a `drain` rule with no drain step
  configured.

Errors are what the app refuses: the function app fails closed on them (nothing is
approved; `policy_invalid` is announced and pages, with these same messages). Warnings are
what the app runs with but logs at start; `--strict` makes them errors too.
"""

from __future__ import annotations

import importlib
import logging
import os
import pkgutil
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Literal

from pydantic import BaseModel, ValidationError
from pydantic_settings import BaseSettings

import functions
from functions.model.policy import POLICY_FAMILY, PolicyLoad, PolicySettings, load_policy
from functions.setting_names import (
    did_you_mean,
    env_names,
    error_message,
    error_setting,
    suggestion,
)
from functions.settings import Settings, SettingsInvalid, check_for_azure, load_settings

log = logging.getLogger(__name__)

Severity = Literal["error", "warning"]

# Names other software reads in the function app's environment: the Functions host, App
# Service, the Azure SDKs' credentials, Application Insights, the Python worker. Never the
# app's, never reported.
PLATFORM_PREFIXES = (
    "FUNCTIONS_",
    "AZUREWEBJOBS",
    "AZURE_",
    "WEBSITE_",
    "WEBSITES_",
    "APPSETTING_",
    "APPLICATIONINSIGHTS_",
    "APPINSIGHTS_",
    "SCM_",
    "MSI_",
    "IDENTITY_",
    "CONTAINER_",
    "ENABLE_ORYX",
    "ORYX_",
    "PYTHON",
    "OTEL_",
    "REQUESTS_CA_BUNDLE",
    "CURL_CA_BUNDLE",
    "SIMULATOR_",
)
# Connection settings the Functions host and the Azure SDKs read for identity-based
# connections (`<connection>__credential`, ...): known for each connection the app names.
CONNECTION_PROPERTIES = (
    "credential",
    "clientId",
    "tenantId",
    "clientSecret",
    "certificate",
    "accountName",
    "fullyQualifiedNamespace",
    "serviceUri",
    "blobServiceUri",
    "queueServiceUri",
    "tableServiceUri",
)
CONNECTIONS = ("ServiceBusConnection", "StateStorage", "AzureWebJobsStorage")
# First words of app settings that other software owns in the same environment: the
# relay's RELAY_* (local runs), the platform's WEBSITE_*.
SHARED_WORDS = frozenset({"RELAY", "WEBSITE", "AZUREWEBJOBSSTORAGE"})
# Read by no model any more; present, they are reported (the app warns at start too).
RETIRED = {
    "RELAY_KEY": "no longer used (each relay has its own key): remove it and its secret",
    "RELAY_KEY_PREVIOUS": "no longer used (each relay has its own key): remove it",
}


@dataclass(frozen=True)
class Finding:
    severity: Severity
    setting: str
    message: str

    def __str__(self) -> str:
        return f"{self.setting}: {self.message}" if self.setting else self.message


@dataclass(frozen=True)
class SettingsReport:
    findings: tuple[Finding, ...]
    policy: PolicyLoad
    models: tuple[str, ...] = field(default=())

    def errors(self, strict: bool = False) -> list[Finding]:
        return [f for f in self.findings if f.severity == "error" or strict]

    def warnings(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "warning"]

    def refusal(self) -> str | None:
        """The app's fail-closed reason: every error, in the check's own words."""
        errors = self.errors()
        return "; ".join(str(f) for f in errors) if errors else None


# ---------------------------------------------------------------------------- models


def settings_models() -> list[type[BaseSettings]]:
    """Every pydantic-settings model defined under functions/ (all modules imported, so a
    model another module adds is found without a list to keep up to date)."""
    for module in pkgutil.walk_packages(functions.__path__, "functions."):
        if module.name != "functions.__main__":
            importlib.import_module(module.name)
    found: dict[str, type[BaseSettings]] = {}
    stack = list(BaseSettings.__subclasses__())
    while stack:
        model = stack.pop()
        stack.extend(model.__subclasses__())
        if model.__module__.startswith("functions."):
            found[f"{model.__module__}.{model.__qualname__}"] = model
    return [found[k] for k in sorted(found)]


def known_names(models: Iterable[type[BaseModel]]) -> set[str]:
    names: set[str] = set(RETIRED)
    for model in models:
        names |= env_names(model)
    names |= {f"{c}__{p}" for c in CONNECTIONS for p in CONNECTION_PROPERTIES}
    return names


def app_prefixes(models: Iterable[type[BaseSettings]]) -> set[str]:
    """Upper-case prefixes under which every name is the app's."""
    prefixes = {POLICY_FAMILY}
    for model in models:
        prefix = str(model.model_config.get("env_prefix") or "").upper()
        if prefix:
            # DRAIN_ON_FAILURE (one underscore short) is still meant for DRAIN__.
            prefixes.update({prefix, prefix.rstrip("_") + "_"})
            continue
        for name in env_names(model):
            word = name.split("_", 1)[0].upper()
            if "_" in name and "__" not in name and word not in SHARED_WORDS:
                prefixes.add(word + "_")
    for connection in CONNECTIONS:
        prefixes.add(f"{connection}__".upper())
    return prefixes


def _platform(name: str) -> bool:
    upper = name.upper()
    return upper.startswith(PLATFORM_PREFIXES) and not upper.startswith("AZUREWEBJOBSSTORAGE__")


def unknown_names(environ: Iterable[str], models: Iterable[type[BaseSettings]]) -> list[Finding]:
    """Names no model reads: errors under the app's prefixes, warnings when merely close."""
    models = list(models)
    known = known_names(models)
    folded = {k.casefold() for k in known}
    prefixes = app_prefixes(models)
    findings = []
    for name in sorted(environ):
        if name.casefold() in folded:
            continue
        upper = name.upper()
        if upper.startswith(POLICY_FAMILY):
            continue  # the policy's own check names these (load_policy)
        if any(upper.startswith(p) for p in prefixes) and not _platform(name):
            findings.append(
                Finding("error", name, f"not a setting the app reads{suggestion(name, known)}")
            )
        elif not _platform(name) and (close := did_you_mean(name, known, cutoff=0.85)):
            findings.append(
                Finding("warning", name, f"not a setting the app reads; did you mean {close}?")
            )
    return findings


# ---------------------------------------------------------------------------- values


def model_findings(model: type[BaseSettings]) -> list[Finding]:
    """The model's own validation, each error named by its app setting."""
    try:
        model()
    except ValidationError as exc:
        return [
            Finding("error", error_setting(model, tuple(e["loc"])), error_message(e))
            for e in exc.errors(include_url=False)
        ]
    except ValueError as exc:  # pydantic-settings: a complex value that is not JSON
        return [Finding("error", model.__name__, str(exc))]
    return []


def _app_findings(settings: Settings, for_azure: bool) -> list[Finding]:
    findings = []
    if for_azure:
        try:
            check_for_azure(settings)
        except SettingsInvalid as exc:
            findings += [Finding("error", "connections", p) for p in str(exc).split("; ")]
    if settings.app_secret_previous is not None and settings.app_secret_previous_bytes is None:
        findings.append(
            Finding(
                "warning", "APP_SECRET_PREVIOUS", "the same as APP_SECRET: nothing to fall back to"
            )
        )
    if settings.attestation_ca_pem:
        findings.append(
            Finding(
                "warning",
                "ATTESTATION_CA_PEM",
                "set: it replaces Azure's public roots (the simulator's only, never in Azure)",
            )
        )
    return findings


def _drain_findings(
    policy: PolicyLoad, environ: Mapping[str, str], configured: bool | None
) -> list[Finding]:
    """A `drain` rule with nothing configured to drain: no VM has a working drain, so the
    policy's no-drain rule applies (functions.model.policy.no_drain): Platform events held
    until NotBefore, User events approved at once, undrained. The readiness probe drains
    them by default (DRAIN__READINESS), so this is only when that is turned off too."""
    if policy.policy is None:
        return []
    folded = {k.upper(): v for k, v in environ.items()}
    if configured is None:
        configured = bool(
            folded.get("DRAIN__HTTP_URL")
            or folded.get("DRAIN__RELAY_HOOK")
            or _readiness_on(folded.get("DRAIN__READINESS"))
        )
    drains = [r.name for r in policy.policy.rules if r.action == "drain"]
    if not drains:
        return []
    if configured:
        return []
    return [
        Finding(
            "warning",
            "POLICY__RULES",
            f"rule(s) {', '.join(repr(n) for n in drains)} drain, but neither DRAIN__HTTP_URL "
            "nor DRAIN__RELAY_HOOK is set and DRAIN__READINESS is false: those events have no "
            "drain: a Platform event or a scale-in is held until NotBefore, a User Reboot or "
            "Redeploy approved at once (set one to drain them and approve early)",
        )
    ]


def _readiness_on(value: str | None) -> bool:
    """DRAIN__READINESS as the app reads it (on unless set false); a value that is no
    boolean is DrainSettings' error to report, and counts as on here."""
    from pydantic import TypeAdapter, ValidationError

    if value is None:
        return True
    try:
        return TypeAdapter(bool).validate_python(value)
    except ValidationError:
        return True


def check_settings(
    environ: Mapping[str, str] | None = None,
    *,
    for_azure: bool = True,
    drain_configured: bool | None = None,
    alert_receivers: bool | None = None,
    channels_configured: bool | None = None,
) -> SettingsReport:
    """Check the process environment (the models read os.environ; `environ` is only for
    the name checks, and defaults to it). `for_azure=False` leaves out the connections
    the local host supplies itself; `drain_configured` overrides what DRAIN__* says (the
    demo configures its drain steps in code); `alert_receivers` what ALERT_EMAIL and
    ALERT_ACTION_GROUP_ID say (a parameter file names them as alertEmail, ...), and
    `channels_configured` whether a channel is on (the demo's receivers are not settings)."""
    env = os.environ if environ is None else environ
    models = settings_models()
    findings = unknown_names(env, models)
    findings += [Finding("warning", n, RETIRED[n]) for n in sorted(RETIRED) if n in env]
    app = model_findings(Settings)
    findings += app
    if not app:
        findings += _app_findings(load_settings(), for_azure)
    policy = load_policy()
    findings += [Finding("error", "", p) for p in policy.problems]
    if policy.error and not policy.problems:
        findings.append(Finding("error", "", policy.error))
    findings += [Finding("warning", "", w) for w in policy.warnings]
    findings += _drain_findings(policy, env, drain_configured)
    for model in models:
        if model not in (Settings, PolicySettings):
            findings += model_findings(model)
    findings += _channel_findings(env, True if channels_configured else alert_receivers)
    names = tuple(f"{m.__module__}.{m.__qualname__}" for m in models)
    return SettingsReport(tuple(findings), policy, names)


CHANNELS = ("teams", "pagerduty", "webhook", "slack")
# Who hears the bridge's alerts: the names main.bicepparam reads for alertEmail and
# alertActionGroupId (infra/README.md), so the deploy shell's check sees them.
ALERT_RECEIVERS = ("ALERT_EMAIL", "ALERT_ACTION_GROUP_ID")


def _channel_findings(environ: Mapping[str, str], alert_receivers: bool | None) -> list[Finding]:
    """A half-configured or unusable channel, a URL or key that is probably wrong, and a
    deployment that tells nobody anything."""
    from functions.notify.settings import ChannelSettings

    try:
        channels = ChannelSettings()
    except ValidationError:
        return []  # model_findings named it
    findings = [
        Finding("warning", channel, channels.off_reason(channel) or "")
        for channel in CHANNELS
        if channels.misconfigured(channel)
    ]
    findings += [
        Finding("warning", channel, warning)
        for channel in CHANNELS
        for warning in channels.endpoint_warnings(channel)
    ]
    if alert_receivers is None:
        folded = {k.upper(): v for k, v in environ.items()}
        alert_receivers = any(folded.get(name, "").strip() for name in ALERT_RECEIVERS)
    if not alert_receivers and all(channels.off_reason(c) is not None for c in CHANNELS):
        findings.append(
            Finding(
                "warning",
                "channels",
                "no channel is on (TEAMS_WEBHOOK_URL, SLACK_WEBHOOK_URL, PAGERDUTY_ROUTING_KEY, "
                "WEBHOOK_URL) and no alert receiver is named (ALERT_EMAIL or "
                "ALERT_ACTION_GROUP_ID, Bicep alertEmail / alertActionGroupId): nobody will "
                "hear of an event, nor of the bridge failing",
            )
        )
    return findings


def trust_notice(now: datetime | None = None) -> str:
    """The shipped trust material's expiry notice (functions.identity.trust.refresh), or ""."""
    from functions.identity import trust
    from functions.identity.trust.refresh import expiry_notice

    return expiry_notice(trust.manifest(), now or datetime.now(UTC))


def checked_settings(
    settings: Settings,
    *,
    for_azure: bool = False,
    drain_configured: bool | None = None,
    channels_configured: bool | None = None,
) -> Settings:
    """`settings` with the policy the app acts on: the settings check's errors, if any,
    make it fail closed (nothing approved, `policy_invalid` announced with the messages
    `settings check` prints); warnings are logged."""
    report = check_settings(
        for_azure=for_azure,
        drain_configured=drain_configured,
        channels_configured=channels_configured,
    )
    for warning in report.warnings():
        log.warning("settings: %s", warning)
    notice = trust_notice()
    if notice:
        log.warning("trust: %s", notice)
    refusal = report.refusal()
    if refusal is not None:
        log.error("POLICY INVALID, failing closed (nothing is approved): %s", refusal)
        return settings.with_policy(PolicyLoad(policy=None, error=refusal))
    return settings.with_policy(report.policy)
