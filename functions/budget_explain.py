"""`policy explain`'s budget lines: which disruption budgets a VM falls under, and their state.

Azure's facts about the VM (tags, zone, sets, subscription) come from the flags
(`--zone`, `--tag KEY=VALUE`, `--subscription`, `--scale-set`), or, with `StateStorage` in
the environment as the app has it, from the placement rows the identity sync wrote
(functions.store.placements), read by the VM's name. The state of each budget group (who
holds it, who waits, its size for a percentage) is read from the same storage; without
it, the state is unknown and said so.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Sequence
from typing import Any

from functions.model.budgets import (
    DEFAULT_BUDGET,
    Budget,
    Placement,
    coverage_of,
    disruptive,
    effective_budgets,
    why_not_covered,
)
from functions.model.envelope import ScheduledEvent
from functions.model.policy import Policy

log = logging.getLogger(__name__)


def add_arguments(explain: argparse.ArgumentParser) -> None:
    explain.add_argument(
        "--vm", metavar="NAME", help="the document's VM (a plain IMDS document does not say)"
    )
    explain.add_argument("--zone", metavar="ZONE", help="the VM's availability zone, for budgets")
    explain.add_argument(
        "--tag",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="one of the VM's Azure tags, for budgets (repeatable)",
    )
    explain.add_argument("--subscription", metavar="ID", help="the VM's subscription, for budgets")


class Facts:
    """Where explain learns placements and budget state: the flags, else the storage."""

    def __init__(self, args: argparse.Namespace, scale_sets: tuple[str, ...]) -> None:
        self.vm: str | None = getattr(args, "vm", None)
        tags = {}
        for pair in getattr(args, "tag", None) or []:
            name, eq, value = pair.partition("=")
            if not eq or not name:
                raise ValueError(f"--tag {pair!r}: use NAME=VALUE")
            tags[name] = value
        self.zone = getattr(args, "zone", None)
        self.subscription = getattr(args, "subscription", None)
        # Placement flags: with any (or a scale set), the flags are the VM's facts.
        self.flags = bool(tags or self.zone or self.subscription)
        self.given = self.flags or bool(scale_sets)
        self.tags = tags
        self.scale_sets = scale_sets
        self._storage: Any = None
        self._storage_error: str | None = None
        quiet_azure_identity()

    def storage(self) -> Any:
        """(BudgetSlots, Placements) over StateStorage, or None (and why, in `why_not`)."""
        from functions.settings import SettingsInvalid

        if self._storage is None and self._storage_error is None:
            try:
                self._storage = _open_storage()
            except SettingsInvalid:
                self._storage_error = "no StateStorage"
            except Exception as exc:  # any reason: explain goes on without the state
                self._storage_error = why_unreadable(exc)
        return self._storage

    @property
    def why_not(self) -> str:
        return self._storage_error or "no StateStorage"

    def placements(self, name: str) -> list[Placement] | None:
        """The VM's placements, or None when nothing says where Azure places it."""
        if self.given:
            scale_set = self.scale_sets[0] if self.scale_sets else None
            return [
                Placement(
                    name=name,
                    zone=self.zone,
                    subscription=self.subscription,
                    scale_set=scale_set,
                    tags=self.tags,
                )
            ]
        storage = self.storage()
        if storage is None:
            return None
        try:
            return storage[1].for_name(name) or None
        except Exception as exc:  # any reason: explain goes on without the state
            self.unreachable(exc)
            return None

    def unreachable(self, exc: BaseException) -> None:
        """The storage could not be read: remember why, in one line, and read no more."""
        self._storage = None
        self._storage_error = why_unreadable(exc)


NO_SIGN_IN = "no Azure sign-in: run `az login`, or pass `--tag`/`--zone`"


def why_unreadable(exc: BaseException) -> str:
    """Why the state storage could not be read, in one line. No Azure credential is the
    usual reason in an operator's shell (DefaultAzureCredential then raises, and would
    print every credential it tried): said as what to do."""
    from azure.core.exceptions import ClientAuthenticationError

    chain: list[BaseException] = []
    seen: BaseException | None = exc
    while seen is not None and len(chain) < 10:
        chain.append(seen)
        seen = seen.__cause__ or seen.__context__
    names = {type(e).__name__ for e in chain}
    if any(isinstance(e, ClientAuthenticationError) for e in chain) or (
        "CredentialUnavailableError" in names
    ):
        return NO_SIGN_IN
    first = (str(exc).splitlines() or [""])[0][:160]
    return f"state storage unreachable: {type(exc).__name__}: {first}"


