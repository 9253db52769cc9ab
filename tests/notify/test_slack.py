"""The Slack channel: Block Kit messages checked with Slack's own SDK (slack_sdk's block
models, pinned in requirements-dev.txt), the same one-post-per-transition rules as Teams,
and real HTTP against a local receiver that answers like hooks.slack.com (200 "ok",
400 "invalid_payload", 404 "no_service", 429 with Retry-After)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
import requests
from slack_sdk.errors import SlackObjectFormationError
from slack_sdk.models.blocks import Block

from functions.model.event import Transition
from functions.notify import dispatch, slack
from functions.notify.delivery import PermanentDeliveryError, RetryPolicy, Transport
from functions.notify.settings import ChannelSettings
from functions.store.deliveries import DeliveryLedger
from local.slack_receiver import SlackReceiver, check_blocks
from tests.notify.factory import NOW, decision, event, note

HOSTILE = (
    "<!channel> *URGENT* see <https://evil.example|the fix> or mail ops@evil.example\n"
    "# heading `code` ~strike~ _it_ &amp; > quote"
)


def assert_valid_message(message: dict[str, Any]) -> None:
    """What Slack's SDK accepts: each block parses into its model with nothing dropped
    (to_dict gives the block back), and validates against Block Kit's limits."""
    assert set(message) == {"text", "mrkdwn", "blocks"}
    assert isinstance(message["text"], str) and message["text"]
    assert 1 <= len(message["blocks"]) <= 50
    for block in message["blocks"]:
        model = Block.parse(block)
        assert model is not None, block
        model.validate_json()  # raises SlackObjectFormationError past a limit
        assert model.to_dict() == block
    assert check_blocks(message["blocks"]) == []  # and the local receiver agrees


def plain_texts(message: dict[str, Any]) -> list[tuple[str, str]]:
    found: list[tuple[str, str]] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if node.get("type") in ("plain_text", "mrkdwn"):
                found.append((node["type"], node["text"]))
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk(message["blocks"])
    return found


@pytest.mark.parametrize("transition", list(Transition))
def test_every_transition_is_valid_block_kit(transition: Transition) -> None:
    with_event = transition not in {
        Transition.RELAY_SILENT,
        Transition.RELAY_RECOVERED,
        Transition.POLICY_INVALID,
        Transition.POLICY_VALID,
        Transition.CONFIG_INVALID,
        Transition.CONFIG_VALID,
    }
    item = note(
        transition,
        event("EV-1") if with_event else None,
        decision(policy_error="x" * 5000)
        if transition is Transition.POLICY_INVALID
        else decision(),
        vm=None if with_event else "web_0",
        detail="relay answered 409: already approved",
    )
    message = slack.build_message(item, NOW)
    assert_valid_message(message)
    assert slack.wants(item) is (transition is not Transition.SCHEDULED)


def test_the_decided_message_says_what_when_and_why_with_an_approve_button() -> None:
    message = slack.build_message(note(Transition.DECIDED, event("EV-1"), decision()), NOW)
    header = message["blocks"][0]
    assert header["type"] == "header"
    assert header["text"]["text"].startswith("Reboot")
    fields = [f["text"] for f in message["blocks"][1]["fields"]]
    labels = [f.split(":")[0] for f in fields]
    assert labels == ["What", "VMs", "When", "Why", "Source", "Decision", "Event"]
    assert any("in 12 min" in f for f in fields)
    assert any("rule reboot-window" in f for f in fields)
    (actions,) = [b for b in message["blocks"] if b["type"] == "actions"]
    buttons = {b["text"]["text"]: b["url"] for b in actions["elements"]}
    assert buttons == {
        "Approve manually": "https://bridge.example/api/approve?event=E",
        "Fleet status": "https://bridge.example/api/status",
    }


@pytest.mark.parametrize(
    ("transition", "approve"),
    [
        (Transition.DECIDED, True),
        (Transition.OVERDUE, True),
        (Transition.APPROVED, False),
        (Transition.COMPLETED, False),
    ],
)
def test_the_approval_link_only_where_an_operator_can_still_act(
    transition: Transition, approve: bool
) -> None:
    """Like Teams: the signed-in approval page on decided and overdue only."""
    message = slack.build_message(note(transition, event("EV-1"), decision()), NOW)
    titles = [
        e["text"]["text"]
        for b in message["blocks"]
        if b["type"] == "actions"
        for e in b["elements"]
    ]
    assert ("Approve manually" in titles) is approve
    assert "Fleet status" in titles


def test_without_a_public_url_there_are_no_buttons() -> None:
    from functions.model.event import Links

    item = note(Transition.DECIDED, event("EV-1"), decision(), links=Links())
    message = slack.build_message(item, NOW)
    assert [b for b in message["blocks"] if b["type"] == "actions"] == []
    assert_valid_message(message)


def test_vm_text_is_never_formatting_a_link_or_a_mention() -> None:
    """Description and names come from VMs: only plain_text, one line, links broken."""
    snapshot = event("EV-<!here>", description=HOSTILE, resources=("web_0", "evil.example"))
    message = slack.build_message(note(Transition.DECIDED, snapshot, decision()), NOW)
    assert_valid_message(message)
    kinds = {kind for kind, _ in plain_texts(message)}
    assert kinds == {"plain_text"}
    why = next(t for _, t in plain_texts(message) if t.startswith("Why:"))
    assert "\n" not in why
    assert "https://evil.example" not in why and "evil.example" not in why
    assert why.replace("\u200b", "").startswith("Why: <!channel> *URGENT*")
    # The fallback text Slack parses for <...>: entities, and mrkdwn off.
    assert message["mrkdwn"] is False
    assert "<" not in message["text"] and ">" not in message["text"]


