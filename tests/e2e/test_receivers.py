"""The local receivers answer like the services they stand in for, and refuse what they would."""

from __future__ import annotations

import requests

from local.receivers import (
    DrainHookReceiver,
    PagerDutyReceiver,
    TeamsReceiver,
    WebhookReceiver,
    check_adaptive_card,
)

CARD = {"type": "AdaptiveCard", "version": "1.5", "body": [{"type": "TextBlock", "text": "Hi"}]}
TEAMS_MESSAGE = {
    "type": "message",
    "attachments": [
        {
            "contentType": "application/vnd.microsoft.card.adaptive",
            "contentUrl": None,
            "content": CARD,
        }
    ],
}
KEY = "r" * 32


def test_teams_accepts_a_workflows_message_with_202():
    with TeamsReceiver() as teams:
        response = requests.post(teams.url, json=TEAMS_MESSAGE, timeout=5)
        assert response.status_code == 202
        assert [r.accepted for r in teams.received] == [True]
        assert TeamsReceiver.card_text(teams.received[0]) == "Hi"


def test_teams_refuses_a_card_newer_than_15_and_a_bare_card():
    newer = {**TEAMS_MESSAGE, "attachments": [{**TEAMS_MESSAGE["attachments"][0]}]}
    newer["attachments"][0]["content"] = {**CARD, "version": "1.6"}
    with TeamsReceiver() as teams:
        assert requests.post(teams.url, json=newer, timeout=5).status_code == 400
        assert requests.post(teams.url, json=CARD, timeout=5).status_code == 400
        problems = [p for r in teams.received for p in r.problems]
        assert any("newer than Teams renders" in p for p in problems)
        assert any('"type" must be "message"' in p for p in problems)
        assert teams.accepted() == []


def test_adaptive_card_rules():
    assert check_adaptive_card(CARD) == []
    assert check_adaptive_card({"type": "AdaptiveCard", "version": "x"})
    assert check_adaptive_card({**CARD, "body": [{"text": "no type"}]})


def test_pagerduty_trigger_answers_202_with_the_dedup_key():
    event = {
        "routing_key": KEY,
        "event_action": "trigger",
        "dedup_key": "EVENT-1",
        "payload": {"summary": "Spot eviction", "source": "spot-1", "severity": "critical"},
    }
    with PagerDutyReceiver() as pd:
        response = requests.post(pd.url, json=event, timeout=5)
        assert response.status_code == 202
        assert response.json() == {
            "status": "success",
            "message": "Event processed",
            "dedup_key": "EVENT-1",
        }


def test_pagerduty_refuses_what_the_events_api_refuses():
    bad = {
        "routing_key": "short",
        "event_action": "trigger",
        "payload": {"summary": "x" * 1025, "source": "", "severity": "fatal"},
    }
    with PagerDutyReceiver() as pd:
        response = requests.post(pd.url, json=bad, timeout=5)
        assert response.status_code == 400
        body = response.json()
        assert body["status"] == "invalid event"
        assert len(body["errors"]) == 4  # key, summary length, source, severity
        resolve = {"routing_key": KEY, "event_action": "resolve"}
        assert requests.post(pd.url, json=resolve, timeout=5).status_code == 400


def test_injected_failures_come_first_then_success():
    with WebhookReceiver() as hook:
        hook.fail_next(2, status=429, headers={"Retry-After": "0"})
        statuses = [requests.post(hook.url, json={"n": i}, timeout=5) for i in range(3)]
        assert [r.status_code for r in statuses] == [429, 429, 200]
        assert statuses[0].headers["Retry-After"] == "0"
        assert len(hook.wait_for(lambda got: len(got) == 1, timeout=1)) == 1


def test_webhook_verifier_refuses_unsigned_requests():
    with WebhookReceiver(
        verify=lambda headers, raw: None if "X-Sig" in headers else "unsigned"
    ) as hook:
        assert requests.post(hook.url, json={}, timeout=5).status_code == 400
        assert (
            requests.post(hook.url, json={}, headers={"X-Sig": "1"}, timeout=5).status_code == 200
        )
        assert hook.received[0].problems == ("signature: unsigned",)


def test_slow_drain_hook_and_on_receive():
    seen = []
    with DrainHookReceiver(delay=0.2, on_receive=seen.append) as drain:
        assert requests.post(drain.url, json={"EventId": "E"}, timeout=5).json() == {
            "drained": True
        }
    assert [r.body for r in seen] == [{"EventId": "E"}]
