"""The demo's expected outcomes, checked against what each part actually observed.

Each check reads what was recorded (the simulator's documents and StartRequests, what the
receivers got, what each channel was handed), never what the plan expected, so a broken
part is a failed outcome and a non-zero exit.
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any

from functions.model.envelope import STARTED
from local.plan import Step
from local.report import Outcome
from local.watcher import EventTrack

if TYPE_CHECKING:
    from local.demo_state import DemoState


def check_outcomes(demo: DemoState) -> list[Outcome]:
    """What the demo promised, checked against what each part actually observed."""
    results: list[Outcome] = list(demo.play_errors)
    events = demo.watcher.snapshot() if demo.watcher else {}
    for step in demo.played:
        event_id = demo.step_events.get(step)
        track = events.get(event_id) if event_id else None
        name = f"{step.scenario} on {step.target}"
        if track is None:
            results.append(Outcome(f"{name}: IMDS showed the event", False, "never seen"))
            continue
        results.extend(_imds_outcomes(name, step, track))
        if demo.publisher is not None:
            pipeline = _pipeline_outcomes(demo, name, step, track)
            if demo.custom_policy:
                pipeline = judged_under_your_policy(demo, track, pipeline)
                pipeline.append(policy_difference(demo, name, track))
            results.extend(pipeline)
    if demo.publisher is not None:
        results.extend(_fleet_outcomes(demo))
    for part, why in demo.missing.items():
        results.append(Outcome(f"{part} running", False, why, skipped=True))
    return results


# What Azure does with an event whatever the policy decides: announced under any policy.
AZURE_DRIVEN = ("'cancelled' announced once", "'started' announced once")


def judged_under_your_policy(
    demo: DemoState, track: EventTrack, pipeline: list[Outcome]
) -> list[Outcome]:
    """With your POLICY__*: an event's outcomes are judged where your policy decided it as
    the demo's would; otherwise what the demo expects is not what your policy allows, and
    only what Azure does whatever the policy (a cancellation, a start) is judged."""
    why = differs_from_the_demo(demo, track.event_id)
    if why is None:
        return pipeline
    return [
        o
        if o.name.endswith(AZURE_DRIVEN)
        else Outcome(f"{o.name} [demo's policy]", o.ok, o.detail, skipped=True)
        for o in pipeline
    ]


def differs_from_the_demo(demo: DemoState, event_id: str) -> str | None:
    """Why your policy's decision for this event is not the demo's policy's, or None when
    it is (the same action, paging, channels and window, no dry run, and the same windows,
    capacity and budgets): then the demo's expectations are what your policy allows, and
    they are judged."""
    from functions.model.envelope import ScheduledEvent
    from functions.model.policy import decide
    from local.plan import demo_policy

    notes = [
        n
        for n in demo.publisher.published
        if n.event and n.event.event_id == event_id and n.decision is not None
    ]
    note = next((n for n in notes if n.transition.value in ("decided", "policy_invalid")), None)
    if note is None or note.event is None:
        return "no decision was announced"
    ours = note.decision
    if ours.policy_error:
        return "your policy is invalid: it fails closed"
    load = getattr(getattr(demo, "settings", None), "policy", None)
    yours = getattr(load, "policy", None)
    theirs = demo_policy()
    # Budgets are compared below, as they cover this event: the demo's one covers only
    # the checkout VMs, and your policy without it decides the others as the demo's does.
    mine = {"rules", "budgets"}
    if yours is None or yours.model_dump(exclude=mine) != theirs.model_dump(exclude=mine):
        return "your policy's dry run, windows, capacity or paging are not the demo's"
    event = ScheduledEvent.model_validate(note.event.imds_fields())
    default = decide(theirs, event, note.occurred_at, note.event.scale_sets)
    fleet = demo.options.fleet
    aspects = {
        "action": (ours.action, default.action),
        "dry run": (ours.dry_run, default.dry_run),
        "paging": (ours.page, default.page),
        "channels": (set(ours.channels), set(default.channels)),
        "window": (ours.approve_after, default.approve_after),
        "budgets": (covering(yours, event, fleet), covering(theirs, event, fleet)),
    }
    differ = [what for what, (a, b) in aspects.items() if a != b]
    if differ:
        mine, demos = ours.action.upper(), default.action.upper()
        return (
            f"yours: {mine} by rule {ours.rule}; the demo's: {demos} ({', '.join(differ)} differ)"
        )
    return None


def covering(policy: Any, event: Any, fleet: tuple[Any, ...]) -> list[str]:
    """The budgets of `policy` that cover `event`'s VMs where the fleet places them (the
    zones, sets and tags the demo gave the simulator's Resource Manager), as JSON."""
    from functions.model.budgets import Placement, why_not_covered

    specs = {vm.name.casefold(): vm for vm in fleet}
    found: set[str] = set()
    for name in event.resources:
        spec = specs.get(name.casefold())
        if spec is None:
            continue
        placement = Placement(
            name=spec.name,
            zone=spec.zone,
            scale_set=spec.scale_set,
            availability_set=spec.availability_set,
            tags=spec.tags,
        )
        found |= {
            b.model_dump_json() for b in policy.budgets if not why_not_covered(b, event, placement)
        }
    return sorted(found)