def test_long_texts_are_cut_to_block_kit_limits() -> None:
    snapshot = event(
        "EV-1", description="d" * 10_000, resources=tuple(f"vm{i}" for i in range(900))
    )
    item = note(Transition.DECIDED, snapshot, decision(reason="r" * 5000), detail="x" * 9000)
    message = slack.build_message(item, NOW)
    assert_valid_message(message)
    assert all(len(f["text"]) <= 2000 for f in message["blocks"][1]["fields"])
    assert len(message["blocks"][2]["elements"][0]["text"]) <= 3000
    assert len(message["blocks"][0]["text"]["text"]) <= 150


def test_the_sdk_refuses_what_block_kit_refuses() -> None:
    """The check above can fail: a header over 150 characters is refused by the SDK and by
    the local receiver alike."""
    block = {"type": "header", "text": {"type": "plain_text", "text": "h" * 151, "emoji": False}}
    with pytest.raises(SlackObjectFormationError):
        Block.parse(block).validate_json()
    assert check_blocks([block]) != []


# ---------------------------------------------------------------- real HTTP


@pytest.fixture
def receiver() -> Iterator[SlackReceiver]:
    with SlackReceiver() as running:
        yield running  # type: ignore[misc]


def transport(sleeps: list[float] | None = None) -> Transport:
    policy = RetryPolicy(attempts=3, backoff_seconds=0.001, max_wait_seconds=5)
    record = sleeps if sleeps is not None else []
    return Transport(requests.Session(), policy, sleep=record.append)


def test_posts_to_a_slack_webhook_which_answers_ok(receiver: SlackReceiver) -> None:
    item = note(Transition.DECIDED, event("EV-1"), decision())
    assert slack.send(item, url=receiver.url, transport=transport())
    (posted,) = receiver.received
    assert posted.status == 200 and posted.headers["Content-Type"] == "application/json"
    assert_valid_message(posted.body)
    assert "Reboot" in SlackReceiver.message_text(posted)


def test_a_rate_limited_post_waits_for_retry_after(receiver: SlackReceiver) -> None:
    receiver.rate_limit_next(1, retry_after=3)
    sleeps: list[float] = []
    assert slack.send(
        note(Transition.APPROVED, event("EV-1")), url=receiver.url, transport=transport(sleeps)
    )
    assert [r.status for r in receiver.received] == [429, 200]
    assert sleeps == [3.0]


def test_an_unknown_webhook_is_refused_for_good(receiver: SlackReceiver) -> None:
    """404 no_service (revoked webhook): no retry can help."""
    with pytest.raises(PermanentDeliveryError) as caught:
        slack.send(
            note(Transition.APPROVED, event("EV-1")),
            url=receiver.base_url + "/services/T/B/x",
            transport=transport(),
        )
    assert caught.value.status == 404 and "no_service" in caught.value.reason
    assert len(receiver.received) == 1


def test_an_invalid_payload_is_refused_for_good(receiver: SlackReceiver) -> None:
    from functions.notify.delivery import post_json

    body = json.dumps({"blocks": [{"type": "header", "text": {"type": "mrkdwn", "text": "x"}}]})
    with pytest.raises(PermanentDeliveryError) as caught:
        post_json(transport(), "slack", receiver.url, body.encode())
    assert caught.value.status == 400 and "invalid_payload" in caught.value.reason
    with pytest.raises(PermanentDeliveryError) as caught:
        post_json(transport(), "slack", receiver.url, b"{}")
    assert "no_text" in caught.value.reason


@pytest.fixture
def ledger(azurite: str) -> DeliveryLedger:
    return DeliveryLedger.from_connection_string(
        azurite, "s" + uuid.uuid4().hex[:12]
    ).ensure_table()


def test_one_post_per_transition_across_redeliveries(
    receiver: SlackReceiver, ledger: DeliveryLedger
) -> None:
    settings = ChannelSettings(slack_webhook_url=receiver.url)
    snapshot = event("EV-S")
    notes = [
        note(Transition.SCHEDULED, snapshot),
        note(Transition.DECIDED, snapshot, decision()),
        note(Transition.APPROVED, snapshot, occurred_at=NOW + timedelta(minutes=1)),
        note(Transition.COMPLETED, snapshot, occurred_at=NOW + timedelta(minutes=9)),
    ]
    for _ in range(2):  # every message delivered twice (Service Bus is at-least-once)
        for item in notes:
            dispatch.deliver(
                "slack", item.to_json(), settings=settings, transport=transport(), ledger=ledger
            )
    headers = [r.body["blocks"][0]["text"]["text"] for r in receiver.received]
    assert len(headers) == 3  # scheduled is covered by decided; nothing posted twice
    assert [h.split(":")[0] for h in headers] == [
        "Reboot scheduled",
        "Reboot approved",
        "Reboot completed",
    ]
    assert ledger.get("event:EV-S:decided", "slack").status == "posted"
    assert ledger.get("event:EV-S:scheduled", "slack") is None


def test_a_rule_can_keep_an_event_off_slack(receiver: SlackReceiver) -> None:
    settings = ChannelSettings(slack_webhook_url=receiver.url)
    item = note(Transition.DECIDED, event("EV-1"), decision(channels=("teams",)))
    assert not dispatch.deliver("slack", item.to_json(), settings=settings, transport=transport())
    assert receiver.received == []


def test_off_without_a_url_and_refused_with_an_unresolved_reference() -> None:
    assert ChannelSettings().off_reason("slack") == "SLACK_WEBHOOK_URL is not set"
    broken = ChannelSettings(slack_webhook_url="@Microsoft.KeyVault(SecretUri=https://v/x)")
    assert "SLACK_WEBHOOK_URL" in (broken.off_reason("slack") or "")
    assert broken.misconfigured("slack")
