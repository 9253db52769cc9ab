"""The demo's disruption budget (issue 39): one service's VMs in two zonal scale sets, a
budget that lets one of them out at a time, and the outcomes that show it held.

Budgets group VMs by Azure's facts, never by what a VM says: the fleet's zones and tags are
the simulator's Resource Manager's (`place_fleet`), and at start-up the app's own identity
sync (functions.pipeline.identity_sync, the timer's code) runs one pass against the
simulator's Resource Graph, writing the placements and group sizes the decider reads
(`sync_placements`). The steps naming a budget (local.plan.Step.budget) take turns: each
later one waits, its `decided` announcement says for what, and it is approved only once the
one before it is over; at no moment are more of the group's VMs out than the budget allows
(`budget_outcomes`, from the simulator's documents and StartRequests, and the slot row).

The turns are played on conditions, not times (issue 47): a later step plays once the one
before it is seen Started in IMDS (it holds the budget by then; on a loaded machine it may
still be waiting for its approval at the later step's time), and the one before stays out
(its event in IMDS) until it was out its scenario's impact in monotonic time and the later
one's `decided` was announced. The simulator's clock is the host's wall clock: in the CI run
of issue 47 a step of it (+9.5 s, local/host_clock.py) ended checkout-z1_0's 10 s reboot
2.1 s after it started, before checkout-z2_0 was decided, which was then rightly approved at
once. `TURN_WAIT` seconds past either condition, the turn comes anyway: a bridge that never
decides fails the outcomes instead of holding the demo to its time limit.
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta
from itertools import pairwise
from typing import TYPE_CHECKING, Any

from local.report import Outcome

if TYPE_CHECKING:
    from local.demo_state import DemoState
    from local.plan import Step
    from local.watcher import EventTrack


def place_fleet(sim: Any, fleet: tuple[Any, ...]) -> None:
    """The fleet's zones and tags, as Azure's facts (Resource Graph answers them)."""
    for vm in fleet:
        if vm.zone or vm.tags:
            sim.place(vm.name, zone=vm.zone, tags=dict(vm.tags))


def sync_placements(demo: DemoState) -> None:
    """One pass of the identity sync, as the timer runs it, before any relay reports: the
    placements of every VM Resource Graph lists and the budgets' group sizes."""
    from functions.pipeline.identity_sync import run_identity_sync

    pipeline = demo.host.pipeline
    budgets = pipeline.policy.budgets if pipeline.policy is not None else ()
    if not budgets:
        return
    began = time.monotonic()
    report = run_identity_sync(pipeline)
    took = time.monotonic() - began
    ok = report.finished_pass and not report.error
    names = ", ".join(b.name for b in budgets)
    text = (
        f"identity sync (Resource Graph): {report.placements_written} VMs placed, "
        f"{report.groups_sized} group(s) of budget {names} sized, in {report.queries} "
        f"quer{'y' if report.queries == 1 else 'ies'}, {took:.1f} s"
    )
    if not ok:
        text += f": pass not finished ({report.error or 'out of time'})"
    demo.timeline.add("decide", "budgets", text, ok=None if ok else False)


TURN_WAIT = 30.0  # seconds past a turn's condition's time, after which it comes anyway
HOLD_FACTOR = 10  # a holder's event plays this many times its impact: the demo ends it


def due_steps(demo: DemoState, pending: list[Step], elapsed: float) -> list[Step]:
    """The plan's steps to play now, `elapsed` seconds in, once the holders whose turn is
    over are released (`release_turns`)."""
    release_turns(demo)
    return [s for s in pending if s.at <= elapsed and may_play(demo, s, elapsed)]


def may_play(demo: DemoState, step: Step, elapsed: float) -> bool:
    """Whether a step may play now, `elapsed` seconds into the plan (at or past its time):
    one naming a budget waits until the lane's step before it is seen Started."""
    before = _neighbour(demo, step, -1)
    if before is None or elapsed >= step.at + TURN_WAIT:
        return True
    track = _track(demo, before)
    return track is not None and track.started_at is not None


