"""decide() on its own: each match criterion, paging defaults, windows, validation."""

from __future__ import annotations

from datetime import timedelta

import pytest
from pydantic import ValidationError

from functions.model.envelope import ScheduledEvent
from functions.model.policy import Match, Policy, PolicyLoad, Rule, Window, decide, is_impactful
from tests.functions.conftest import T0, event


def ev(**kwargs) -> ScheduledEvent:
    return ScheduledEvent.model_validate(event(**kwargs))


@pytest.mark.parametrize(
    ("match", "hit", "miss"),
    [
        (Match(event_types=("reboot",)), ev(), ev(event_type="Freeze")),
        (Match(sources=("User",)), ev(source="User"), ev()),
        (Match(statuses=("Started",)), ev(status="Started"), ev()),
        (Match(duration_at_least=0, duration_below=9), ev(duration=8), ev(duration=9)),
        (Match(duration_at_least=0), ev(duration=0), ev(duration=None)),
        (Match(resources=("db-*",)), ev(resources=("web", "DB-1")), ev(resources=("web",))),
    ],
)
def test_each_match_criterion(match, hit, miss):
    assert match.matches(hit) and not match.matches(miss)


def test_scale_set_match_uses_the_sets_of_the_named_vms():
    assert Match(scale_sets=("web",)).matches(ev(), ("WEB",))
    assert not Match(scale_sets=("web",)).matches(ev(), ("db",))


def test_first_matching_rule_wins_and_carries_its_channels():
    policy = Policy(
        rules=(
            Rule(
                name="a",
                match=Match(event_types=("Freeze",)),
                action="approve",
                channels=("teams",),
                severity="info",
            ),
            Rule(name="b", action="hold", page=False),
        )
    )
    first = decide(policy, ev(event_type="Freeze", duration=30), T0)
    assert (first.rule, first.action, first.channels, first.severity) == (
        "a",
        "approve",
        ("teams",),
        "info",
    )
    second = decide(policy, ev(event_type="Preempt"), T0)
    assert (second.rule, second.page) == ("b", False)  # the rule's page overrides defaults


def test_no_rule_matched_holds():
    policy = Policy(
        rules=(Rule(name="only-freeze", match=Match(event_types=("Freeze",)), action="approve"),)
    )
    assert decide(policy, ev(), T0).rule == "no-rule-matched"


def test_held_reboot_pages_only_outside_a_window():
    window = Window(days=("Sat",), start="10:00", end="11:00")
    policy = Policy(windows=(window,), rules=(Rule(name="hold", action="hold"),))
    inside = ev(not_before=T0 + timedelta(minutes=15))
    outside = ev(not_before=T0 + timedelta(hours=2))
    assert decide(policy, inside, T0).page is False
    assert decide(policy, outside, T0).page is True


def test_default_policy_drains_every_disruptive_event():
    """Issue 45: with no POLICY__* setting, every disruptive event, Platform or User, is
    drained then approved; only a short Freeze is approved at once (2f59d6a held Platform
    events and approved User ones undrained)."""
    policy = Policy()
    cases = {
        ("Reboot", "Platform", -1): ("drain", "drain-then-approve"),
        ("Redeploy", "Platform", -1): ("drain", "drain-then-approve"),
        ("Preempt", "Platform", -1): ("drain", "drain-then-approve"),
        ("Freeze", "Platform", 30): ("drain", "drain-then-approve"),
        ("Freeze", "Platform", 9): ("drain", "drain-then-approve"),
        ("Freeze", "Platform", -1): ("drain", "drain-then-approve"),
        ("Reboot", "User", -1): ("drain", "drain-then-approve"),
        ("Redeploy", "User", -1): ("drain", "drain-then-approve"),
        ("Terminate", "User", -1): ("drain", "terminate-drain"),
        ("Freeze", "Platform", 5): ("approve", "short-freeze"),
        ("Freeze", "Platform", 0): ("approve", "short-freeze"),
    }
    for (kind, source, duration), expected in cases.items():
        d = decide(policy, ev(event_type=kind, source=source, duration=duration), T0)
        assert (d.action, d.rule) == expected, (kind, source, duration)
    assert decide(policy, ev(event_type="Preempt"), T0).page is True
    assert not any(r.action == "hold" for r in policy.rules)  # hold is opt-in


def test_a_vm_with_no_working_drain_gets_microsofts_sample():
    """drain="none" (functions.model.drains.drain_for): Platform held to NotBefore, User
    approved at once, and the reason says so."""
    policy = Policy()
    platform = decide(policy, ev(event_type="Reboot"), T0, drain="none")
    assert platform.action == "hold"
    assert "no drain on this VM: held" in platform.reason
    user = decide(policy, ev(event_type="Redeploy", source="User"), T0, drain="none")
    assert user.action == "approve"
    assert "no drain on this VM" in user.reason
    # A scale-in with no drain is held, never deleted undrained at once (issue 33).
    terminate = decide(policy, ev(event_type="Terminate", source="User"), T0, drain="none")
    assert terminate.action == "hold"
    for kind in ("hook", "http", "readiness", None):
        assert decide(policy, ev(event_type="Reboot"), T0, drain=kind).action == "drain"
    # A short Freeze is approved whatever the drain.
    short = ev(event_type="Freeze", duration=5)
    assert decide(policy, short, T0, drain="none").action == "approve"


def test_rules_match_tags_as_budgets_do():
    """Issue 45: a rule may match the VM's Azure tags (the identity sync's facts); unknown
    tags never match, so a later rule decides. 2f59d6a refused `match.tags` in a rule."""
    rules = (
        Rule(name="web-hold", match=Match(tags={"tier": ("web", "api-*")}), action="hold"),
        Rule(name="rest", action="drain"),
    )
    policy = Policy(rules=rules)
    assert decide(policy, ev(), T0, tags={"Tier": "web"}).rule == "web-hold"
    assert decide(policy, ev(), T0, tags={"tier": "api-eu"}).rule == "web-hold"
    assert decide(policy, ev(), T0, tags={"tier": "WEB"}).rule == "rest"  # values: exact case
    assert decide(policy, ev(), T0, tags={}).rule == "rest"
    assert decide(policy, ev(), T0).rule == "rest"


def test_fail_closed_decision():
    d = decide(PolicyLoad(policy=None, error="boom"), ev(source="User"), T0)
    assert (d.action, d.policy_error, d.page) == ("hold", "boom", True)


def test_impactful():
    assert not is_impactful(ev(event_type="Freeze", duration=5))
    assert is_impactful(ev(event_type="Freeze", duration=30))
    assert is_impactful(ev(event_type="Freeze", duration=-1))
    assert is_impactful(ev())


@pytest.mark.parametrize(
    "bad",
    [
        {"rules": []},
        {"rules": [{"name": "a", "action": "hold"}, {"name": "a", "action": "hold"}]},
        {"rules": [{"name": "a", "action": "hold", "channels": ["sms"]}]},
        {"rules": [{"name": "a", "action": "hold", "match": {"typo": 1}}]},
        {
            "rules": [
                {
                    "name": "a",
                    "action": "hold",
                    "match": {"duration_at_least": 9, "duration_below": 1},
                }
            ]
        },
        {"windows": [{"days": ["Someday"], "start": "01:00", "end": "02:00"}]},
        {"windows": [{"days": ["Mon"], "start": "25:00", "end": "02:00"}]},
        {"max_concurrent_per_set": 0},
    ],
)
def test_invalid_policies_are_rejected(bad):
    with pytest.raises(ValidationError):
        Policy.model_validate(bad)
