"""Issue 39: disruption budgets enforced by the one decider.

A checkout service of two VMs in different scale sets and zones, one budget over its
`service` tag allowing one VM out at a time: the first VM's Reboot is approved, the
second waits (its `decided` says for what, naming the budget and the VM holding it) and
is approved when the first is back; an event Azure starts on its own while the group is
full is counted over budget, never hidden. The facts come from the identity sync's
placement rows (Azure's), never from the VM."""

from __future__ import annotations

from datetime import timedelta

from functions.model.budgets import Budget, Placement
from functions.model.policy import Policy, Rule
from functions.pipeline.ingest import ingest_message
from functions.store.budget_slots import BudgetSlots
from functions.store.placements import Placements
from tests.functions.conftest import T0, envelope, event, make_pipeline

BUDGET = Budget(name="checkout", group_by=("tag:service",), max_unavailable=1)
POLICY = Policy(rules=(Rule(name="all", action="approve"),), budgets=(BUDGET,))
GROUP = "tag:service=checkout"


def _place(store, *names: str, service: str = "checkout") -> None:
    rows = [
        Placement(
            name=name,
            vm_id=f"vmid-{name}",
            zone=str(index + 1),
            scale_set=f"ss-{index}",
            tags={"service": service},
            fetched_at=T0,
        )
        for index, name in enumerate(names)
    ]
    Placements(store.service.get_table_client(f"{store.prefix}identities")).put(rows)


def _slot(store):
    return BudgetSlots(store.events).get_budget_slot("checkout", GROUP)


def test_the_second_vm_of_a_service_waits_until_the_first_is_back(store, clock, relay):
    _place(store, "co-a", "co-b")
    pipeline, pub = make_pipeline(store, clock, POLICY)
    one = event("EV-A", resources=("co-a",), not_before=T0 + timedelta(minutes=15))
    two = event("EV-B", resources=("co-b",), not_before=T0 + timedelta(minutes=20))
    ingest_message(envelope("co-a", 1, [one], callback_url=relay.url), pipeline)
    ingest_message(envelope("co-b", 1, [two], callback_url=relay.url), pipeline)
    assert relay.starts() == ["EV-A"]
    waiting = store.get_event("EV-B")
    assert waiting.approval == "pending"
    assert waiting.waiting_for == "waiting for budget checkout (1 of 1: co-a)"
    decided = [n for n in pub.published if n.event and n.event.event_id == "EV-B"]
    assert decided[-1].transition.value == "decided"
    assert decided[-1].waiting == "waiting for budget checkout (1 of 1: co-a)"
    slot = _slot(store)
    assert [h.vm for h in slot.holders] == ["co-a"] and [w.vm for w in slot.waiting] == ["co-b"]
    # co-a's Reboot starts and ends: its slot goes back and co-b is approved at once.
    clock.advance(60)
    started = {**one, "EventStatus": "Started", "NotBefore": ""}
    ingest_message(envelope("co-a", 2, [started], callback_url=relay.url), pipeline)
    assert relay.starts() == ["EV-A"]  # still out
    clock.advance(60)
    ingest_message(envelope("co-a", 3, [], callback_url=relay.url), pipeline)
    assert relay.starts() == ["EV-A", "EV-B"]
    slot = _slot(store)
    assert [h.vm for h in slot.holders] == ["co-b"] and slot.waiting == []


def test_an_event_azure_starts_while_the_group_is_full_is_counted_over_budget(store, clock, relay):
    _place(store, "co-a", "co-b")
    pipeline, _ = make_pipeline(store, clock, POLICY)
    one = event("EV-A", resources=("co-a",), not_before=T0 + timedelta(minutes=15))
    two = event("EV-B", resources=("co-b",), not_before=T0 + timedelta(minutes=20))
    ingest_message(envelope("co-a", 1, [one], callback_url=relay.url), pipeline)
    ingest_message(envelope("co-b", 1, [two], callback_url=relay.url), pipeline)
    clock.advance(60)
    going = {**one, "EventStatus": "Started", "NotBefore": ""}  # co-a is out
    ingest_message(envelope("co-a", 2, [going], callback_url=relay.url), pipeline)
    clock.advance(19 * 60)  # NotBefore: Azure starts EV-B whatever the budget says
    started = {**two, "EventStatus": "Started", "NotBefore": ""}
    ingest_message(envelope("co-b", 2, [started], callback_url=relay.url), pipeline)
    slot = _slot(store)
    holders = {h.vm: h.over for h in slot.holders}
    assert holders == {"co-a": False, "co-b": True}  # shown over budget, never hidden
    assert slot.over == 1 and store.get_event("EV-B").budget_counted


def test_a_vm_without_azures_placement_takes_no_budget_slot(store, clock, relay):
    """A VM the sync never placed (or a name a VM made up) is in no budget's group: the
    budget neither holds it nor is held by it (its set's guard still applies)."""
    _place(store, "co-a")
    pipeline, _ = make_pipeline(store, clock, POLICY)
    one = event("EV-A", resources=("co-a",))
    ghost = event("EV-G", resources=("stranger",))
    ingest_message(envelope("co-a", 1, [one], callback_url=relay.url), pipeline)
    ingest_message(envelope("stranger", 1, [ghost], callback_url=relay.url), pipeline)
    assert sorted(relay.starts()) == ["EV-A", "EV-G"]
    assert [h.vm for h in _slot(store).holders] == ["co-a"]
