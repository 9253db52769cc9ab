"""Disruption budgets as data (issue 39): the `POLICY__BUDGETS` model, its checks, and the
pure interface the lifecycle's decider enforces (functions.model.budgets.slots_for)."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from functions.model.budgets import (
    DEFAULT_BUDGET,
    Budget,
    Placement,
    Slot,
    effective_budgets,
    group_key,
    lint_budgets,
    slots_for,
    waiting_text,
    why_not_covered,
)
from functions.model.envelope import ScheduledEvent
from functions.model.match import Match
from functions.model.policy import Policy, Rule, load_policy

SUB = "11111111-2222-4333-8444-555555555555"


def event(kind: str = "Reboot", duration: int = -1, source: str = "Platform") -> ScheduledEvent:
    return ScheduledEvent(
        EventId="E1",
        EventType=kind,
        ResourceType="VirtualMachine",
        Resources=["web_1"],
        EventStatus="Scheduled",
        NotBefore="Mon, 23 Nov 2026 10:00:00 GMT",
        EventSource=source,
        DurationInSeconds=duration,
    )


def vm(name: str = "web_1", **kw) -> Placement:
    base = {
        "subscription": SUB,
        "resource_group": "rg",
        "zone": "1",
        "scale_set": "web",
        "tags": {"Service": "checkout", "tier": "web"},
    }
    return Placement(name=name, **{**base, **kw})


def budget(**kw) -> Budget:
    base = {"name": "b", "group_by": "tag:service", "max_unavailable": 1}
    return Budget.model_validate({**base, **kw})


# ---------------------------------------------------------------------- the model


@pytest.mark.parametrize(
    ("group_by", "hint"),
    [
        ("zones", "did you mean 'zone'"),
        ("tags:service", "did you mean 'tag:service'"),
        ("tag=service", "did you mean 'tag:service'"),
        ("scale_set", "did you mean 'set'"),
        ("subscripton", "did you mean 'subscription'"),
        ("tag", "did you mean 'tag:<name>'"),
        ("tag:a/b", "Azure tag names never do"),
    ],
)
def test_a_misspelt_group_is_refused_with_the_closest(group_by, hint):
    with pytest.raises(ValidationError, match=hint.replace("'", ".").replace("?", r"\?")):
        budget(group_by=group_by)


def test_groups_are_canonical_and_one_or_a_list():
    assert budget(group_by="Zone").group_by == ("zone",)
    assert budget(group_by=["tag:Service", "ZONE"]).group_by == ("tag:Service", "zone")
    with pytest.raises(ValidationError, match="given twice"):
        budget(group_by=["zone", "zone"])
    with pytest.raises(ValidationError):
        budget(group_by=[])


@pytest.mark.parametrize(
    ("value", "words"),
    [
        (0, "at least 1 VM"),
        (-3, "at least 1 VM"),
        ("0%", "above 0 up to 100"),
        ("150%", "above 0 up to 100"),
        ("10 percent", "a percentage like '10%'"),
        (True, "a number of VMs"),
        (None, "a number of VMs"),
    ],
)
def test_max_unavailable_is_at_least_one_vm_or_a_percentage(value, words):
    with pytest.raises(ValidationError, match=words.replace("%", "%").replace("(", r"\(")):
        budget(max_unavailable=value)


def test_max_unavailable_forms():
    assert budget(max_unavailable="2").max_unavailable == 2
    assert budget(max_unavailable=" 10 % ").max_unavailable == "10%"
    assert budget(max_unavailable="12.5%").percent == 12.5


@pytest.mark.parametrize(
    ("size", "limit"),
    [(None, 1), (0, 1), (5, 1), (9, 1), (10, 1), (19, 1), (20, 2), (100, 10), (105, 10)],
)
def test_a_percentage_is_of_the_groups_size_rounded_down_never_below_one(size, limit):
    assert budget(max_unavailable="10%").limit(size) == limit


def test_a_number_ignores_the_size():
    assert budget(max_unavailable=3).limit(None) == 3
    assert budget(max_unavailable=3).limit(1) == 3


def test_budget_names_unique_not_the_default_and_bounded():
    errors, _ = lint_budgets([budget(name="a"), budget(name="A")])
    assert errors == ["budget names must be unique; repeated: ['A', 'a']"]
    errors, _ = lint_budgets([budget(name=DEFAULT_BUDGET)])
    assert "max_concurrent_per_set's" in errors[0]
    errors, _ = lint_budgets([budget(name=f"b{i}") for i in range(17)])
    assert errors == ["at most 16 budgets, not 17"]
    with pytest.raises(ValidationError):
        budget(name="has space")


def test_warnings_for_budgets_that_never_act():
    _, warnings = lint_budgets(
        [
            budget(name="all", max_unavailable="100%"),
            budget(name="scale-in", match={"event_types": ["Terminate"]}),
            budget(name="none", match={"resources": []}),
        ]
    )
    assert warnings == [
        "budget 'all' never holds an approval back: max_unavailable is 100% of its group",
        "budget 'scale-in' never covers a VM: it matches only Terminate, which budgets never count",
        "budget 'none' never covers a VM: its resources list is empty",
    ]


def test_a_rule_matches_tags_as_a_budget_does():
    """Issue 45: rules have the facts budgets have (tags from the identity sync); 2f59d6a
    refused a rule's `match.tags`."""
    rule = Rule(name="r", match=Match(tags={"env": "prod"}), action="hold")
    assert rule.match.tags == {"env": ("prod",)}