def policy_difference(demo: DemoState, name: str, track: EventTrack) -> Outcome:
    """What your policy did with this event next to what the demo's policy (Microsoft's
    default rules with local.plan.DEMO_RULES in front) would have done, and why they
    differ (informative: never a failure)."""
    from functions.model.envelope import ScheduledEvent
    from functions.model.policy import decide
    from local.plan import demo_policy

    notes = [
        n
        for n in demo.publisher.published
        if n.event and n.event.event_id == track.event_id and n.decision is not None
    ]
    note = next((n for n in notes if n.transition.value in ("decided", "policy_invalid")), None)
    label = f"{name}: compared with the demo's policy"
    if note is None or note.event is None:
        return Outcome(label, True, "no decision was announced", skipped=True)
    event = ScheduledEvent.model_validate(note.event.imds_fields())
    ours = note.decision
    default = decide(demo_policy(), event, note.occurred_at, note.event.scale_sets)
    mine = f"yours: {ours.action.upper()} by rule {ours.rule}"
    theirs = f"demo's: {default.action.upper()} by rule {default.rule}"
    if ours.policy_error:
        why = f"your policy is invalid, so it fails closed ({ours.policy_error})"
        return Outcome(f"{label}: DIFFERS", True, f"{mine}; {theirs}; {why}", skipped=True)
    if ours.action != default.action:
        generic = f"rule {ours.rule!r}: {ours.action}"
        why = f"your rule {ours.rule!r} matched first" + (
            f" ({ours.reason})" if ours.reason and ours.reason != generic else ""
        )
        return Outcome(f"{label}: DIFFERS", True, f"{mine}; {theirs}; {why}", skipped=True)
    if ours.dry_run and ours.action in ("approve", "drain"):
        why = "same decision, but POLICY__DRY_RUN is on: nothing was approved or drained"
        return Outcome(f"{label}: DIFFERS", True, f"{mine}; {theirs}; {why}", skipped=True)
    return Outcome(f"{label}: same", True, f"{mine}; {theirs}", skipped=True)


def _imds_outcomes(name: str, step: Step, track: EventTrack) -> list[Outcome]:
    if step.scenario == "predicted-failure":
        ahead = (track.not_before - track.first_seen_wall) if track.not_before else None
        hours = ahead.total_seconds() / 3600 if ahead else 0.0
        ok = track.first_status == "Scheduled" and track.removed_at is None
        detail = f"NotBefore {hours:.1f} h ahead, longer than the demo runs: it does not wait"
        return [Outcome(f"{name}: announced Scheduled with a long notice", ok, detail)]
    if step.scenario == "hardware-failure":
        ok = track.first_status == STARTED
        return [Outcome(f"{name}: appeared already Started", ok, track.first_status)]
    if step.scenario == "cancelled":
        ok = track.started_at is None and track.removed_at is not None
        return [Outcome(f"{name}: withdrawn by Azure without starting", ok)]
    ok = track.removed_at is not None and track.started_at is not None
    return [Outcome(f"{name}: went Scheduled → Started → removed", ok)]


