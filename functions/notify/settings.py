"""Channel settings from app settings. A channel whose settings are missing is off, and so is
one whose URL no request can be sent to (functions.notify.endpoints)."""

from __future__ import annotations

from functools import lru_cache

from pydantic import SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from functions.notify.endpoints import endpoint_warnings, routing_key_problem, unusable_url
from functions.settings import unresolved_message, unresolved_reference

PAGERDUTY_EVENTS_URL = "https://events.pagerduty.com/v2/enqueue"


class ChannelSettings(BaseSettings):
    """`TEAMS_WEBHOOK_URL`, `SLACK_WEBHOOK_URL`, `PAGERDUTY_ROUTING_KEY`,
    `PAGERDUTY_EVENTS_URL`, `WEBHOOK_URL`, `WEBHOOK_SECRET`, `WEBHOOK_SECRET_PREVIOUS`. URLs
    that embed a signature (Teams) or a token (Slack's hooks.slack.com/services/...) and keys
    are SecretStr so that neither a repr nor a log line can leak them."""

    model_config = SettingsConfigDict(extra="ignore", case_sensitive=False)

    teams_webhook_url: SecretStr | None = None
    slack_webhook_url: SecretStr | None = None
    pagerduty_routing_key: SecretStr | None = None
    pagerduty_events_url: str = PAGERDUTY_EVENTS_URL
    webhook_url: SecretStr | None = None
    webhook_secret: SecretStr | None = None
    # During a rotation: the secret WEBHOOK_SECRET replaced. Webhooks and the HTTP drain
    # hook are then signed with both (Standard Webhooks allows several signatures), so a
    # receiver still verifying with the old secret passes. Remove it once receivers use
    # the new one. Unusable (unresolved reference, bad whsec_): ignored, and reported.
    webhook_secret_previous: SecretStr | None = None

    def webhook_secrets(self) -> tuple[bytes, ...]:
        """WEBHOOK_SECRET, then WEBHOOK_SECRET_PREVIOUS when usable and different."""
        current = self.webhook_secret.get_secret_value().strip() if self.webhook_secret else ""
        if not current:
            return ()
        if self.previous_problem() is not None or not _present(self.webhook_secret_previous):
            return (current.encode(),)
        previous = self.webhook_secret_previous.get_secret_value().strip()  # type: ignore[union-attr]
        return (current.encode(),) if previous == current else (current.encode(), previous.encode())

    def previous_problem(self) -> str | None:
        """Why WEBHOOK_SECRET_PREVIOUS is not used although set (None: used, or unset)."""
        if not _present(self.webhook_secret_previous):
            return None
        if unresolved_reference(self.webhook_secret_previous):
            return (
                f"{unresolved_message('WEBHOOK_SECRET_PREVIOUS')}: signing with WEBHOOK_SECRET only"
            )
        from functions.notify.webhook import WebhookSecretInvalid, secret_key

        try:
            secret_key(self.webhook_secret_previous.get_secret_value())  # type: ignore[union-attr]
        except WebhookSecretInvalid as exc:
            text = str(exc).replace("WEBHOOK_SECRET", "WEBHOOK_SECRET_PREVIOUS")
            return f"{text}: signing with WEBHOOK_SECRET only"
        return None

    def off_reason(self, channel: str) -> str | None:
        """Why a channel is off, or None when it is on."""
        unresolved = self._unresolved(channel)
        if unresolved:
            return f"{unresolved_message(unresolved)}: refusing to use it"
        unusable = self._unusable(channel)
        if unusable:
            return f"{unusable}: refusing to use it"
        if channel == "teams":
            return None if _present(self.teams_webhook_url) else "TEAMS_WEBHOOK_URL is not set"
        if channel == "slack":
            return None if _present(self.slack_webhook_url) else "SLACK_WEBHOOK_URL is not set"
        if channel == "pagerduty":
            if _present(self.pagerduty_routing_key):
                return None
            return "PAGERDUTY_ROUTING_KEY is not set"
        if channel == "webhook":
            if not _present(self.webhook_url):
                return "WEBHOOK_URL is not set"
            if not _present(self.webhook_secret):
                return "WEBHOOK_URL is set but WEBHOOK_SECRET is not: refusing to send unsigned"
            from functions.notify.webhook import WebhookSecretInvalid, secret_key

            try:
                secret_key(self.webhook_secret.get_secret_value())  # type: ignore[union-attr]
            except WebhookSecretInvalid as exc:
                return f"{exc}: refusing to send unsigned"
            return None
        return f"unknown channel {channel!r}"

    def misconfigured(self, channel: str) -> bool:
        """Set up half-way (a URL without its secret, or a secret whose Key Vault reference
        did not resolve): off, but a mistake to report, unlike a channel left unset. An
        unusable WEBHOOK_SECRET_PREVIOUS too (the channel stays on, signing once)."""
        if self._unresolved(channel) or self._unusable(channel):
            return True
        if channel == "webhook" and self.previous_problem() is not None:
            return True
        return (
            channel == "webhook"
            and _present(self.webhook_url)
            and not _present(self.webhook_secret)
        )

    def endpoint_warnings(self, channel: str) -> list[str]:
        """What is probably wrong with an on channel's URL or key (functions.notify.endpoints):
        reported by `settings check`, the channel stays on."""
        if self.off_reason(channel) is not None:
            return []
        found = [w for name, value in self._urls(channel) for w in endpoint_warnings(name, value)]
        if channel == "pagerduty":
            problem = routing_key_problem(self.pagerduty_routing_key.get_secret_value())  # type: ignore[union-attr]
            found += [problem] if problem else []
        return found

    def _urls(self, channel: str) -> list[tuple[str, str]]:
        """(setting, value) of the channel's URLs that are set."""
        urls = {
            "teams": (("TEAMS_WEBHOOK_URL", self.teams_webhook_url),),
            "slack": (("SLACK_WEBHOOK_URL", self.slack_webhook_url),),
            # The Events API URL matters once there is a key to send.
            "pagerduty": (
                (("PAGERDUTY_EVENTS_URL", SecretStr(self.pagerduty_events_url)),)
                if _present(self.pagerduty_routing_key)
                else ()
            ),
            "webhook": (("WEBHOOK_URL", self.webhook_url),),
        }
        return [
            (name, value.get_secret_value())
            for name, value in urls.get(channel, ())
            if value is not None and _present(value) and not unresolved_reference(value)
        ]

    def _unusable(self, channel: str) -> str | None:
        """The first of the channel's URLs no request can be sent to (`htps://...`)."""
        for name, value in self._urls(channel):
            problem = unusable_url(name, value)
            if problem:
                return problem
        return None

    def _unresolved(self, channel: str) -> str | None:
        """The first of the channel's secret settings holding an unresolved Key Vault
        reference (App Service passes its text when it cannot read the secret)."""
        secrets = {
            "teams": (("TEAMS_WEBHOOK_URL", self.teams_webhook_url),),
            "slack": (("SLACK_WEBHOOK_URL", self.slack_webhook_url),),
            "pagerduty": (("PAGERDUTY_ROUTING_KEY", self.pagerduty_routing_key),),
            "webhook": (
                ("WEBHOOK_URL", self.webhook_url),
                ("WEBHOOK_SECRET", self.webhook_secret),
            ),
        }
        for setting, value in secrets.get(channel, ()):
            if unresolved_reference(value):
                return setting
        return None


def _present(value: SecretStr | None) -> bool:
    return value is not None and bool(value.get_secret_value().strip())


@lru_cache(maxsize=1)
def channel_settings() -> ChannelSettings:
    """Read once per worker process: app settings change only with a restart."""
    return ChannelSettings()
