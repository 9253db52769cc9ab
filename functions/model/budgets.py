"""Disruption budgets: at most N VMs of a group out at once, whatever sets they are in.

A budget (`POLICY__BUDGETS`, one JSON list) groups VMs by Azure's facts about them, never
by anything a VM says: `"tag:<name>"` (VMs with the same value of that tag), `"zone"`,
`"set"` (the VM's scale set or availability set, by name, as the capacity guard has always
counted), `"subscription"`, or a list of these (all of them together). Its optional
`match` (functions.model.match) narrows which VMs and events it covers; `max_unavailable`
is a number of VMs or a percentage of the group's size, never less than 1.
`max_concurrent_per_set` is the default budget over sets (`per-set`): it holds every VM
no operator budget covers; for an event whose VMs budgets cover, the budgets replace it
(`per_set_notes` warns where they allow more than it would).

This module is pure: given the budgets, an event, where Azure places a VM (`Placement`:
its name, tags, zone, set, subscription, from Resource Graph through the identity sync)
and the group sizes the sync counted, `slots_for` says which slots the VM's disruptive
approval needs, as (budget, group, limit). Taking and giving back the slots is the
lifecycle's (it holds them in `BudgetSlot` rows, functions.store.records).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import NamedTuple

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, field_validator

from functions.model.envelope import TERMINATE, ScheduledEvent
from functions.model.match import Match, check_tag_name, is_impactful, quoted
from functions.model.policy_lint import unreachable
from functions.setting_names import suggestion

DEFAULT_BUDGET = "per-set"  # max_concurrent_per_set, as a budget over sets
MAX_BUDGETS = 16  # each covering budget costs the approval a slot row read and write
DIMENSIONS = ("zone", "set", "subscription")  # and "tag:<name>"
TAG = "tag:"
# What people write for a dimension that has another name here.
ALIASES = {
    "zones": "zone",
    "availability_zone": "zone",
    "availabilityzone": "zone",
    "scale_set": "set",
    "scaleset": "set",
    "scale_sets": "set",
    "vmss": "set",
    "availability_set": "set",
    "availabilityset": "set",
    "sets": "set",
    "sub": "subscription",
    "subscriptions": "subscription",
    "subscription_id": "subscription",
    "tags": "tag:<name>",
    "tag": "tag:<name>",
}
_PERCENT = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*%\s*$")
MAX_LISTED = 5  # holders named in a waiting text before "and N more"


def parse_dimension(text: str) -> str:
    """A `group_by` entry in its canonical form ("zone", "set", "subscription",
    "tag:<name>"), or a ValueError with the closest valid entry."""
    if not isinstance(text, str):
        raise ValueError(f"{text!r} is not a group: a string like 'tag:service' or 'zone'")
    word = text.strip()
    if word.casefold() in DIMENSIONS:
        return word.casefold()
    head, sep, rest = _split_tag(word)
    if sep and head.casefold() == "tag":
        check_tag_name(rest)
        return f"{TAG}{rest}"
    if sep and rest and suggestion(head, ["tag"], cutoff=0.5):
        hint = f"; did you mean 'tag:{rest}'?"
    elif word.casefold() in ALIASES:
        hint = f"; did you mean '{ALIASES[word.casefold()]}'?"
    else:
        hint = quoted(suggestion(word, [*DIMENSIONS, "tag:<name>"], cutoff=0.6))
    raise ValueError(
        f"{text[:80]!r} is not a group{hint} (groups: 'tag:<name>', 'zone', 'set', 'subscription')"
    )


def _split_tag(word: str) -> tuple[str, str, str]:
    """'tag:service' -> ('tag', ':', 'service'); also 'tags=service', 'tag-service'."""
    match = re.match(r"^([A-Za-z_]+)\s*([:=./-])\s*(.*)$", word)
    if match is None:
        return word, "", ""
    head, sep, rest = match.groups()
    if sep != ":" and head.casefold() == "tag":
        return "tags", sep, rest  # 'tag=service': close to, but not, the form
    return head, sep, rest


class Budget(BaseModel):
    """One budget. `group_by` accepts one entry or a list; `max_unavailable` a number of
    VMs (at least 1) or a percentage of the group's size ("10%")."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    group_by: tuple[str, ...] = Field(min_length=1)
    match: Match = Match()
    max_unavailable: int | str

    @field_validator("group_by", mode="before")
    @classmethod
    def _group_by(cls, value: object) -> object:
        items = [value] if isinstance(value, str) else value
        if not isinstance(items, list | tuple):
            return value
        parsed = [parse_dimension(item) for item in items]
        folded = [p.casefold() for p in parsed]
        repeated = sorted({p for p in folded if folded.count(p) > 1})
        if repeated:
            raise ValueError(f"{', '.join(repeated)} given twice")
        return tuple(parsed)

    @field_validator("max_unavailable", mode="before")
    @classmethod
    def _max_unavailable(cls, value: object) -> object:
        if isinstance(value, bool):
            raise ValueError("max_unavailable is a number of VMs or a percentage like '10%'")
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, str) and value.strip().isdigit():
            value = int(value.strip())
        if isinstance(value, int):
            if value < 1:
                raise ValueError(f"max_unavailable is at least 1 VM, not {value}")
            return value
        if isinstance(value, str):
            match = _PERCENT.match(value)
            if match is None:
                raise ValueError(
                    f"max_unavailable {value[:40]!r} is neither a number of VMs nor a "
                    "percentage like '10%'"
                )
            percent = float(match[1])
            if not 0 < percent <= 100:
                raise ValueError(f"max_unavailable {value!r}: a percentage above 0 up to 100")
            return f"{match[1]}%"
        raise ValueError("max_unavailable is a number of VMs or a percentage like '10%'")

    @property
    def percent(self) -> float | None:
        """The percentage of the group's size, or None for a number of VMs."""
        if isinstance(self.max_unavailable, str):
            return float(self.max_unavailable.rstrip("%"))
        return None

    def limit(self, size: int | None) -> int:
        """VMs of a group that may be out at once: the number, or the percentage of the
        group's size rounded down, never less than 1. A group the identity sync has not
        counted yet (`size` None) gets 1: the safe end."""
        percent = self.percent
        if percent is None:
            return int(self.max_unavailable)
        if not size:
            return 1
        return max(1, math.floor(size * percent / 100 + 1e-9))