def test_tag_criteria_take_one_glob_or_a_list_and_valid_names():
    assert Match(tags={"service": "checkout"}).tags == {"service": ("checkout",)}
    with pytest.raises(ValidationError, match="matches no VM"):
        Match(tags={"service": []})
    with pytest.raises(ValidationError, match="given twice"):
        Match(tags={"Service": "a", "service": "b"})


def test_the_policy_reads_budgets_from_app_settings(monkeypatch):
    monkeypatch.setenv(
        "POLICY__BUDGETS",
        json.dumps(
            [
                {
                    "name": "checkout-web",
                    "group_by": "tag:service",
                    "match": {"tags": {"service": "checkout"}},
                    "max_unavailable": 1,
                },
                {"name": "web-tier", "group_by": ["tag:tier", "zone"], "max_unavailable": "10%"},
            ]
        ),
    )
    load = load_policy()
    assert load.error is None, load.error
    assert [b.name for b in load.policy.budgets] == ["checkout-web", "web-tier"]
    assert load.policy.budgets[1].group_by == ("tag:tier", "zone")
    printed = json.loads(load.policy.model_dump_json())
    assert printed["budgets"][1]["max_unavailable"] == "10%"


def test_an_invalid_budget_fails_the_policy_closed(monkeypatch):
    monkeypatch.setenv("POLICY__BUDGETS", json.dumps([{"name": "x", "group_by": "zones"}]))
    load = load_policy()
    assert load.policy is None
    assert "POLICY__BUDGETS[0].group_by: 'zones' is not a group; did you mean 'zone'?" in load.error
    assert "POLICY__BUDGETS[0].max_unavailable: Field required" in load.error


def test_no_budgets_setting_means_only_the_default_one():
    policy = Policy()
    assert policy.budgets == ()
    only = effective_budgets(policy.budgets, policy.max_concurrent_per_set)
    assert [(b.name, b.group_by, b.max_unavailable) for b in only] == [
        (DEFAULT_BUDGET, ("set",), 1)
    ]


# ---------------------------------------------------------------------- groups


def test_group_keys_from_azures_facts():
    web = vm()
    assert group_key(budget(group_by="tag:service"), web) == "tag:service=checkout"
    assert (
        group_key(budget(group_by=["tag:SERVICE", "zone"]), web)
        == "tag:service=checkout|zone=1@11111111"
    )
    assert group_key(budget(group_by="set"), web) == "set=ss:web"
    assert group_key(budget(group_by="set"), vm(scale_set=None, availability_set="DB")) == (
        "set=as:db"
    )
    assert group_key(budget(group_by="subscription"), web) == f"subscription={SUB}"


def test_tag_values_are_case_sensitive_and_escaped():
    """Azure compares tag names case-insensitively and values case-sensitively; a value
    holding the key's separators cannot pose as another group."""
    assert group_key(budget(), vm(tags={"service": "Checkout"})) == "tag:service=Checkout"
    tricky = group_key(budget(group_by=["tag:service", "zone"]), vm(tags={"service": "a|zone=1"}))
    assert tricky == "tag:service=a%7Czone%3D1|zone=1@11111111"


@pytest.mark.parametrize(
    ("group_by", "placement", "why"),
    [
        ("zone", vm(zone=None), "in no availability zone"),
        ("tag:owner", vm(), "it has no tag 'owner'"),
        ("set", vm(scale_set=None), "in no scale set or availability set"),
        ("subscription", vm(subscription=None), "subscription is not known"),
    ],
)
def test_a_vm_without_a_dimension_is_in_no_group(group_by, placement, why):
    b = budget(group_by=group_by)
    assert group_key(b, placement) is None
    assert why in why_not_covered(b, event(), placement)
    assert slots_for([b], event(), placement) == []


# ---------------------------------------------------------------------- slots


