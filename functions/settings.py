"""The function app's settings: one pydantic-settings model over the app settings.

Names are the Functions conventions (`ServiceBusConnection`,
`ServiceBusConnection__fullyQualifiedNamespace`, `StateStorage__accountName`, ...), so the
same setting configures both the trigger bindings and our own clients. The policy is read
separately (functions.model.policy.load_policy): a bad policy fails closed instead of stopping
the app, while a missing connection is an error that stops it with a clear message.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import re
from functools import cached_property
from typing import Literal
from urllib.parse import quote

from pydantic import AliasChoices, Field, SecretStr, ValidationError, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from functions.model.policy import PolicyLoad, load_policy, summarize

log = logging.getLogger(__name__)


_GUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


class SettingsInvalid(RuntimeError):
    """The app settings cannot work; the message names each bad setting."""


# App Service passes a Key Vault reference it could not resolve (no access, vault firewall,
# secret missing) as its own text, `@Microsoft.KeyVault(SecretUri=...)`. As a secret that
# text would pass every length check (APP_SECRET: no stored key could be read), so no
# secret setting may hold it.
KEY_VAULT_REFERENCE_PREFIX = "@Microsoft.KeyVault("


def unresolved_reference(value: SecretStr | str | None) -> bool:
    """True when a secret setting holds an unresolved Key Vault reference."""
    if value is None:
        return False
    text = value.get_secret_value() if isinstance(value, SecretStr) else value
    return text.strip().casefold().startswith(KEY_VAULT_REFERENCE_PREFIX.casefold())


def unresolved_message(setting: str) -> str:
    return (
        f"{setting} is an unresolved Key Vault reference (App Service could not read the "
        "secret: check the app identity's Key Vault Secrets User role on it, the vault "
        "firewall, and that the secret exists)"
    )


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        extra="ignore", case_sensitive=False, populate_by_name=True, frozen=True
    )

    service_bus_connection: SecretStr | None = Field(
        default=None,
        validation_alias=AliasChoices("ServiceBusConnection", "service_bus_connection"),
    )
    service_bus_namespace: str | None = Field(
        default=None,
        validation_alias=AliasChoices(
            "ServiceBusConnection__fullyQualifiedNamespace", "service_bus_namespace"
        ),
    )
    state_storage: SecretStr | None = Field(
        default=None, validation_alias=AliasChoices("StateStorage", "state_storage")
    )
    state_storage_account: str | None = Field(
        default=None,
        validation_alias=AliasChoices("StateStorage__accountName", "state_storage_account"),
    )
    webjobs_storage: SecretStr | None = Field(
        default=None, validation_alias=AliasChoices("AzureWebJobsStorage", "webjobs_storage")
    )
    webjobs_storage_account: str | None = Field(
        default=None,
        validation_alias=AliasChoices(
            "AzureWebJobsStorage__accountName", "webjobs_storage_account"
        ),
    )
    documents_queue: str = Field(default="documents", min_length=1)
    # The batch trigger binds %HEARTBEATS_QUEUE%; relays send heartbeats there (contract C1).
    heartbeats_queue: str = Field(default="heartbeats", min_length=1)
    notifications_topic: str = Field(default="notifications", min_length=1)
    # The sweep's work queue: one message per due event (functions.pipeline.workqueue).
    reconcile_queue: str = Field(default="reconcile", min_length=1)
    state_table_prefix: str = Field(default="sebridge", pattern=r"^[A-Za-z][A-Za-z0-9]{0,40}$")
    # APP_SECRET: the app's own master secret, never shared with relays (Key Vault reference
    # in production, >= 32 characters). It wraps the relays' callback keys at rest
    # (functions.identity.keys) and keys the approval page tokens (HMAC-SHA256(APP_SECRET,
    # b"page-token/v1")); rotating it voids the forms open now and the stored callback keys
    # (each relay's next message stores its key again). RELAY_KEY (one key every relay
    # shared) is gone: each relay's key is its own.
    app_secret: SecretStr | None = Field(default=None, min_length=32)
    # APP_SECRET_PREVIOUS: during a rotation, the secret APP_SECRET replaced (a Key Vault
    # reference too). Callback keys stored under it still unwrap, and are wrapped under
    # APP_SECRET again the first time they are read (functions.identity.registry); approval
    # forms signed with it are still accepted. Remove it once the relays have been heard
    # from (a key is read at each relay message and each callback); a key still wrapped
    # under it then is learned again at the VM's next message, as without it.
    app_secret_previous: SecretStr | None = Field(default=None, min_length=32)

    @property
    def page_token_key(self) -> bytes | None:
        """The approval page tokens' key; None when APP_SECRET is unset or unresolved."""
        return _page_token_key(self.app_secret)

    @property
    def page_token_keys(self) -> tuple[bytes, ...]:
        """The keys a page token may be signed with: APP_SECRET's, then during a rotation
        APP_SECRET_PREVIOUS's (forms opened before the rotation still work)."""
        keys = (_page_token_key(self.app_secret), _page_token_key(self.app_secret_previous))
        return tuple(k for k in keys if k is not None)

    public_base_url: str | None = None
    # The app's real host name, injected by App Service (Flex apps are not NAME.azurewebsites.net);
    # PUBLIC_BASE_URL defaults from it.
    website_hostname: str | None = Field(
        default=None, validation_alias=AliasChoices("WEBSITE_HOSTNAME", "website_hostname")
    )
    # App Service injects WEBSITE_AUTH_ENABLED=True when App Service Authentication runs in
    # front of the app: only then are the X-MS-CLIENT-PRINCIPAL headers the platform's own.
    website_auth_enabled: bool = Field(
        default=False,
        validation_alias=AliasChoices("WEBSITE_AUTH_ENABLED", "website_auth_enabled"),
    )
    # Who may use the approval and fleet pages: members of this Entra group (object id) or
    # holders of this app role. Neither set: the pages are off and cards carry no buttons.
    operators_group_id: str | None = None
    operators_app_role: str | None = None
    relay_silent_after_seconds: int = Field(default=600, ge=30)
    # Ended events (with their reporters and audit rows), rejected envelopes and VMs not
    # heard from are deleted by the watchdog this many days later.
    retention_days: int = Field(default=30, ge=1, le=3650)
    # Retention is a trickle, not a job: each expired event costs 4 Table requests (list and
    # batch-delete its partition and its audit rows), so 3 a sweep keep a sweep near 30
    # requests and still delete 4,320 events a day, more than 100,000 VMs with one event a
    # month end (about 3,300). A backlog (a fleet-wide wave) drains over the days after.
    retention_events_per_sweep: int = Field(default=3, ge=1, le=100)
    approval_margin_seconds: int = Field(default=10, ge=0)
    # How long one ingest invocation keeps retrying an approval before leaving the rest to
    # the watchdog, so a slow relay never holds a VM's session for the whole notice period.
    approval_budget_seconds: int = Field(default=60, ge=1)
    # Agentless mode (functions.approvers.arm): which approvers, in order, and how ARM is
    # reached. APPROVERS="relay,arm" tries relays first and acknowledges through ARM when
    # no relay can approve; "arm" or "relay" alone use only that one.
    approvers: str = Field(default="relay,arm")
    eventgrid_queue: str = Field(default="scheduled-events", min_length=1)
    # An event only Event Grid reported is ended this long after NotBefore if its
    # Completed/Canceled never arrives (no relay silence can end it).
    eventgrid_end_after_seconds: int = Field(default=6 * 3600, ge=60)
    arm_endpoint: str = Field(default="https://management.azure.com")
    arm_api_version: str = Field(default="2025-11-01", pattern=r"^\d{4}-\d{2}-\d{2}(-preview)?$")
    # How long relays are tried (from their first attempt) before ARM takes over, when both
    # are configured; never later than APPROVAL_MARGIN_SECONDS before NotBefore.
    arm_fallback_after_seconds: int = Field(default=30, ge=0)
    # --- Per-VM identity (functions.identity, functions.pipeline.admission) ---
    # The port every relay's callback listens on: the app calls Azure's address for the VM
    # on this port and path, never an address a VM wrote.
    relay_callback_port: int = Field(default=8492, ge=1, le=65535)
    # A PEM bundle that replaces the trust shipped in functions/identity/trust (its
    # self-signed certificates are roots, the others intermediates). Empty, as in Azure:
    # the shipped roots and intermediates. Set only for the simulator (tests, the demo).
    attestation_ca_pem: str | None = None
    # The signer certificate must name one of these exactly or a subdomain of it (public,
    # US Gov, China); no wildcard is required.
    attestation_signer_suffixes: str = "metadata.azure.com,metadata.azure.us,metadata.azure.cn"
    # enforce (default): a message whose attested document fails is rejected. report: it is
    # logged ("would reject", the failed check) and counted (fleet page, `admission` log
    # line), and admitted only if it carries its VM's current callback key, enrolled by an
    # earlier attested message (only that VM's relay holds it); otherwise rejected as in
    # enforce. It never enrols a key, never asks Resource Graph, never waits (issue 32).
    attestation_mode: Literal["enforce", "report"] = "enforce"
    # Subscriptions whose VMs may send (comma-separated ids). Empty: any subscription the
    # app's identity can read in Resource Graph (its Reader scopes are the allow-list then).
    allowed_subscriptions: str = ""
    # How long Resource Graph's answer about a VM (name, sets, address) is reused.
    vm_facts_max_age_seconds: int = Field(default=6 * 3600, ge=60, le=7 * 86400)
    # The bulk sync (functions.identity.sync, timer `identity_sync` every 5 minutes) reads
    # every VM in scope from Resource Graph this often; keep it below the facts' max age so
    # enrolled VMs' facts never go stale between passes. Each run works at most
    # RESOURCE_GRAPH_SYNC_BUDGET_SECONDS, then resumes from its stored cursor.
    resource_graph_sync_hours: int = Field(default=3, ge=1, le=24)
    resource_graph_sync_budget_seconds: int = Field(default=240, ge=10, le=290)
    # A VM may not announce maintenance further ahead than this (it would hold capacity).
    max_not_before_days: int = Field(default=7, ge=1, le=365)
    # What one VM may send in an hour; beyond it a message is rejected with the reason. A
    # relay sends when its IMDS document changes and sees a few new events a month.
    max_messages_per_vm_hour: int = Field(default=720, ge=10)
    max_new_events_per_vm_hour: int = Field(default=50, ge=5)
    # New callback keys one VM may present in a UTC day (a rotation every 30 days, a
    # reinstall, a reimage): each asks Resource Graph again. Beyond it the message is
    # rejected with the reason before any query (issue 27), counted in the identities row.
    max_new_keys_per_vm_day: int = Field(default=4, ge=1, le=100)

    @model_validator(mode="after")
    def _urls(self) -> Settings:
        for setting, value in (
            ("APP_SECRET", self.app_secret),
            ("APP_SECRET_PREVIOUS", self.app_secret_previous),
            ("ServiceBusConnection", self.service_bus_connection),
            ("StateStorage", self.state_storage),
            ("AzureWebJobsStorage", self.webjobs_storage),
        ):
            if unresolved_reference(value):
                raise ValueError(unresolved_message(setting))
        strangers = [s for s in self.subscription_allow_list if not _GUID.match(s)]
        if strangers:
            raise ValueError(
                f"ALLOWED_SUBSCRIPTIONS: {', '.join(repr(s) for s in sorted(strangers))} is not "
                "a subscription id (a GUID like 00000000-0000-0000-0000-000000000000); no VM "
                "would ever be admitted from it"
            )
        if self.public_base_url and not self.public_base_url.startswith(("http://", "https://")):
            raise ValueError("PUBLIC_BASE_URL must be an http(s) URL")
        if not self.arm_endpoint.startswith(("https://", "http://")):
            raise ValueError("ARM_ENDPOINT must be an http(s) URL")
        order = self.approver_order
        if not order or len(set(order)) != len(order) or not set(order) <= {"relay", "arm"}:
            raise ValueError(
                f"APPROVERS {self.approvers!r} must list relay and/or arm, each once, in order "
                "(e.g. relay,arm)"
            )
        return self

    @property
    def signer_suffixes(self) -> tuple[str, ...]:
        return tuple(
            s.strip().lstrip("*.").casefold()
            for s in self.attestation_signer_suffixes.split(",")
            if s.strip()
        )

    @property
    def subscription_allow_list(self) -> frozenset[str]:
        return frozenset(
            s.strip().casefold() for s in self.allowed_subscriptions.split(",") if s.strip()
        )

    @property
    def approver_order(self) -> tuple[str, ...]:
        return tuple(p.strip().casefold() for p in self.approvers.split(",") if p.strip())

    @property
    def app_secret_bytes(self) -> bytes | None:
        """APP_SECRET as bytes; None when unset (an unresolved reference stops the app)."""
        return _secret_bytes(self.app_secret)

    @property
    def app_secret_previous_bytes(self) -> bytes | None:
        """APP_SECRET_PREVIOUS as bytes; None when unset or the same as APP_SECRET."""
        previous = _secret_bytes(self.app_secret_previous)
        return None if previous == self.app_secret_bytes else previous

    @cached_property
    def policy(self) -> PolicyLoad:
        """The policy from `POLICY__*`; read once per Settings object (per host start)."""
        load = load_policy()
        if load.error:
            log.error("POLICY INVALID, failing closed (nothing is approved): %s", load.error)
        return load

    def with_policy(self, load: PolicyLoad) -> Settings:
        """A copy using `load` as its policy (tests, the CLI, the local host)."""
        copy = self.model_copy()
        copy.__dict__["policy"] = load
        return copy

    def table_connection(self) -> tuple[str, str]:
        """("connection_string", value) or ("account", table endpoint URL) for state."""
        for secret, account in (
            (self.state_storage, self.state_storage_account),
            (self.webjobs_storage, self.webjobs_storage_account),
        ):
            if secret is not None and secret.get_secret_value():
                return "connection_string", secret.get_secret_value()
            if account:
                return "account", f"https://{account}.table.core.windows.net"
        raise SettingsInvalid(
            "no state storage: set StateStorage (connection string) or StateStorage__accountName "
            "(or AzureWebJobsStorage / AzureWebJobsStorage__accountName)"
        )

    def service_bus(self) -> tuple[str, str]:
        """("connection_string", value) or ("namespace", fully qualified namespace)."""
        if (
            self.service_bus_connection is not None
            and self.service_bus_connection.get_secret_value()
        ):
            return "connection_string", self.service_bus_connection.get_secret_value()
        if self.service_bus_namespace:
            return "namespace", self.service_bus_namespace
        raise SettingsInvalid(
            "no Service Bus: set ServiceBusConnection (connection string) or "
            "ServiceBusConnection__fullyQualifiedNamespace"
        )

    @property
    def base_url(self) -> str | None:
        """Where people reach the app: PUBLIC_BASE_URL, else https://WEBSITE_HOSTNAME."""
        if self.public_base_url:
            return self.public_base_url.rstrip("/")
        if self.website_hostname:
            return f"https://{self.website_hostname.strip().rstrip('/')}"
        return None

    def pages_off_reason(self) -> str | None:
        """Why the signed-in pages are off (None: they are on). Each is a setting to fix."""
        if not (self.operators_group_id or self.operators_app_role):
            return "neither OPERATORS_GROUP_ID nor OPERATORS_APP_ROLE is set"
        if not self.website_auth_enabled:
            return (
                "App Service Authentication is not enabled on this app (WEBSITE_AUTH_ENABLED), "
                "so nobody's sign-in can be trusted"
            )
        if self.base_url is None:
            return "neither PUBLIC_BASE_URL nor WEBSITE_HOSTNAME is set"
        if self.page_token_key is None:
            return "APP_SECRET is not set (it keys the approval page's form)"
        return None

    def status_url(self) -> str | None:
        """The fleet page; None while the pages are off (the JSON API needs a function key,
        which never goes into a card)."""
        if self.pages_off_reason() is not None:
            return None
        return f"{self.base_url}/api/pages/fleet"

    def approve_url(self, event_id: str) -> str | None:
        """The event's approval page; None while the pages are off."""
        if self.pages_off_reason() is not None:
            return None
        return f"{self.base_url}/api/pages/events/{quote(event_id, safe='')}"


def _secret_bytes(secret: SecretStr | None) -> bytes | None:
    value = secret.get_secret_value().strip() if secret else ""
    return value.encode() if value else None


def _page_token_key(secret: SecretStr | None) -> bytes | None:
    value = _secret_bytes(secret)
    if value is None or unresolved_reference(value.decode()):
        return None
    return hmac.new(value, b"page-token/v1", hashlib.sha256).digest()


def load_settings(**overrides: object) -> Settings:
    """Settings from the environment, or one SettingsInvalid naming every bad setting."""
    try:
        return Settings(**overrides)  # type: ignore[arg-type]
    except ValidationError as exc:
        raise SettingsInvalid(f"invalid app settings: {summarize(exc)}") from None


def check_for_azure(settings: Settings) -> None:
    """What the Azure handlers need beyond defaults; raise SettingsInvalid if missing."""
    problems = []
    for check in (settings.table_connection, settings.service_bus):
        try:
            check()
        except SettingsInvalid as exc:
            problems.append(str(exc))
    if settings.app_secret is None:
        problems.append(
            "APP_SECRET is not set: relays' callback keys cannot be stored, so no relay can "
            "be called back"
        )
    if problems:
        raise SettingsInvalid("; ".join(problems))