def default_budget(max_concurrent_per_set: int) -> Budget:
    """`max_concurrent_per_set` as the budget it has always been: per scale set and per
    availability set."""
    return Budget(name=DEFAULT_BUDGET, group_by=("set",), max_unavailable=max_concurrent_per_set)


def effective_budgets(budgets: Sequence[Budget], max_concurrent_per_set: int) -> tuple[Budget, ...]:
    """The operator's budgets, then the default one over sets."""
    return (*budgets, default_budget(max_concurrent_per_set))


class Placement(BaseModel):
    """Where Azure places one VM: what budgets group by. From Resource Graph (the identity
    sync), never from the VM, so a VM cannot move itself into or out of a group."""

    model_config = ConfigDict(frozen=True)

    name: str
    vm_id: str | None = None
    subscription: str | None = None
    resource_group: str | None = None
    zone: str | None = None
    # Azure's region (Resource Graph's `location`): with the subscription, what makes a
    # zone number one datacenter (a logical zone "1" maps to a different physical zone in
    # another subscription, and is another place in another region).
    region: str | None = None
    scale_set: str | None = None
    availability_set: str | None = None
    tags: dict[str, str] = Field(default_factory=dict)
    fetched_at: AwareDatetime | None = None

    @property
    def scale_sets(self) -> tuple[str, ...]:
        return (self.scale_set,) if self.scale_set else ()


def _escape(text: str) -> str:
    """A value inside a group key: `|` separates parts and `=` a part's name from its
    value, so both (and `%` itself) are escaped; the key stays readable."""
    return text.replace("%", "%25").replace("|", "%7C").replace("=", "%3D")