def test_the_slots_a_disruptive_approval_needs():
    budgets = effective_budgets(
        [
            budget(name="checkout-web", match={"tags": {"service": "checkout"}}),
            budget(name="web-tier", group_by=["tag:tier", "zone"], max_unavailable="10%"),
            budget(name="payments", match={"tags": {"service": "pay*"}}),
        ],
        max_concurrent_per_set=2,
    )
    sizes = {("web-tier", "tag:tier=web|zone=1@11111111"): 40}
    assert slots_for(budgets, event(), vm(), sizes) == [
        Slot("checkout-web", "tag:service=checkout", 1),
        Slot("web-tier", "tag:tier=web|zone=1@11111111", 4),
        Slot(DEFAULT_BUDGET, "set=ss:web", 2),
    ]
    # The same from a callable (the store's point read), asked only for percentages.
    asked = []

    def size(name: str, group: str) -> int | None:
        asked.append((name, group))
        return sizes.get((name, group))

    assert slots_for(budgets, event(), vm(), size) == slots_for(budgets, event(), vm(), sizes)
    assert asked == [("web-tier", "tag:tier=web|zone=1@11111111")]


def test_a_group_not_counted_yet_allows_one():
    b = budget(max_unavailable="50%")
    assert slots_for([b], event(), vm()) == [Slot("b", "tag:service=checkout", 1)]


@pytest.mark.parametrize(
    "e",
    [event("Terminate", source="User"), event("Freeze", duration=5), event("Freeze", duration=0)],
)
def test_what_is_not_disruptive_needs_no_slot(e):
    budgets = effective_budgets([budget()], 1)
    assert slots_for(budgets, e, vm()) == []
    assert "only disruptive events" in why_not_covered(budgets[0], e, vm())


def test_a_long_freeze_and_every_other_type_need_slots():
    for e in (event("Freeze", duration=30), event("Redeploy"), event("Preempt")):
        assert [s.budget for s in slots_for([budget()], e, vm())] == ["b"]


def test_match_narrows_by_event_and_by_vm():
    reboots = budget(match={"event_types": ["Reboot"]})
    assert slots_for([reboots], event("Redeploy"), vm()) == []
    assert why_not_covered(reboots, event("Redeploy"), vm()) == "its match leaves out this event"
    named = budget(match={"resources": ["db-*"], "scale_sets": ["web"]})
    assert why_not_covered(named, event(), vm()) == "its match leaves out this VM"
    assert slots_for([named], event(), vm(name="db-1")) == [Slot("b", "tag:service=checkout", 1)]
    tagged = budget(match={"tags": {"SERVICE": ["check*"]}})
    assert slots_for([tagged], event(), vm(tags={"service": "Checkout"})) == []
    assert slots_for([tagged], event(), vm(tags={"service": "checkout"}))


def test_a_name_azure_gives_two_vms_counts_in_every_group_of_either():
    """Names repeat across resource groups: the VM is counted wherever either is (the safe
    side), each group once."""
    one = vm(zone="1", resource_group="a")
    two = vm(zone="2", resource_group="b")
    same = vm(zone="1", resource_group="c")
    slots = slots_for([budget(group_by="zone")], event(), [one, two, same])
    assert slots == [Slot("b", "zone=1@11111111", 1), Slot("b", "zone=2@11111111", 1)]


def test_the_waiting_text_cards_show():
    slot = Slot("checkout-web", "tag:service=checkout", 1)
    assert waiting_text(slot, ["vm-a"]) == "waiting for budget checkout-web (1 of 1: vm-a)"
    many = [f"vm-{i}" for i in range(8)]
    assert waiting_text(Slot("t", "g", 8), many) == (
        "waiting for budget t (8 of 8: vm-0, vm-1, vm-2, vm-3, vm-4 and 3 more)"
    )
    assert waiting_text(slot, []) == "waiting for budget checkout-web (0 of 1)"


def test_zone_one_of_another_subscription_or_region_is_another_group():
    """Issue 46: a zone number is logical: "1" in another subscription maps to another
    physical zone, and in another region it is another place altogether (Learn,
    availability-zones-overview @ e3bf58aa). Budgets key zones by all three."""
    per_zone = Budget(name="z", group_by="zone", max_unavailable=1)
    here = Placement(name="a", subscription="8d65815f-aaaa", region="eastus", zone="1")
    keys = {
        group_key(per_zone, here),
        group_key(per_zone, here.model_copy(update={"subscription": "11111111-bbbb"})),
        group_key(per_zone, here.model_copy(update={"region": "westeurope"})),
    }
    assert keys == {
        "zone=eastus-1@8d65815f",
        "zone=eastus-1@11111111",
        "zone=westeurope-1@8d65815f",
    }
    same = here.model_copy(update={"name": "b", "region": "EastUS"})
    assert group_key(per_zone, same) == group_key(per_zone, here)  # one place, one group
