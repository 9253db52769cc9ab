"""What a channel's URL and key must look like to work, checked at start, not at the first event.

Two grades, because a wrong guess here must never silence a channel that works:

- **Unusable** (`unusable_url`): a URL no HTTP client can send to (`htps://...`, no host,
  spaces). Its channel is off, as a misconfiguration (`ChannelSettings.misconfigured`):
  `settings check` warns and every message it drops is recorded, instead of each event
  failing with `InvalidSchema`.
- **Implausible** (`endpoint_warnings`): a URL that can be sent to but not where the vendor
  takes it (a Teams URL on no Microsoft host, plain http over the network), or a PagerDuty
  routing key of the wrong shape. A warning (`--strict` refuses it); the channel stays on,
  since a proxy or a test receiver may be meant.

Messages name the scheme and the host only, never a path or a query: Teams and Slack URLs
carry their credential there.

Where the hosts and the key's shape come from:

- Teams: a Workflows webhook ("When a Teams webhook request is received") is a Power
  Automate flow. Its URL is on `*.logic.azure.com` (Learn's Get-AzLogicAppTriggerCallbackUrl
  example, Azure/azure-powershell `src/LogicApp/LogicApp/help/` @ 2fd47137:
  `https://prod-03.westus.logic.azure.com:443/workflows/...`; `logic.azure.us` and
  `logic.azure.cn` in the national clouds) or, for flows made since 2025, on
  `*.environment.api.powerplatform.com` (`.../powerautomate/automations/direct/workflows/...`).
  The older Office 365 connectors posted to `*.webhook.office.com`.
- Slack: incoming webhooks are `https://hooks.slack.com/services/...`.
- PagerDuty: PagerDuty/api-schema `reference/events-v2/openapiv3.json` @ 5cd58ff2: the
  server `https://events.pagerduty.com/v2` (EU accounts: `events.eu.pagerduty.com`), and
  `routing_key` "the GUID of one of your Events API V2 integrations", every example of which
  is 32 letters and digits (`e93facc04764012d7bfb002500d5d1a6`). PagerDuty's "API Access
  Keys" support page: REST API keys are 20 characters and fail on an Events API call.
"""

from __future__ import annotations

import ipaddress
import re
from urllib.parse import urlsplit

TEAMS_HOSTS = (
    "logic.azure.com",
    "logic.azure.us",
    "logic.azure.cn",
    "environment.api.powerplatform.com",
    "webhook.office.com",
)
SLACK_HOSTS = ("hooks.slack.com",)
PAGERDUTY_HOSTS = ("events.pagerduty.com", "events.eu.pagerduty.com")
ROUTING_KEY = re.compile(r"[A-Za-z0-9]{32}")

# setting -> (what it should be, the hosts it may name; empty: any host, https)
URL_SETTINGS: dict[str, tuple[str, tuple[str, ...]]] = {
    "TEAMS_WEBHOOK_URL": (
        "a Teams Workflows webhook (Power Automate: *.logic.azure.com or "
        "*.environment.api.powerplatform.com)",
        TEAMS_HOSTS,
    ),
    "SLACK_WEBHOOK_URL": (
        "a Slack incoming webhook (https://hooks.slack.com/services/...)",
        SLACK_HOSTS,
    ),
    "PAGERDUTY_EVENTS_URL": (
        "PagerDuty's Events API (https://events.pagerduty.com/v2/enqueue)",
        PAGERDUTY_HOSTS,
    ),
    "WEBHOOK_URL": ("your receiver, over https", ()),
}


def unusable_url(setting: str, value: str) -> str | None:
    """Why no request can ever be sent to `value` (None: one can)."""
    text = value.strip()
    try:
        parts = urlsplit(text)
    except ValueError:
        return f"{setting} is not a URL"
    if "@" not in parts.netloc and "@" in parts.query + parts.fragment:
        # `https://user:pa?ss@host` splits at the ?: "host" `user`, "port" `pa`. Neither
        # is said (both are the credentials), only how to write them.
        return (
            f"{setting} has a ? or # before its @: a user name or password must write them "
            "percent-encoded (%3F, %23)"
        )
    try:
        parts.port  # noqa: B018 - raises on a port that is not a number
    except ValueError:
        # Not the parser's words: they quote the "port", which can be part of a password.
        return f"{setting} is not a URL (its port is not a number)"
    if parts.scheme.lower() not in ("http", "https"):
        shown = f"{parts.scheme}://" if parts.scheme else "no scheme"
        return f"{setting} has {shown}, not https://"
    if not parts.hostname:
        return f"{setting} names no host"
    if any(c.isspace() for c in text):
        return f"{setting} has a space in it"
    return None


def endpoint_warnings(setting: str, value: str) -> list[str]:
    """What is probably wrong with a usable URL (empty when it looks like the vendor's)."""
    if unusable_url(setting, value) is not None:
        return []
    parts = urlsplit(value.strip())
    host = (parts.hostname or "").lower().rstrip(".")
    what, hosts = URL_SETTINGS[setting]
    out = []
    if parts.scheme.lower() == "http" and not _loopback(host):
        out.append(
            f"{setting} is plain http to {host}: what it sends crosses the network "
            "unencrypted (use https)"
        )
    if hosts and not any(host == h or host.endswith("." + h) for h in hosts):
        out.append(
            f"{setting} points at {host}, which is not {what}; a proxy or a test receiver? "
            "Otherwise nothing will arrive"
        )
    return out


def routing_key_problem(value: str) -> str | None:
    """Why PAGERDUTY_ROUTING_KEY is not an Events API v2 integration key (None: it is)."""
    key = value.strip()
    if ROUTING_KEY.fullmatch(key):
        return None
    shape = f"{len(key)} characters" + ("" if key.isalnum() else ", not all letters and digits")
    return (
        f"PAGERDUTY_ROUTING_KEY has {shape}: an Events API v2 integration key is 32 letters "
        "and digits (the service's Integrations tab, 'Integration Key'; a REST API key is "
        "20 and does not work here)"
    )


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