def _pipeline_outcomes(demo: DemoState, name: str, step: Step, track: EventTrack) -> list[Outcome]:
    event_id = track.event_id
    notes = [n for n in demo.publisher.published if n.event and n.event.event_id == event_id]
    transitions = [n.transition.value for n in notes]
    decision = next((n.decision for n in notes if n.transition.value == "decided"), None)
    approvals = [
        a for a in (demo.watcher.approvals if demo.watcher else []) if a.event_id == event_id
    ]
    first_approval = approvals[0] if approvals else None
    out: list[Outcome] = []

    def expect_action(action: str) -> None:
        got = f"{decision.action} by rule {decision.rule}" if decision else "no decision"
        ok = decision is not None and decision.action == action
        out.append(Outcome(f"{name}: decided {action}", ok, got))

    def expect_approved_in_time() -> None:
        if first_approval is None:
            out.append(Outcome(f"{name}: approved before NotBefore", False, "no StartRequests"))
            return
        lead = (track.not_before - first_approval.at).total_seconds() if track.not_before else None
        ok = lead is not None and lead > 0 and first_approval.counted
        detail = f"StartRequests from {first_approval.vm}"
        if lead is not None:
            detail += f", {lead:.1f} s before NotBefore"
        out.append(Outcome(f"{name}: approved before NotBefore", ok, detail))

    def expect_no_approval() -> None:
        detail = ", ".join(f"{a.vm} at {a.at:%H:%M:%S}" for a in approvals) or "none"
        out.append(Outcome(f"{name}: never approved", not approvals, detail))

    def expect_announced(transition: str) -> None:
        count = transitions.count(transition)
        out.append(
            Outcome(f"{name}: '{transition}' announced once", count == 1, f"{count} time(s)")
        )

    scenario = step.scenario
    if step.drain and "terminate workflow" not in demo.missing:
        # The demo's policy drains it (the default rules): whatever its type, drained
        # first, approved before NotBefore, undrained if the VM is back afterwards.
        expect_action("drain")
        out.append(_drained_before_approval(demo, name, event_id, first_approval, step.target))
        expect_approved_in_time()
        if track.event_type in ("Freeze", "Reboot", "Redeploy"):
            out.append(_undrained(demo, name, track, transitions, step.target))
        if scenario == "preempt":
            out.append(_paged(demo, name, event_id))
    elif scenario in ("live-migration", "user-reboot", "user-redeploy"):
        expect_action("approve")
        expect_approved_in_time()
        expect_announced("approved")
    elif scenario == "platform-reboot":
        expect_action("hold")
        expect_no_approval()
        at_not_before = (
            track.started_wall is not None
            and track.not_before is not None
            and track.started_wall >= track.not_before - timedelta(seconds=0.5)
        )
        out.append(Outcome(f"{name}: started at NotBefore, not earlier", at_not_before))
        out.append(_announced_once(demo, name, track))
    elif scenario == "preempt":
        out.append(_paged(demo, name, event_id))
    elif scenario == "terminate" and "terminate workflow" in demo.missing:
        expect_action("drain")
        why = demo.missing["terminate workflow"]
        out.append(Outcome(f"{name}: drained, then approved", False, why, skipped=True))
    elif scenario == "terminate":
        expect_action("drain")
        out.append(_drained_before_approval(demo, name, event_id, first_approval, step.target))
        expect_approved_in_time()
    elif scenario == "cancelled":
        expect_no_approval()
        expect_announced("cancelled")
    elif scenario == "hardware-failure":
        expect_no_approval()
        expect_announced("started")
    elif scenario == "predicted-failure":
        expect_action("hold")
        expect_no_approval()
    if step.approved_via == "arm":
        out.extend(_approved_through_arm(demo, name, step, first_approval, notes))
    return out


def _approved_through_arm(
    demo: DemoState, name: str, step: Step, approval: Any, notes: list[Any]
) -> list[Outcome]:
    """Agentless mode: Resource Manager's acknowledge started it (the simulator recorded
    who), and the announcement says so; an event of a VM without a relay came only through
    Event Grid (no relay reported it)."""
    out = []
    who = approval.vm if approval is not None else "nobody"
    out.append(Outcome(f"{name}: approved through Resource Manager", who.startswith("arm:"), who))
    approved = [n for n in notes if n.transition.value == "approved"]
    said = approved[0].detail if approved else "no 'approved' announcement"
    out.append(
        Outcome(f"{name}: announced as approved via arm", said.startswith("approved via arm"), said)
    )
    vm = next((v for v in demo.options.fleet if v.name == step.target), None)
    store = getattr(demo, "store", None)
    if vm is not None and not vm.relay and store is not None and approval is not None:
        record = store.get_event(approval.event_id)
        grid = demo.event_grid.delivered if demo.event_grid is not None else []
        copies = [g for g in grid if g[1] == approval.event_id]
        ok = record is not None and not record.past_reporters and bool(record.arm_resource)
        detail = (
            f"{len(copies)} notification(s) delivered ({len({g[0] for g in copies})} distinct), "
            f"relays that reported it: {len(record.past_reporters) if record else '?'}"
        )
        out.append(Outcome(f"{name}: arrived through Event Grid only (no relay)", ok, detail))
    return out