def zone_key(placement: Placement) -> str:
    """A zone as one place: "<region>-<zone>@<subscription's first 8>" ("eastus-1@8d65815f").
    Zone numbers are logical: each subscription maps them to physical zones in its own
    order, and each region has its own (Learn, "Physical and logical availability zones":
    MicrosoftDocs/azure-docs articles/reliability/availability-zones-overview.md @
    e3bf58aa). Eight hex digits of the subscription keep the key short; two subscriptions
    sharing them would share a group (the strict side). A part Azure's facts lack is left
    out (placements written before the region was read)."""
    zone = _escape(placement.zone or "")
    if placement.region:
        zone = f"{_escape(placement.region.casefold())}-{zone}"
    if placement.subscription:
        zone += "@" + _escape(placement.subscription.casefold()[:8])
    return zone


def _part(dimension: str, placement: Placement) -> tuple[str | None, str]:
    """(this dimension's part of the group key, or None and why the VM has none)."""
    if dimension == "zone":
        if not placement.zone:
            return None, "Azure places it in no availability zone"
        return f"zone={zone_key(placement)}", ""
    if dimension == "subscription":
        if not placement.subscription:
            return None, "its subscription is not known"
        return f"subscription={placement.subscription.casefold()}", ""
    if dimension == "set":
        if placement.scale_set:
            return f"set=ss:{_escape(placement.scale_set.casefold())}", ""
        if placement.availability_set:
            return f"set=as:{_escape(placement.availability_set.casefold())}", ""
        return None, "it is in no scale set or availability set"
    name = dimension.removeprefix(TAG)
    value = {k.casefold(): v for k, v in placement.tags.items()}.get(name.casefold())
    if value is None:
        return None, f"it has no tag {name!r}"
    return f"tag:{_escape(name.casefold())}={_escape(value)}", ""


def group_key(budget: Budget, placement: Placement) -> str | None:
    """The VM's group in `budget` ("tag:service=checkout|zone=1"), or None when it lacks
    one of the budget's dimensions (then the budget does not cover it)."""
    return coverage_of(budget, placement)[0]


def coverage_of(budget: Budget, placement: Placement) -> tuple[str | None, str]:
    """(group key, "") or (None, why the VM is in no group of `budget`)."""
    parts = []
    for dimension in budget.group_by:
        part, why = _part(dimension, placement)
        if part is None:
            return None, why
        parts.append(part)
    return "|".join(parts), ""


def disruptive(event: ScheduledEvent) -> bool:
    """What a budget counts: what the capacity guard counts. Impactful events (all but
    Freezes below 9 s), except Terminate: a scale-in's deletion is what the set's owner
    asked for, and holding it back would only move it to NotBefore."""
    return event.event_type.casefold() != TERMINATE.casefold() and is_impactful(event)


def why_not_covered(budget: Budget, event: ScheduledEvent, placement: Placement) -> str:
    """ "" when `budget` covers this VM for `event`, else why not (for `policy explain`)."""
    if not disruptive(event):
        return "budgets count only disruptive events (not Terminate, not a Freeze below 9 s)"
    if not budget.match.matches_event(event):
        return "its match leaves out this event"
    if not budget.match.matches_vm((placement.name,), placement.scale_sets, placement.tags):
        return "its match leaves out this VM"
    return coverage_of(budget, placement)[1]


def counted_in(budgets: Sequence[Budget], placement: Placement) -> list[tuple[str, str]]:
    """The (budget, group) pairs whose size counts this VM: a VM is in a group when the
    budget's match takes it as a VM (names, scale sets, tags; whatever the event) and it
    has every dimension of the group. How the identity sync sizes groups."""
    out = []
    for budget in budgets:
        if not budget.match.matches_vm((placement.name,), placement.scale_sets, placement.tags):
            continue
        group = group_key(budget, placement)
        if group is not None:
            out.append((budget.name, group))
    return out


def budgets_fingerprint(budgets: Sequence[Budget]) -> str:
    """What the groups and their sizes depend on (names, group_by, match; not the limits):
    a change means the sizes must be counted again."""
    text = json.dumps(
        [b.model_dump(mode="json", include={"name", "group_by", "match"}) for b in budgets],
        sort_keys=True,
    )
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class Slot(NamedTuple):
    """One slot an approval needs: in `budget`'s group `group`, at most `limit` VMs out."""

    budget: str
    group: str
    limit: int


SizeLookup = Callable[[str, str], int | None]  # (budget, group) -> VMs Azure lists in it


