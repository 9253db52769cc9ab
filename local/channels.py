"""The demo's view of the notification channels: what each one was handed and whether it
sends a given notification, decided by the channel code itself (never re-implemented here).
"""

from __future__ import annotations

import base64
import hmac
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from local.receivers import Receiver, WebhookReceiver

# A PagerDuty routing key has 32 characters; this one only ever reaches the local receiver.
LOCAL_ROUTING_KEY = "demo" + "0" * 28


@dataclass(frozen=True)
class Delivery:
    """One notification handed to one channel, and what came of it."""

    channel: str
    message_id: str
    event_id: str | None
    transition: str
    posted: bool  # False: the channel does not send this transition (or it is off)
    error: str | None
    action: str | None = None  # PagerDuty: trigger / resolve
    at: float = field(default_factory=time.time)


def webhook_verifier(secret: str) -> Callable[[dict[str, str], bytes], str | None]:
    """Check the bridge's Standard Webhooks signature the way a customer's receiver would
    (the README's recipe: whsec_ secret, "{id}.{timestamp}.{body}", any v1 signature)."""
    from functions.notify.webhook import secret_key, signature

    key = secret_key(secret)

    def verify(headers: dict[str, str], raw: bytes) -> str | None:
        lowered = {k.lower(): v for k, v in headers.items()}
        msg_id = lowered.get("webhook-id", "")
        stamp = lowered.get("webhook-timestamp", "")
        given = lowered.get("webhook-signature", "").split()
        if not msg_id or not stamp.isdigit() or not given:
            return "missing webhook-id / webhook-timestamp / webhook-signature"
        if abs(time.time() - int(stamp)) > 300:
            return "stale timestamp"
        expected = signature(key, msg_id, int(stamp), raw)
        return None if any(hmac.compare_digest(expected, s) for s in given) else "bad signature"

    return verify


def short_retries(policy_type: Any) -> Any:
    """The channels' retry policy with waits fit for a 60x demo (same attempts, short waits)."""
    return policy_type(
        backoff_seconds=0.2, max_wait_seconds=1.0, connect_timeout=2.0, read_timeout=5.0
    )


def slack_pacer(external: dict[str, str], time_scale: float) -> Any:
    """Slack's pacing in the demo: a real webhook (SLACK_WEBHOOK_URL) gets Slack's one post
    a second; the local receiver gets it at the demo's time scale, like every real-world
    wait here: at 60x, a second per post would leave Slack's messages a minute behind the
    maintenance they tell of."""
    from functions.notify.pacing import SLACK_INTERVAL_SECONDS, WebhookPacer

    if "slack" in external:
        return None  # the process's pacer: one a second
    return WebhookPacer(SLACK_INTERVAL_SECONDS / time_scale)


def routed(channel: str, note: Any, marks: Any = None) -> str | None:
    """Whether a channel sends this notification, as the channel code itself decides it
    (with `marks`, the channels' own: PagerDuty resolves only what it paged)."""
    from functions.notify import pagerduty, slack, teams

    decision = note.decision
    if decision is not None and channel not in decision.channels:
        return None
    if channel == "teams":
        return "Teams card" if teams.wants(note) else None
    if channel == "slack":
        return "Slack message" if slack.wants(note) else None
    if channel == "pagerduty":
        if marks is not None and pagerduty.never_paged(note, marks):
            return None
        action = pagerduty.action_for(note)
        return f"PagerDuty {action}" if action else None
    return channel


def pagerduty_action(channel: str, note: Any) -> str | None:
    if channel != "pagerduty":
        return None
    from functions.notify.pagerduty import action_for

    return action_for(note)


def channel_values(
    env: dict[str, str], external: dict[str, str], receivers: dict[str, Receiver]
) -> dict[str, Any]:
    """ChannelSettings fields: real endpoints from `env`, else the local receivers.

    Passed explicitly (the demo may run with an environment of its own, as the end-to-end
    tests do). The local webhook receiver is set to check the signature with the secret
    chosen here, the way a customer's receiver would.
    """
    local: dict[str, Any] = {}
    if "teams" in external:
        local["teams_webhook_url"] = env["TEAMS_WEBHOOK_URL"]
    if "pagerduty" in external:
        local["pagerduty_routing_key"] = env["PAGERDUTY_ROUTING_KEY"]
        local["pagerduty_events_url"] = external["pagerduty"]
    if "slack" in external:
        local["slack_webhook_url"] = env["SLACK_WEBHOOK_URL"]
    if "slack" in receivers:
        local["slack_webhook_url"] = receivers["slack"].url
    if "webhook" in external:
        local["webhook_url"] = env["WEBHOOK_URL"]
        local["webhook_secret"] = env.get("WEBHOOK_SECRET", "")
    if "teams" in receivers:
        local["teams_webhook_url"] = receivers["teams"].url
    if "pagerduty" in receivers:
        local["pagerduty_routing_key"] = LOCAL_ROUTING_KEY
        local["pagerduty_events_url"] = receivers["pagerduty"].url
    if "webhook" in receivers:
        # A secret the way the Standard Webhooks spec writes one.
        secret = "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode()
        local["webhook_url"] = receivers["webhook"].url
        local["webhook_secret"] = secret
        receiver = receivers["webhook"]
        assert isinstance(receiver, WebhookReceiver)
        receiver.verify = webhook_verifier(secret)
    return local
