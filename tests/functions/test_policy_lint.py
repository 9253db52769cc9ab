"""Rule order: an earlier rule that keeps a drain rule from its events is refused; dead
rules and an approve over a later hold are reported; the usual shapes pass."""

from __future__ import annotations

import pytest

from functions.model.policy import Match, Rule, default_rules
from functions.model.policy_lint import covers, lint_rules, overlap

HOLD = Rule(name="default-hold", action="hold")
DRAIN = Rule(name="terminate-drain", match=Match(event_types=("Terminate",)), action="drain")


def rule(name: str, action: str = "approve", **match) -> Rule:
    return Rule(name=name, match=Match(**match), action=action)


def test_the_reference_policy_and_the_readme_shape_are_clean():
    assert lint_rules(default_rules()) == ([], [])
    oslo = (
        *default_rules()[:2],
        rule("reboots-in-window", event_types=("Reboot", "Redeploy"), sources=("Platform",)),
        default_rules()[2],
    )
    assert lint_rules(oslo) == ([], [])


def test_tag_rules_are_linted_as_names_are():
    """Issue 45: rules match tags; a tag carve-out above the catch-all drain is written on
    purpose, a tag-wide approve above a tag-narrow drain is refused."""
    web = rule("web-approve", tags={"tier": ("web",)})
    assert lint_rules((web, Rule(name="all", action="drain"))) == ([], [])
    narrow = rule("web-eu-drain", action="drain", tags={"tier": ("web",), "region": ("eu",)})
    errors, _ = lint_rules((web, narrow))
    assert errors and "'web-eu-drain' (drain) can never match" in errors[0]
    other = rule("api-drain", action="drain", tags={"tier": ("api",)})
    assert lint_rules((web, other)) == ([], [])  # no VM is both web and api
    assert covers(Match(tags={"tier": ("web*",)}), Match(tags={"Tier": ("web-1",)}))
    assert not covers(Match(tags={"tier": ("web",)}), Match())
    assert overlap(Match(tags={"tier": ("web",)}), Match(tags={"zone": ("1",)}))


def test_user_approve_above_terminate_drain_is_refused():
    errors, _ = lint_rules((rule("user", sources=("User",)), DRAIN, HOLD))
    assert errors == [
        "rule 'user' (approve) comes before rule 'terminate-drain' (drain) and takes the "
        "Terminate events from User both match: put 'terminate-drain' above 'user', or "
        "narrow 'user'"
    ]


def test_a_drain_rule_fully_shadowed_is_refused_and_others_reported():
    errors, _ = lint_rules((rule("all-terminates", event_types=("terminate",)), DRAIN, HOLD))
    assert len(errors) == 1 and "'terminate-drain' (drain) can never match" in errors[0]
    errors, warnings = lint_rules((HOLD, rule("late", event_types=("Reboot",))))
    assert errors == [] and "rule 'late' (approve) can never match" in warnings[0]


def test_a_narrower_carve_out_above_a_broader_rule_is_deliberate():
    batch = rule("batch-terminates", event_types=("Terminate",), scale_sets=("batch",))
    assert lint_rules((batch, DRAIN, HOLD)) == ([], [])


def test_an_approve_taking_some_of_a_later_hold_is_a_warning():
    reboots = rule("reboots", "hold", event_types=("Reboot",))
    errors, warnings = lint_rules((rule("user", sources=("User",)), reboots, HOLD))
    assert errors == [] and "takes the Reboot events from User" in warnings[0]


@pytest.mark.parametrize(
    ("match", "why"),
    [
        (Match(event_types=()), "event_types list is empty"),
        (Match(statuses=("Completed", "Canceled")), "never decided"),
        (Match(resources=()), "resources list is empty"),
    ],
)
def test_rules_that_match_nothing_are_reported(match, why):
    errors, warnings = lint_rules((Rule(name="dead", match=match, action="approve"), HOLD))
    assert errors == [] and why in warnings[0]


def test_covers_and_overlap_on_durations_and_names():
    short = Match(event_types=("Freeze",), duration_at_least=0, duration_below=9)
    freeze = Match(event_types=("Freeze",))
    assert covers(freeze, short) and not covers(short, freeze)
    assert not overlap(short, Match(duration_at_least=9))
    assert overlap(short, Match(duration_below=5))
    assert covers(Match(resources=("web-*",)), Match(resources=("web-1", "WEB-2")))
    assert not covers(Match(resources=("web-*",)), Match(resources=("db-*",)))
    # Two different globs: not certain, so neither cover nor overlap is claimed.
    assert not overlap(Match(resources=("web-*",)), Match(resources=("*-db",)))
    assert overlap(Match(scale_sets=("A",)), Match(scale_sets=("a", "b")))