def quiet_azure_identity() -> None:
    """azure-identity logs each credential it tried (a page of text) before it raises:
    the one line above says what matters."""
    for name in ("azure.identity", "azure.core.pipeline.policies.http_logging_policy"):
        logging.getLogger(name).setLevel(logging.CRITICAL)


def _open_storage() -> tuple[Any, Any]:
    from functions.identity.registry import TABLE_SUFFIX
    from functions.settings import Settings
    from functions.store.budget_slots import BudgetSlots
    from functions.store.placements import Placements
    from functions.store.state import Store

    settings = Settings()
    settings.table_connection()  # raises SettingsInvalid without StateStorage
    store = Store.from_settings(settings)
    identities = store.service.get_table_client(f"{store.prefix}{TABLE_SUFFIX}")
    return BudgetSlots(store.events), Placements(identities)


def budget_lines(
    policy: Policy, event: ScheduledEvent, vms: Sequence[str], facts: Facts
) -> dict[str, Any]:
    """The keys `policy explain` adds to an event's line: `budgets` (one per VM and budget
    group covering it, with its state), `budgets_not_covering` (each budget that leaves a
    VM out, and why), or `budgets_not_evaluated` (why not)."""
    budgets = effective_budgets(policy.budgets, policy.max_concurrent_per_set)
    if not disruptive(event):
        return {
            "budgets": [],
            "budgets_note": "not disruptive (a Terminate, or a Freeze below 9 s): no budget "
            "counts it",
        }
    covered: list[dict[str, Any]] = []
    left_out: list[dict[str, Any]] = []
    unknown: list[str] = []
    for vm in vms:
        placements = facts.placements(vm)
        if placements is None:
            unknown.append(vm)
            continue
        for placement in placements:
            for budget in budgets:
                why = why_not_covered(budget, event, placement)
                if why:
                    left_out.append({"vm": vm, "budget": budget.name, "why": why})
                    continue
                group = coverage_of(budget, placement)[0]
                assert group is not None
                covered.append(_state(budget, group, vm, facts))
    out: dict[str, Any] = {"budgets": covered, "budgets_not_covering": left_out}
    # Where an operator's budget covers a VM it replaces the per-set guard (issue 45).
    mine = {line["vm"] for line in covered if line["budget"] != DEFAULT_BUDGET}
    if mine and len(mine) == len(set(vms)) - len(unknown):
        out["budgets"] = [line for line in covered if line["budget"] != DEFAULT_BUDGET]
        out["budgets_note"] = (
            f"max_concurrent_per_set ({policy.max_concurrent_per_set}) does not apply: "
            "the budgets above cover every VM of the event, and replace it"
        )
    if unknown:
        out["budgets_not_evaluated"] = (
            f"Azure's facts about {', '.join(unknown)} are not known here ({facts.why_not}; "
            "or the identity sync has not placed it): pass --zone, --tag, --subscription, "
            "--scale-set, or StateStorage to read them"
        )
    return out


def _state(budget: Budget, group: str, vm: str, facts: Facts) -> dict[str, Any]:
    line: dict[str, Any] = {"vm": vm, "budget": budget.name, "group": group}
    storage = facts.storage()
    if storage is None:
        line["limit"] = budget.limit(None)
        if budget.percent is not None:
            line["limit_note"] = "the group's size is not known here: at least 1"
        line["state"] = f"unknown ({facts.why_not})"
        return line
    slots, placements = storage
    try:
        size = placements.size(budget.name, group) if budget.percent is not None else None
        row = slots.get_budget_slot(budget.name, group)
    except Exception as exc:  # any reason: explain goes on without the state
        facts.unreachable(exc)
        return _state(budget, group, vm, facts)
    line["limit"] = budget.limit(size)
    if budget.percent is not None:
        line["size"] = size
    holders = [h.vm for h in row.holders] if row else []
    out = f"{len(holders)} of {line['limit']} out"
    named = f" ({', '.join(holders[:10])})" if holders else ""
    if len(holders) > line["limit"]:
        line["state"] = f"over: {out}{named}, Azure started some at NotBefore"
    elif len(holders) == line["limit"]:
        line["state"] = f"full: {out}{named}"
    else:
        line["state"] = f"free: {out}{named}"
    line["holders"] = holders
    line["waiting"] = (len(row.waiting) + row.waiting_dropped) if row else 0
    return line
