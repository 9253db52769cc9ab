"""Budget slot rows: who holds a disruption budget's group, and who waits for it.

One row per (budget, group) (functions.model.budgets: `slots_for` says which an approval
needs), in the events table beside the capacity slots: PartitionKey `%budget|<budget>`,
RowKey the group's key, `data` the BudgetSlot's JSON, `holders` the holding VMs' names
for people browsing the table. The lifecycle writes them, under the row's ETag as every
shared row (`mutate_budget_slot`); the fleet page, `policy explain` and the cards read
them. A holder is one VM of one event: approving an event for several VMs takes a slot
for each, in every budget covering it, all or none. `BudgetSlots(store.events)` reads and
writes them; functions.store.state.Store mixes it in, so the slot code reads and writes them
through the store, as it does the capacity slot rows.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from azure.data.tables import TableClient
from pydantic import AwareDatetime, BaseModel, Field, model_validator

from functions.model.budgets import Slot, waiting_text
from functions.store.keys import reserved, row_key, table_key
from functions.store.records import Record
from functions.store.rows import BadRow, Rows

MAX_HOLDERS = 1000  # held slots (at most the limit) plus those Azure started over it
MAX_WAITING = 200  # waiters kept in the row; the rest counted in `waiting_dropped`
BUDGET_PREFIX = "budget|"


class BudgetHolder(BaseModel):
    """One VM out (or about to be) under this budget group."""

    vm: str  # Azure's name for the VM
    event_id: str
    since: AwareDatetime  # when its approval took the slot (or Azure started it)
    # When the slot lapses whatever the event's reporters say, as a capacity slot does
    # (functions.pipeline.slot_rules.holds_slot): a VM that keeps listing a made-up event
    # cannot hold its group's slot for ever.
    until: AwareDatetime | None = None
    # Counted though the group was full: Azure started the event at NotBefore anyway
    # (a budget can delay an approval, never Azure). Shown over budget, never hidden.
    over: bool = False


class BudgetWaiter(BaseModel):
    """One VM of one event whose disruptive approval waits for this group."""

    vm: str
    event_id: str
    not_before: AwareDatetime | None = None  # waiting events go oldest NotBefore first
    since: AwareDatetime


class BudgetSlot(Record):
    """A budget group's slots: `limit` VMs may be out at once (from the policy and the
    group's size when taken; the policy may change it since)."""

    budget: str
    group: str
    limit: int = Field(ge=1)
    holders: list[BudgetHolder] = Field(default_factory=list, max_length=MAX_HOLDERS)
    waiting: list[BudgetWaiter] = Field(default_factory=list)
    waiting_dropped: int = 0

    @model_validator(mode="after")
    def _bounded(self) -> BudgetSlot:
        """Waiters in the order they are served (oldest NotBefore first), at most
        MAX_WAITING kept; the others counted, never silently gone."""
        if len(self.waiting) > MAX_WAITING:
            self.waiting.sort(key=_served_first)
            self.waiting_dropped += len(self.waiting) - MAX_WAITING
            del self.waiting[MAX_WAITING:]
        return self

    @property
    def slot(self) -> Slot:
        return Slot(self.budget, self.group, self.limit)

    @property
    def over(self) -> int:
        """VMs out beyond the limit (Azure started them at NotBefore)."""
        return max(0, len(self.holders) - self.limit)

    def text(self) -> str:
        """ "waiting for budget checkout-web (1 of 1: vm-a)": what a waiter is told."""
        return waiting_text(self.slot, [h.vm for h in self.holders])


def _served_first(waiter: BudgetWaiter) -> tuple[bool, Any, Any]:
    return (waiter.not_before is None, waiter.not_before, waiter.since)


def budget_partition(budget: str) -> str:
    return reserved(BUDGET_PREFIX + row_key(budget))


class BudgetSlots(Rows):
    """Reads and writes of budget slot rows in the events table (`store.events`)."""

    def __init__(self, events: TableClient) -> None:
        self.events = events

    def get_budget_slot(self, budget: str, group: str) -> BudgetSlot | None:
        return self._get(self.events, BudgetSlot, budget_partition(budget), table_key(group))

    def mutate_budget_slot(
        self, budget: str, group: str, change: Callable[[BudgetSlot | None], BudgetSlot | None]
    ) -> tuple[BudgetSlot | None, bool]:
        """Read-modify-write under the row's ETag (`change` may run several times: compute
        only). Returns (row as stored, whether this call wrote it)."""
        return self._mutate(
            self.events,
            BudgetSlot,
            budget_partition(budget),
            table_key(group),
            change,
            _columns,
        )

    def budget_slots(self, skipped: list[Any] | None = None) -> Iterator[BudgetSlot]:
        """Every budget slot row (the fleet page): one query over the budget partitions.
        A row that cannot be read is skipped and appended to `skipped` (BadRow.skipped)."""
        low, high = reserved(BUDGET_PREFIX), reserved("budget}")
        rows = self.events.query_entities(
            "PartitionKey ge @low and PartitionKey lt @high",
            parameters={"low": low, "high": high},
        )
        for row in rows:
            try:
                yield self._load(BudgetSlot, row)
            except BadRow as exc:
                if skipped is not None:
                    skipped.append(exc.skipped)


def _columns(slot: BudgetSlot) -> dict[str, Any]:
    return {
        "holders": ",".join(h.vm for h in slot.holders)[:1000],
        "waiting_count": len(slot.waiting) + slot.waiting_dropped,
    }
