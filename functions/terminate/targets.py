"""Which VMs a drain may take out of service: those whose own view decided drain.

An event's `decision` is the strictest of its reporters' views (hold > drain > approve,
functions.pipeline.views), so one set-mate reporting a shared Reboot as a Terminate, or
with itself added to `Resources`, makes the whole event a drain. Draining every name in
`Resources` would then let that VM take another out of rotation although the other's own
view never decided drain (issue 27: a VM gets no power over another VM's drain). So each
named VM is drained only on its own decision:

- its reporter row holds its own view, naming itself, and the decision made on that view
  (the event row's entry for the view's key, or the one its reporter row kept) is `drain`;
- or no VM's view is on the event row at all: the decision rests on Azure's own report
  (Event Grid) alone, which speaks for every VM it names.

A named VM whose own view decided approve or hold is not drained (and its relay is not the
one asked to approve after the drain); one that has not reported the event itself yet is
`unheard`: the workflow waits a little for its relay's report, then leaves it undrained.
Pure: the caller reads the event row and its reporter rows (one partition query).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from functions.pipeline.views import own_decision
from functions.store.events import Reporter
from functions.store.records import EventRecord

MAX_NAMED_IN_DETAIL = 10  # VMs named in an announcement's "not drained" text


@dataclass(frozen=True)
class DrainTargets:
    """`drain`: the VMs to drain, in `Resources` order. `not_drained`: each other named VM
    with the reason. `unheard`: named VMs without a view of their own yet (also in
    `not_drained`). `now_decided`: the event's decision as its row says now (None: no
    row), which a later, stricter view may have made a hold since the drain was decided."""

    drain: tuple[str, ...] = ()
    not_drained: dict[str, str] = field(default_factory=dict)
    unheard: tuple[str, ...] = ()
    now_decided: str | None = None

    def summary(self) -> str:
        """The announcement's words for what is not drained, or ""."""
        if not self.not_drained:
            return ""
        items = sorted(self.not_drained.items())
        text = "; ".join(f"{vm}: {why}" for vm, why in items[:MAX_NAMED_IN_DETAIL])
        more = len(items) - MAX_NAMED_IN_DETAIL
        return f"not drained: {text}" + (f" (and {more} more)" if more > 0 else "")


NO_EVENT = "the event row is gone"
UNHEARD = "its relay has not reported the event itself"


def drain_targets(
    record: EventRecord | None, reporters: list[Reporter], *, ended: bool = False
) -> DrainTargets:
    """The VMs of `record.resources` whose own decision is drain (see the module
    docstring). `ended`: the event has ended, so a reporter row whose status was cleared
    (the VM stopped listing it) still counts with the view it last showed (the undrain
    uses this to find what the drain reached)."""
    if record is None:
        return DrainTargets()
    now_decided = record.decision.action if record.decision is not None else None
    if not record.views:
        # Only Azure (Event Grid) reported it: its decision speaks for every VM it names.
        if now_decided == "drain":
            return DrainTargets(drain=tuple(record.resources), now_decided=now_decided)
        return DrainTargets(
            not_drained=dict.fromkeys(record.resources, "not decided drain"),
            now_decided=now_decided,
        )
    rows: dict[str, Reporter] = {}
    for one in reporters:
        if one.view is not None and (one.status or ended):
            rows[one.vm.casefold()] = one
    drain: list[str] = []
    not_drained: dict[str, str] = {}
    unheard: list[str] = []
    seen: set[str] = set()
    for name in record.resources:
        folded = name.casefold()
        if folded in seen:
            continue
        seen.add(folded)
        reporter = rows.get(folded)
        if reporter is None or reporter.view is None:
            not_drained[name] = UNHEARD
            unheard.append(name)
            continue
        if folded not in reporter.view.resources:
            not_drained[name] = "its own view does not name it"
            continue
        own = own_decision(record, reporter.key, reporter.decision)
        if own is None:
            not_drained[name] = "no decision on its own view"
        elif own.action != "drain":
            not_drained[name] = f"its own view decided {own.action} ({own.rule})"
        else:
            drain.append(name)
    return DrainTargets(tuple(drain), not_drained, tuple(unheard), now_decided)
