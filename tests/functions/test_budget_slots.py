"""Budget slot rows (issue 39) on Azurite: the shape the lifecycle writes and the fleet page,
`policy explain` and the cards read."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from pydantic import ValidationError

from functions.model.budgets import Slot
from functions.store.budget_slots import (
    MAX_HOLDERS,
    MAX_WAITING,
    BudgetHolder,
    BudgetSlot,
    BudgetSlots,
    BudgetWaiter,
)

pytestmark = pytest.mark.azurite

T0 = datetime(2026, 11, 24, 10, 0, tzinfo=UTC)
GROUP = "tag:service=checkout"


def holder(vm: str, event: str = "E1", **kw) -> BudgetHolder:
    return BudgetHolder(vm=vm, event_id=event, since=T0, **kw)


@pytest.fixture
def slots(store) -> BudgetSlots:
    return BudgetSlots(store.events)


def test_a_slot_row_is_taken_under_its_etag_and_read_back(store, slots):
    def take(row: BudgetSlot | None) -> BudgetSlot:
        row = row or BudgetSlot(budget="checkout-web", group=GROUP, limit=1)
        row.holders.append(holder("vm-a", until=T0 + timedelta(hours=1)))
        return row

    stored, won = slots.mutate_budget_slot("checkout-web", GROUP, take)
    assert won and stored.etag
    again = slots.get_budget_slot("checkout-web", GROUP)
    assert again.holders == stored.holders and again.slot == Slot("checkout-web", GROUP, 1)
    assert again.text() == "waiting for budget checkout-web (1 of 1: vm-a)"
    assert slots.get_budget_slot("checkout-web", "tag:service=other") is None
    # A group key with characters a row key may not hold still has its own row.
    odd = "tag:path=a/b?c#d"
    slots.mutate_budget_slot("odd", odd, lambda r: BudgetSlot(budget="odd", group=odd, limit=2))
    assert slots.get_budget_slot("odd", odd).group == odd


def test_every_slot_row_is_listed_and_an_unreadable_one_named(store, slots):
    for budget, group in (("a", "zone=1"), ("a", "zone=2"), ("b", GROUP)):
        slots.mutate_budget_slot(
            budget, group, lambda r, b=budget, g=group: BudgetSlot(budget=b, group=g, limit=1)
        )
    store.events.upsert_entity({"PartitionKey": "%budget|c", "RowKey": "x", "data": "{"})
    store.events.upsert_entity({"PartitionKey": "%cap|ss:web", "RowKey": "slots", "data": "{}"})
    skipped: list = []
    found = sorted((s.budget, s.group) for s in slots.budget_slots(skipped))
    assert found == [("a", "zone=1"), ("a", "zone=2"), ("b", GROUP)]
    assert [s.partition for s in skipped] == ["%budget|c"]


def test_over_budget_holders_are_counted_not_hidden():
    slot = BudgetSlot(
        budget="b", group="g", limit=1, holders=[holder("vm-a"), holder("vm-b", over=True)]
    )
    assert slot.over == 1
    assert slot.text() == "waiting for budget b (2 of 1: vm-a, vm-b)"


def test_waiters_are_kept_oldest_not_before_first_and_the_rest_counted():
    waiting = [
        BudgetWaiter(vm=f"vm-{i}", event_id=f"E{i}", not_before=T0 + timedelta(minutes=i), since=T0)
        for i in reversed(range(MAX_WAITING + 5))
    ]
    slot = BudgetSlot(budget="b", group="g", limit=1, waiting=waiting)
    assert len(slot.waiting) == MAX_WAITING and slot.waiting_dropped == 5
    assert slot.waiting[0].vm == "vm-0"
    with pytest.raises(ValidationError):
        BudgetSlot(budget="b", group="g", limit=1, holders=[holder("v")] * (MAX_HOLDERS + 1))
    with pytest.raises(ValidationError):
        BudgetSlot(budget="b", group="g", limit=0)