def _announced_once(demo: DemoState, name: str, track: EventTrack) -> Outcome:
    """N VMs reported it; Teams got one decision card, and each transition at most once."""
    label = f"{name}: reported by {len(track.reported_by)} VMs, announced once"
    teams = [
        d
        for d in demo.recorded_deliveries()
        if d.channel == "teams" and d.event_id == track.event_id and d.posted
    ]
    # The card that tells the decision: `decided`, or `policy_invalid` when the policy failed
    # closed (then that card is the decision: nothing is approved).
    cards = [d for d in teams if d.transition in ("decided", "policy_invalid")]
    detail = f"{len(cards)} decision card(s), {len(teams)} Teams post(s) in all"
    ok = len(cards) == 1 and len(track.reported_by) >= 2
    ok = ok and len({d.message_id for d in teams}) == len(teams)
    receiver = demo.receivers.get("teams")
    if receiver is not None:
        arrived = [r for r in receiver.accepted() if track.event_id.encode() in r.raw]
        detail += f"; the Teams receiver got {len(arrived)}"
        ok = ok and len(arrived) == len(teams)
    elif "teams" not in demo.external:
        return Outcome(label, False, "Teams is off", skipped=True)
    return Outcome(label, ok, detail)


def _paged(demo: DemoState, name: str, event_id: str) -> Outcome:
    label = f"{name}: paged on-call once (PagerDuty trigger, dedup_key = event:EventId)"
    receiver = demo.receivers.get("pagerduty")
    if receiver is not None:
        triggers = [
            r
            for r in receiver.accepted()
            if isinstance(r.body, dict)
            and r.body.get("event_action") == "trigger"
            and r.body.get("dedup_key") == f"event:{event_id}"
        ]
        return Outcome(label, len(triggers) == 1, f"{len(triggers)} trigger(s) received")
    sent = [
        d
        for d in demo.recorded_deliveries()
        if d.channel == "pagerduty" and d.event_id == event_id and d.action == "trigger"
    ]
    ok = len(sent) == 1 and sent[0].posted
    return Outcome(label, ok, f"{len(sent)} trigger(s) sent to {demo.external['pagerduty']}")


def _hook_calls(demo: DemoState, event_id: str, action: str) -> list[Any]:
    """The customer's HTTP hook calls for this event: its drains or its undrains."""
    return [
        r
        for r in demo.receivers["drain"].accepted()
        if isinstance(r.body, dict)
        and r.body.get("EventId") == event_id
        and r.body.get("action", "drain") == action
    ]


def _drained_before_approval(
    demo: DemoState, name: str, event_id: str, approval: Any, vm: str | None = None
) -> Outcome:
    spec = next((v for v in demo.options.fleet if v.name == vm), None)
    if spec is not None and not spec.hooks:
        return _out_of_rotation_before_approval(demo, name, event_id, approval, spec.name)
    label = f"{name}: drained (HTTP hook and relay hook script) before approval"
    http = _hook_calls(demo, event_id, "drain")
    demo.hook_script_runs()
    script = [at for at, _vm, logged in demo.hook_runs if logged == event_id]
    if not http or not script:
        return Outcome(label, False, f"HTTP hook calls {len(http)}, script runs {len(script)}")
    if approval is None:
        return Outcome(label, False, "drained, but never approved")
    drained_at = max(http[0].at, script[0])
    lead = approval.at.timestamp() - drained_at
    detail = f"script ran once, approval {lead:.2f} s after the drain finished"
    return Outcome(label, lead >= 0 and len(script) == 1, detail)


def _out_of_rotation_before_approval(
    demo: DemoState, name: str, event_id: str, approval: Any, vm: str
) -> Outcome:
    """A VM with no script of the operator's (issue 38): the customer's HTTP hook, and its
    readiness probe 503 at least the stated drain time (DRAIN__READINESS_SECONDS, less the
    probe's 0.1 s between asks) before the one approval."""
    label = (
        f"{name}: drained through its load balancer probe (readiness 503) and the HTTP hook "
        "before approval"
    )
    http = _hook_calls(demo, event_id, "drain")
    watcher = next((w for w in demo.ready_probes if w.vm == vm), None)
    out = watcher.first_out() if watcher is not None else None
    if not http or out is None:
        probe = "never seen 503" if out is None else "seen 503"
        return Outcome(label, False, f"HTTP hook calls {len(http)}, probe {probe}")
    if approval is None:
        return Outcome(label, False, "drained, but never approved")
    drain_time = demo.drain_settings.readiness_seconds
    lead = approval.at.timestamp() - out
    detail = f"probe 503 {lead:.2f} s before the approval (drain time {drain_time:.2f} s)"
    every = watcher.every if watcher is not None else 0.0
    return Outcome(label, lead >= drain_time - every - 0.05, detail)