def held_impact(demo: DemoState, step: Step) -> float | None:
    """The impact a lane's step plays with when a later one waits for it: long enough that
    `release_turns`, not the simulator's clock, ends it. None: the scenario's own."""
    if _neighbour(demo, step, 1) is None:
        return None
    from simulator import SCENARIOS

    return SCENARIOS[step.scenario].impact * HOLD_FACTOR


def release_turns(demo: DemoState) -> None:
    """End each holder's event once it was out its scenario's impact (timed by the demo's
    monotonic clock) and the next step of its lane was decided, or TURN_WAIT later."""
    from simulator import SCENARIOS

    for step in list(demo.played):
        after = _neighbour(demo, step, 1)
        track = _track(demo, step)
        if after is None or track is None or track.started_at is None:
            continue
        if track.removed_at is not None or not demo.sim.event(track.event_id).active:
            continue
        out = demo.timeline.seconds() - track.started_at
        impact = SCENARIOS[step.scenario].impact / demo.sim.scale_of(track.event_type)
        decided = _decided(demo, after)
        if out < impact or (not decided and out < impact + TURN_WAIT):
            continue
        why = f"{after.target} was decided" if decided else f"{after.target} still undecided"
        demo.timeline.add("demo", step.scenario, f"{step.target} back after {out:.1f} s ({why})")
        demo.sim.remove_event(track.event_id)


def _neighbour(demo: DemoState, step: Step, offset: int) -> Step | None:
    """The step before (-1) or after (1) this one in its budget's lane, if any."""
    if not step.budget:
        return None
    lane = sorted((s for s in demo.options.plan if s.budget == step.budget), key=lambda s: s.at)
    at = lane.index(step) + offset
    return lane[at] if 0 <= at < len(lane) else None


def _track(demo: DemoState, step: Step) -> EventTrack | None:
    event_id = demo.step_events.get(step)
    if event_id is None or demo.watcher is None:
        return None
    return demo.watcher.snapshot().get(event_id)


def _decided(demo: DemoState, step: Step) -> bool:
    event_id = demo.step_events.get(step)
    published = getattr(getattr(demo, "publisher", None), "published", ())
    return event_id is not None and any(
        n.event and n.event.event_id == event_id and n.transition.value == "decided"
        for n in published
    )


def budget_outcomes(demo: DemoState) -> list[Outcome]:
    """Per budget the steps name: each step after the first waited for it (said in its
    `decided` announcement), was approved only after the one before it was over, and the
    group never had more VMs out than the budget allows."""
    events = demo.watcher.snapshot() if demo.watcher else {}
    lanes: dict[str, list[tuple[Step, EventTrack | None]]] = {}
    for step in sorted(demo.played, key=lambda s: s.at):
        if step.budget:
            event_id = demo.step_events.get(step)
            lanes.setdefault(step.budget, []).append((step, events.get(event_id or "")))
    out: list[Outcome] = []
    for name, lane in lanes.items():
        budget = _budget(demo, name)
        label = f"budget {name}"
        if budget is None:
            why = "the policy in effect has no such budget (the demo's policy has)"
            out.append(Outcome(f"{label}: enforced", False, why, skipped=True))
            continue
        if any(track is None for _, track in lane):
            out.append(Outcome(f"{label}: its events were seen", False, "an event never showed"))
            continue
        tracks = [track for _, track in lane if track is not None]
        out.append(_placed(demo, name, [step.target for step, _ in lane]))
        for before, track in pairwise(tracks):
            out.append(_waited(demo, name, before, track))
            out.append(_after(demo, before, track))
        out.append(_never_exceeded(demo, budget, tracks))
    return out


def _budget(demo: DemoState, name: str) -> Any:
    policy = getattr(getattr(getattr(demo, "settings", None), "policy", None), "policy", None)
    budgets = getattr(policy, "budgets", ()) or ()
    return next((b for b in budgets if b.name == name), None)