def slots_for(
    budgets: Sequence[Budget],
    event: ScheduledEvent,
    placements: Placement | Iterable[Placement],
    size: SizeLookup | Mapping[tuple[str, str], int] = lambda budget, group: None,
) -> list[Slot]:
    """The slots a disruptive approval of `event` for one VM needs, all or none: one per
    budget that covers the VM (`effective_budgets` gives the default per-set one too).

    `placements` are Azure's facts for the VM's name: usually one; names repeat across
    resource groups, and then the VM is counted in every group any of them is in (the
    safe side). `size` gives a group's size as the identity sync counted it (only read for
    percentage budgets). An event that is not disruptive needs none (`why_not_covered`
    says so for every budget)."""
    if isinstance(placements, Placement):
        placements = (placements,)
    if isinstance(size, Mapping):
        sizes = size
        size = lambda budget, group: sizes.get((budget, group))  # noqa: E731
    slots: list[Slot] = []
    seen: set[tuple[str, str]] = set()
    for placement in placements:
        for budget in budgets:
            if why_not_covered(budget, event, placement):
                continue
            group = group_key(budget, placement)
            assert group is not None
            if (budget.name, group) in seen:
                continue
            seen.add((budget.name, group))
            known = size(budget.name, group) if budget.percent is not None else None
            slots.append(Slot(budget.name, group, budget.limit(known)))
    return slots


def waiting_text(slot: Slot, holders: Sequence[str]) -> str:
    """What a waiting approval says, in cards and on the fleet page:
    "waiting for budget checkout-web (1 of 1: vm-a)"."""
    shown = ", ".join(holders[:MAX_LISTED])
    more = len(holders) - MAX_LISTED
    if more > 0:
        shown += f" and {more} more"
    taken = f"{len(holders)} of {slot.limit}"
    return (
        f"waiting for budget {slot.budget} ({taken}: {shown})"
        if shown
        else (f"waiting for budget {slot.budget} ({taken})")
    )


def per_set_notes(budgets: Sequence[Budget], max_concurrent_per_set: int) -> list[str]:
    """Warnings for `settings check`, `policy check` and `policy explain`: a budget that
    lets more VMs out at once than `max_concurrent_per_set` replaces it for the VMs it
    covers (issue 45: a 20 % budget was once silently cut to one VM per set)."""
    notes = []
    for budget in budgets:
        more = budget.percent is not None or int(budget.max_unavailable) > max_concurrent_per_set
        if more and not unreachable(budget.match):
            notes.append(
                f"budget {budget.name!r} (max_unavailable {budget.max_unavailable}) replaces "
                f"max_concurrent_per_set ({max_concurrent_per_set}) for the VMs it covers, so "
                "more than that of one set may be out at once; VMs no budget covers stay at "
                f"{max_concurrent_per_set} per set"
            )
    return notes


def lint_budgets(budgets: Sequence[Budget]) -> tuple[list[str], list[str]]:
    """(errors, warnings) about the budgets as a whole, each naming its budget."""
    errors: list[str] = []
    warnings: list[str] = []
    names = [b.name.casefold() for b in budgets]
    repeated = sorted({b.name for b in budgets if names.count(b.name.casefold()) > 1})
    if repeated:
        errors.append(f"budget names must be unique; repeated: {repeated}")
    if DEFAULT_BUDGET in names:
        errors.append(
            f"budget name {DEFAULT_BUDGET!r} is max_concurrent_per_set's (the default budget "
            "over sets): choose another"
        )
    if len(budgets) > MAX_BUDGETS:
        errors.append(f"at most {MAX_BUDGETS} budgets, not {len(budgets)}")
    for budget in budgets:
        why = unreachable(budget.match)
        if why:
            warnings.append(f"budget {budget.name!r} never covers a VM: {why}")
            continue
        types = budget.match.event_types
        if types is not None and all(t.casefold() == TERMINATE.casefold() for t in types):
            warnings.append(
                f"budget {budget.name!r} never covers a VM: it matches only Terminate, "
                "which budgets never count"
            )
        if budget.percent is not None and budget.percent >= 100:
            warnings.append(
                f"budget {budget.name!r} never holds an approval back: max_unavailable is "
                "100% of its group"
            )
    return errors, warnings
