"""The fleet page and the status API show each disruption budget's holders and waiting
events (issue 39), read from the budget slot rows; names from VMs stay escaped."""

from __future__ import annotations

from datetime import timedelta

from functions.model.budgets import Budget
from functions.model.policy import Policy, PolicyLoad
from functions.store.budget_slots import BudgetHolder, BudgetSlot, BudgetSlots, BudgetWaiter
from functions.web.budgets import budget_state
from functions.web.views import fleet_status
from tests.functions.conftest import T0, make_pipeline
from tests.web.server import serve
from tests.web.test_pages import PAGES_ON, get, principal

CHECKOUT = Budget(
    name="checkout-web",
    group_by=("tag:service",),
    match={"tags": {"service": "checkout"}},
    max_unavailable=1,
)
GROUP = "tag:service=checkout"


def pipeline_with(store, clock, *budgets: Budget):
    policy = PolicyLoad(policy=Policy(budgets=budgets))
    pipeline, _ = make_pipeline(store, clock, policy=policy, **PAGES_ON)
    return pipeline


def hold(store, holders, waiting=(), limit=1, budget="checkout-web", group=GROUP):
    row = BudgetSlot(
        budget=budget,
        group=group,
        limit=limit,
        holders=[BudgetHolder(vm=vm, event_id=e, since=T0, over=over) for vm, e, over in holders],
        waiting=[
            BudgetWaiter(vm=vm, event_id=e, not_before=T0 + timedelta(minutes=m), since=T0)
            for vm, e, m in waiting
        ],
    )
    BudgetSlots(store.events).mutate_budget_slot(budget, group, lambda _: row)


def test_the_page_shows_holders_and_waiting_events(store, clock):
    pipeline = pipeline_with(store, clock, CHECKOUT)
    hold(store, [("vm-a", "EV-A", False)], [("vm-b", "EV-B", 12), ("vm-c", "EV-C", 30)])
    with serve(pipeline) as url:
        page = get(f"{url}/api/pages/fleet", headers=principal())
    assert page.status_code == 200, page.text
    text = page.text
    assert "<h2>Disruption budgets</h2>" in text
    assert "<b>checkout-web</b>" in text and "by tag:service, at most 1" in text
    assert f"<code>{GROUP}</code>" in text
    assert '1 of 1<br>vm-a <a href="/api/pages/events/EV-A">' in text
    assert 'vm-b <a href="/api/pages/events/EV-B"><code>EV-B</code></a> NotBefore' in text
    assert text.index("vm-b") < text.index("vm-c")  # oldest NotBefore first
    # The default budget over sets is listed with nobody out.
    assert "<b>per-set</b>" in text and "nobody out" in text


def test_the_status_api_lists_the_same(store, clock):
    pipeline = pipeline_with(store, clock, CHECKOUT)
    hold(store, [("vm-a", "EV-A", False), ("vm-z", "EV-Z", True)])
    (checkout, per_set) = fleet_status(pipeline, include_ended=False)["budgets"]
    assert per_set == {
        "budget": "per-set",
        "group_by": ["set"],
        "max_unavailable": 1,
        "groups": [],
    }
    (group,) = checkout["groups"]
    assert group["out"] == 2 and group["over"] == 1
    assert [h["over_budget"] for h in group["holders"]] == [False, True]
    assert group["text"] == "waiting for budget checkout-web (2 of 1: vm-a, vm-z)"


def test_over_budget_is_shown_never_hidden(store, clock):
    pipeline = pipeline_with(store, clock, CHECKOUT)
    hold(store, [("vm-a", "EV-A", False), ("vm-z", "EV-Z", True)])
    with serve(pipeline) as url:
        text = get(f"{url}/api/pages/fleet", headers=principal()).text
    assert "2 of 1: over budget by 1 (Azure started them at NotBefore)" in text
    assert (
        'vm-z <a href="/api/pages/events/EV-Z"><code>EV-Z</code></a> <span class="warn">over'
        in text
    )


def test_a_budget_gone_from_the_policy_still_shows_who_holds_it(store, clock):
    pipeline = pipeline_with(store, clock)
    hold(store, [("vm-a", "EV-A", False)], budget="old", group="zone=1")
    state = budget_state(pipeline, [])
    assert [(b["budget"], b.get("in_policy")) for b in state] == [("per-set", None), ("old", False)]
    with serve(pipeline) as url:
        text = get(f"{url}/api/pages/fleet", headers=principal()).text
    assert "no longer in the policy" in text


def test_without_budgets_or_holders_the_page_has_no_section(store, clock):
    pipeline = pipeline_with(store, clock)
    with serve(pipeline) as url:
        text = get(f"{url}/api/pages/fleet", headers=principal()).text
    assert "Disruption budgets" not in text


def test_vm_names_are_escaped_and_an_unreadable_row_is_named(store, clock):
    pipeline = pipeline_with(store, clock, CHECKOUT)
    hold(store, [("<script>alert(1)</script>", "EV-<b>", False)])
    store.events.upsert_entity({"PartitionKey": "%budget|broken", "RowKey": "g", "data": "{"})
    with serve(pipeline) as url:
        text = get(f"{url}/api/pages/fleet", headers=principal()).text
    assert "<script>alert(1)" not in text and "&lt;script&gt;alert(1)&lt;/script&gt;" in text
    assert "%budget|broken" in text  # the unreadable-rows warning names it