def _placed(demo: DemoState, name: str, vms: list[str]) -> Outcome:
    """The placements the decider read are what the fleet told the simulator's Resource
    Manager (zone, scale set, tags): Azure's facts, through the identity sync."""
    from functions.store.placements import Placements

    label = f"budget {name}: its VMs placed from Resource Graph (zone, scale set, tags)"
    store = getattr(demo, "store", None)
    if store is None:
        return Outcome(label, False, "no state store", skipped=True)
    table = Placements(store.service.get_table_client(f"{store.prefix}identities"))
    specs = {vm.name: vm for vm in demo.options.fleet}
    seen, wrong = [], []
    for vm in vms:
        spec = specs.get(vm)
        found = table.for_name(vm)
        if spec is None or len(found) != 1:
            wrong.append(f"{vm}: {len(found)} placement(s)")
            continue
        (where,) = found
        seen.append(f"{vm} zone {where.zone} {where.scale_set or where.availability_set}")
        if (where.zone, where.scale_set, where.tags) != (spec.zone, spec.scale_set, spec.tags):
            wrong.append(f"{vm}: {where.zone}, {where.scale_set}, {where.tags}")
    return Outcome(label, not wrong, "; ".join(wrong or seen))


def _vm(track: EventTrack) -> str:
    return ", ".join(track.resources)


def _waited(demo: DemoState, name: str, holder: EventTrack, track: EventTrack) -> Outcome:
    """Its `decided` announcement says it waits for the budget, naming the holder."""
    label = f"{_vm(track)}: decided card says it waits for budget {name}, held by {_vm(holder)}"
    decided = [
        n
        for n in demo.publisher.published
        if n.event and n.event.event_id == track.event_id and n.transition.value == "decided"
    ]
    said = decided[0].waiting if decided else ""
    ok = said.startswith(f"waiting for budget {name} (") and all(
        vm in said for vm in holder.resources
    )
    return Outcome(label, ok, said or ("no 'decided' announcement" if not decided else "nothing"))


def _after(demo: DemoState, holder: EventTrack, track: EventTrack) -> Outcome:
    """Approved (StartRequests) only after IMDS dropped the holder's event."""
    label = f"{_vm(track)}: approved only after {_vm(holder)}'s {holder.what} was over"
    approvals = [a for a in demo.watcher.approvals if a.event_id == track.event_id]
    over = _removed_wall(holder)
    if not approvals or over is None:
        return Outcome(label, False, "never approved" if not approvals else "never over")
    gap = (approvals[0].at - over).total_seconds()
    return Outcome(label, gap >= 0, f"StartRequests {gap:.2f} s after IMDS dropped it")


def _removed_wall(track: EventTrack) -> datetime | None:
    if track.removed_at is None:
        return None
    return track.first_seen_wall + timedelta(seconds=track.removed_at - track.first_seen)


def _never_exceeded(demo: DemoState, budget: Any, tracks: list[EventTrack]) -> Outcome:
    """At most `max_unavailable` of the lane's VMs out at once, from IMDS (Started until
    removed), and the slot row given back in the end: no holder, none waiting, none over."""
    from functions.store.budget_slots import BudgetSlots

    limit = budget.limit(len(tracks))
    label = f"budget {budget.name}: at most {limit} of its VMs out at once, slots given back"
    spans = []
    for track in tracks:
        over = _removed_wall(track)
        if track.started_wall is not None and over is not None:
            spans.append((track.started_wall, 1))
            spans.append((over, -1))
    out = peak = 0
    for _, step in sorted(spans, key=lambda s: (s[0], s[1])):
        out += step
        peak = max(peak, out)
    left: list[str] = []
    store = getattr(demo, "store", None)
    if store is not None:
        for row in BudgetSlots(store.events).budget_slots():
            if row.budget == budget.name:
                left += [f"{h.vm} holds" for h in row.holders]
                left += [f"{w.vm} waits" for w in row.waiting]
    detail = f"peak {peak} of {limit} (Started until gone from IMDS)"
    if left:
        detail += f"; left in its slot row: {', '.join(left)}"
    return Outcome(label, len(spans) == 2 * len(tracks) and peak <= limit and not left, detail)
