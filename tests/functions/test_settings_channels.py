"""Channel URLs and keys are checked at start, not at the first event (issue 38): a URL no
request can be sent to turns its channel off as a mistake, a host that is not the vendor's
and a routing key of the wrong shape are warnings that `--strict` refuses, and a deployment
that tells nobody anything says so."""

from __future__ import annotations

import pytest

from functions.notify.settings import ChannelSettings
from tests.functions.test_settings_check import BASE, run_check

NO_CHANNEL = {k: v for k, v in BASE.items() if k != "PAGERDUTY_ROUTING_KEY"}
SIG = "sig=SECRETsignature"
# Genuine shapes: the Learn example of Get-AzLogicAppTriggerCallbackUrl (Azure/azure-powershell
# src/LogicApp/LogicApp/help/Get-AzLogicAppTriggerCallbackUrl.md @ 2fd47137, its signature
# made up), a Power Automate flow made since 2025, a Slack incoming webhook, and PagerDuty's
# Events API with a key of PagerDuty/api-schema's examples (openapiv3.json @ 5cd58ff2).
GOOD = {
    "TEAMS_WEBHOOK_URL": "https://prod-03.westus.logic.azure.com:443/workflows/c4ed9335bc864140"
    "a11f4508d19acea3/triggers/manual/run?api-version=2016-06-01&sp=%2Ftriggers%2Fmanual%2Frun"
    f"&sv=1.0&{SIG}",
    "SLACK_WEBHOOK_URL": "https://hooks.slack.com/services/T00000000/B00000000/XXXXXXXXXXXXXXXX",
    "PAGERDUTY_ROUTING_KEY": "e93facc04764012d7bfb002500d5d1a6",
    "PAGERDUTY_EVENTS_URL": "https://events.eu.pagerduty.com/v2/enqueue",
}
POWER_PLATFORM = (
    "https://default0000000000000000000000000000.00.environment.api.powerplatform.com:443/"
    f"powerautomate/automations/direct/workflows/0000/triggers/manual/paths/invoke?{SIG}"
)


def test_strict_refuses_the_values_the_issue_found():
    """Both passed `settings check --strict` on 2cd3d60 and failed at the first event."""
    for env, setting, words in (
        ({"TEAMS_WEBHOOK_URL": f"htps://x.logic.azure.com/w?{SIG}"}, "teams", "htps://"),
        ({"PAGERDUTY_ROUTING_KEY": "abc"}, "pagerduty", "3 characters"),
    ):
        done = run_check({**NO_CHANNEL, **env}, "--strict")
        assert done.returncode == 2, done.stderr
        warnings = [line for line in done.stderr.splitlines() if line.startswith("warning: ")]
        assert any(f"{setting}: " in w and words in w for w in warnings), done.stderr
        assert "SECRET" not in done.stderr  # never the URL's credential
        assert run_check({**NO_CHANNEL, **env}).returncode == 0  # a warning, not a refusal


def test_vendor_urls_and_keys_pass_strict():
    for url in (GOOD["TEAMS_WEBHOOK_URL"], POWER_PLATFORM):
        done = run_check(
            {**NO_CHANNEL, **GOOD, "TEAMS_WEBHOOK_URL": url},
            "--strict",
        )
        warnings = [line for line in done.stderr.splitlines() if line.startswith("warning: ")]
        # Nothing about the channels (the reference policy may warn about its drain).
        assert [w for w in warnings if "terminate-drain" not in w] == [], warnings


@pytest.mark.parametrize(
    ("setting", "value", "words"),
    [
        ("TEAMS_WEBHOOK_URL", "https://example.org/teams", "not a Teams Workflows webhook"),
        ("SLACK_WEBHOOK_URL", "https://hooks.slack.example/services/x", "not a Slack incoming"),
        ("PAGERDUTY_EVENTS_URL", "https://events.pagerduty.org/v2/enqueue", "PagerDuty's Events"),
        ("WEBHOOK_URL", "http://receiver.example.org/hook", "plain http"),
        ("TEAMS_WEBHOOK_URL", "http://x.logic.azure.com/w", "plain http"),
    ],
)
def test_an_implausible_endpoint_is_a_warning_and_the_channel_stays_on(
    monkeypatch, setting, value, words
):
    values = {**GOOD, "WEBHOOK_URL": "https://r.example.org/h", "WEBHOOK_SECRET": "s" * 32}
    values[setting] = value
    channels = ChannelSettings(**{k.lower(): v for k, v in values.items()})
    found = [
        (c, w)
        for c in ("teams", "slack", "pagerduty", "webhook")
        for w in channels.endpoint_warnings(c)
    ]
    assert len(found) == 1 and words in found[0][1] and setting in found[0][1], found
    assert channels.off_reason(found[0][0]) is None  # a proxy or a test receiver may be meant


@pytest.mark.parametrize(
    "url",
    [
        "htps://hooks.slack.com/services/x",
        "hooks.slack.com/services/x",
        "https:///x",
        "https://hooks.slack.com:port/x",
        "https://hooks.slack.com/services/x y",
    ],
)
def test_a_url_nothing_can_be_sent_to_turns_the_channel_off_as_a_mistake(url):
    channels = ChannelSettings(slack_webhook_url=url)
    reason = channels.off_reason("slack") or ""
    assert reason.startswith("SLACK_WEBHOOK_URL ") and "refusing to use it" in reason
    assert channels.misconfigured("slack")  # reported, and each dropped message recorded
    assert "services" not in reason


def test_a_local_receiver_over_http_is_not_a_warning():
    channels = ChannelSettings(webhook_url="http://127.0.0.1:8080/h", webhook_secret="s" * 32)
    assert channels.off_reason("webhook") is None
    assert channels.endpoint_warnings("webhook") == []


def test_nobody_told_is_a_warning_unless_a_channel_or_an_alert_receiver_is_named():
    done = run_check(NO_CHANNEL, "--strict")
    assert done.returncode == 2
    assert "warning: channels: no channel is on" in done.stderr
    assert "nobody will hear of an event" in done.stderr
    for extra in (
        {"ALERT_EMAIL": "oncall@example.com"},
        {
            "ALERT_ACTION_GROUP_ID": "/subscriptions/x/resourceGroups/y/providers/"
            "microsoft.insights/actionGroups/oncall"
        },
        {"SLACK_WEBHOOK_URL": GOOD["SLACK_WEBHOOK_URL"]},
    ):
        assert "no channel is on" not in run_check({**NO_CHANNEL, **extra}).stderr, extra
    # A channel that is off is no channel.
    off = run_check({**NO_CHANNEL, "WEBHOOK_URL": "https://r.example.org/h"})
    assert "no channel is on" in off.stderr