def _undrained(
    demo: DemoState, name: str, track: EventTrack, transitions: list[str], vm: str = ""
) -> Outcome:
    """Its VM is back after the event: put back in service once (HTTP undrain hook, and the
    relay's undrain script or, with no script, its readiness probe back to 200: checked by
    local.demo_ready), after IMDS dropped the event, and announced once."""
    spec = next((v for v in demo.options.fleet if v.name == vm), None)
    http = _hook_calls(demo, track.event_id, "undrain")
    said = transitions.count("undrained")
    if spec is not None and not spec.hooks:
        label = f"{name}: undrained once it was over (HTTP hook and readiness probe)"
        detail = f"HTTP undrain calls {len(http)}, announced {said}x"
        return Outcome(label, len(http) == 1 and said == 1, detail)
    label = f"{name}: undrained once it was over (HTTP hook and relay hook script)"
    demo.hook_script_runs()
    script = [at for at, _vm, logged in demo.undrain_runs if logged == track.event_id]
    detail = f"HTTP undrain calls {len(http)}, script runs {len(script)}, announced {said}x"
    if track.removed_at is None or not script:
        return Outcome(label, False, detail)
    removed = track.first_seen_wall.timestamp() + (track.removed_at - track.first_seen)
    after = min(script) - removed
    ok = len(http) == 1 and len(script) == 1 and said == 1 and after >= -0.5
    return Outcome(label, ok, f"{detail}, {after:.2f} s after IMDS dropped it")


def _delivery_counts(deliveries: list) -> str:
    """The deliveries in words: the report's payloads are the posted ones (and the drain
    hook's requests), so both numbers are said."""
    posted = sum(1 for d in deliveries if d.posted)
    return (
        f"{len(deliveries)} deliveries (each announcement to each channel), {posted} posted, "
        f"{len(deliveries) - posted} not sent by their channel"
    )


def _fleet_outcomes(demo: DemoState) -> list[Outcome]:
    out = []
    errors = [d for d in demo.recorded_deliveries() if d.error]
    # A payload the service would refuse (not an injected outage) is a failure.
    rejected = [r for rec in demo.receivers.values() for r in rec.received if r.problems]
    detail = "; ".join(
        [f"{d.channel} {d.message_id}: {d.error}" for d in errors[:3]]
        + [f"{r.channel} answered {r.status}: {'; '.join(r.problems)}" for r in rejected[:3]]
    )
    dead = len(demo.publisher.dead_letters) + sum(
        len(sub.dead_letters) for sub in demo.subscriptions
    )
    kept = getattr(demo, "kept", None)  # local/kept_worker.py: posts not sent yet
    pending = kept.pending() if kept is not None else 0
    if pending:
        detail = "; ".join(filter(None, [detail, f"{pending} post(s) still kept, not sent"]))
    out.append(
        Outcome(
            "every notification was accepted by its channel",
            not errors and not rejected and not dead and not pending,
            detail or _delivery_counts(demo.recorded_deliveries()),
        )
    )
    dead_letters = list((demo.inbox / "deadletter").glob("*.json")) if demo.inbox else []
    out.append(
        Outcome(
            "every forwarded document was processed",
            not dead_letters,
            f"{len(list((demo.inbox / 'processed').glob('*.json')))} processed, "
            f"{len(dead_letters)} dead-lettered",
        )
    )
    out.append(_all_admitted(demo))
    relays = getattr(demo, "relays", {})
    exited = [vm for vm, proc in relays.items() if proc.poll() is not None]
    out.append(
        Outcome(
            f"all {len(relays)} relays kept running",
            bool(relays) and not exited,
            f"exited: {', '.join(exited)}" if exited else "",
        )
    )
    return out


def _all_admitted(demo: DemoState) -> Outcome:
    """Per-VM identity: every relay message came with an attested document of its own VM
    (the simulator's IMDS, trusted through ATTESTATION_CA_PEM) and a vmId Resource Graph
    knows. A refused message is completed into the rejected table, so "processed" above
    would not show it; this does."""
    label = "every relay message was admitted (attested by its VM, known to Resource Graph)"
    store = getattr(demo, "store", None)
    if store is None:
        return Outcome(label, False, "no state store", skipped=True)
    try:
        reasons = [str(row.get("reason", ""))[:120] for row in store.rejected_rows()]
    except Exception as exc:  # Azurite gone: say so rather than fail the summary
        return Outcome(label, False, f"rejected table unreadable: {exc}", skipped=True)
    detail = "; ".join(reasons[:3]) or "none rejected"
    return Outcome(label, not reasons, f"{len(reasons)} rejected: {detail}" if reasons else detail)
