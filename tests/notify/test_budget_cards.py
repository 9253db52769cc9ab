"""Teams, Slack and PagerDuty say why an approval waits (issue 39): "waiting for budget
checkout-web (1 of 1: vm-a)", the words functions.model.budgets.waiting_text makes from a
budget slot row; VM names in it stay plain text."""

from __future__ import annotations

import pytest

from functions.model.budgets import Slot, waiting_text
from functions.model.event import Transition
from functions.notify import pagerduty, slack, teams
from functions.store.budget_slots import BudgetHolder, BudgetSlot
from tests.notify.factory import NOW, decision, event, note
from tests.notify.test_slack import assert_valid_message, plain_texts
from tests.notify.test_teams import _inert, _texts, assert_valid_card, facts

WAITING = waiting_text(Slot("checkout-web", "tag:service=checkout", 1), ["vm-a"])


def test_the_words_are_the_slot_rows():
    row = BudgetSlot(
        budget="checkout-web",
        group="tag:service=checkout",
        limit=1,
        holders=[BudgetHolder(vm="vm-a", event_id="E0", since=NOW)],
    )
    assert row.text() == WAITING == "waiting for budget checkout-web (1 of 1: vm-a)"


@pytest.mark.parametrize("transition", [Transition.DECIDED, Transition.OVERDUE])
def test_teams_says_what_the_approval_waits_for(transition):
    approve = decision(action="approve", rule="reboots", reason="")
    card = assert_valid_card(
        teams.build_message(note(transition, event(), approve, waiting=WAITING), now=NOW)
    )
    assert facts(card)["Waiting"] == WAITING
    plain = assert_valid_card(teams.build_message(note(transition, event(), approve), now=NOW))
    assert "Waiting" not in facts(plain)


@pytest.mark.parametrize("transition", [Transition.DECIDED, Transition.OVERDUE])
def test_slack_says_what_the_approval_waits_for(transition):
    message = slack.build_message(note(transition, event(), decision(), waiting=WAITING), NOW)
    assert_valid_message(message)
    fields = [text for _, text in plain_texts(message)]
    assert f"Waiting: {WAITING}" in [f.replace("\u200b", "") for f in fields]


def test_pagerduty_carries_it_in_the_details():
    overdue = note(Transition.DECIDED, event(), decision(page=True), waiting=WAITING)
    body = pagerduty.build_event(overdue, "r" * 32)
    assert body is not None and body["payload"]["custom_details"]["waiting"] == WAITING


def test_hostile_vm_names_in_the_waiting_text_stay_inert():
    hostile = "vm-<!here> *x* [a](https://evil.example)\n# h"
    words = waiting_text(Slot("b", "g", 1), [hostile])
    n = note(Transition.DECIDED, event(), decision(), waiting=words)
    for text in _texts(assert_valid_card(teams.build_message(n, now=NOW))):
        _inert(text)
    message = slack.build_message(n, NOW)
    assert_valid_message(message)
    assert {kind for kind, _ in plain_texts(message)} == {"plain_text"}
    waiting = next(t for _, t in plain_texts(message) if t.startswith("Waiting:"))
    assert "\n" not in waiting and "evil.example" not in waiting
