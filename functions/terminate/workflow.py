"""The drain workflow: take the VMs out of service, then approve, all before NotBefore.

Runs for a `decided` notification whose decision is `drain`, whatever the event type: a
scale-in Terminate (the default policy), or a Reboot, Redeploy, Preempt or Freeze a
policy rule asks to drain (the `terminate` subscription, named for its first use). Steps,
each run at most once fleet-wide (functions.store.drains):
  capacity (its sets' and budgets' slots, as an approval takes; not for a Terminate) →
  announce drain_started → HTTP drain hook (DRAIN__HTTP_URL) → relay hook script on each
  VM to drain, all at once (DRAIN__RELAY_HOOK) → [on failure: announce drain_failed, then approve
  or hold per DRAIN__ON_FAILURE] → approve through a relay (or ARM).
Deadline = NotBefore - DRAIN__SAFETY_MARGIN_SECONDS. Drain steps must end
DRAIN__APPROVE_RESERVE_SECONDS before it, each within DRAIN__STEP_TIMEOUT_SECONDS; approval
gives up at the deadline. A step that cannot start in time fails ("no time left") rather
than run late. A Preempt has about 30 s of notice: its margins are DRAIN__PREEMPT_* (5 s
and 2 s), so its drain is cut short in time and the eviction is approved or let go before
NotBefore.
Only the named VMs whose own view decided drain are drained (functions.terminate.targets):
the event's decision is the strictest of its reporters' views, so a set-mate's forged view
can make the whole event a drain, but not drain another VM; the approval afterwards is
asked of a drained VM's relay, which checks its own view against its IMDS.
The undrain (run_undrain) puts back what a drain reached when the event ends with the VM
still there: cancelled (any type), or completed for a Freeze, Reboot or Redeploy.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime, timedelta

from functions.clock import Clock
from functions.model.drains import NO_DRAIN, DrainChoice, RelayFacts, drain_for
from functions.model.envelope import PREEMPT, TERMINATE, USER
from functions.model.event import Notification, Transition
from functions.store.drains import StepRecord
from functions.terminate.context import (
    ANNOUNCE_LEASE_SECONDS,
    DrainContext,
    DrainResult,
    Outcome,
    Steps,
)
from functions.terminate.plan import drain_deadlines, relay_step
from functions.terminate.relays import drain_relays
from functions.terminate.settings import DrainSettings, UndrainSettings
from functions.terminate.steps import http_drain
from functions.terminate.targets import DrainTargets
from functions.terminate.undrain import run_undrain, wants_undrain

log = logging.getLogger(__name__)

# approve_event's "skipped" reasons that mean the approval is settled without us.
SETTLED = frozenset({"already approved", "event already started"})
# How long a drain waits for a named VM's own report (its relay polls IMDS every second and
# its document reaches ingest within seconds), and how often it reads the reporters again.
REPORT_WAIT_SECONDS = 20.0
REPORT_POLL_SECONDS = 2.0

__all__ = [
    "DrainContext",
    "DrainResult",
    "DrainSettings",
    "UndrainSettings",
    "run_drain",
    "run_undrain",
    "wants",
    "wants_undrain",
]


def wants(note: Notification) -> bool:
    """A `decided` drain, of any event type: the policy asked for it."""
    event, decision = note.event, note.decision
    return (
        note.transition is Transition.DECIDED
        and event is not None
        and decision is not None
        and decision.action == "drain"
    )


def run_drain(note: Notification, settings: DrainSettings, ctx: DrainContext) -> DrainResult:
    """Drain then approve (or hold) one event; resumable and run-once per step."""
    if not wants(note):
        return DrainResult(
            note.event.event_id if note.event else "-",
            "skipped",
            detail="not a decided drain",
        )
    assert note.event is not None and note.decision is not None
    event, decision = note.event, note.decision
    if decision.dry_run:
        return DrainResult(event.event_id, "skipped", detail="dry run: nothing drained or approved")
    if event.not_before is None:
        return DrainResult(event.event_id, "skipped", detail="no NotBefore: already started")
    deadline, drain_until = drain_deadlines(event.not_before, event.event_type, settings)
    steps = Steps(event.event_id, ctx)
    clock = ctx.clock

    def announce(transition: Transition, detail: str) -> Callable[[datetime], tuple[bool, str]]:
        def send(_until: datetime) -> tuple[bool, str]:
            extra = {}
            if ctx.pages is not None:  # the same verdict functions.pipeline.announce gives
                extra["page"] = ctx.pages(transition) or decision.page
            ctx.publish(
                Notification(
                    transition=transition,
                    occurred_at=clock.now(),
                    event=event,
                    decision=decision,
                    detail=detail,
                    links=note.links,
                    **extra,
                )
            )
            return True, detail

        return send

    # Only VMs whose own view decided drain (issue 27); a named VM not heard from yet gets
    # a little time for its relay's report.
    targets = await_reports(ctx, event.event_id, drain_until, settings.poll_seconds)
    if targets.now_decided == "hold":
        # A view reported since the drain was decided holds the event: nothing is drained
        # or approved (that decision is announced by ingest).
        log.warning("drain %s: the event is held now; nothing drained", event.event_id)
        return DrainResult(
            event.event_id,
            "skipped",
            detail="the event's decision is hold now: nothing drained or approved",
            not_drained=targets.not_drained,
        )
    skipped = targets.summary()
    if skipped:
        log.warning("drain %s: %s", event.event_id, skipped)

    if ctx.capacity is not None:
        # The capacity guard, as for `approve`: no more VMs of a set down at once than the
        # policy allows, so a drained reboot waits for its set-mate's to end, undrained.
        capacity = ctx.capacity
        slot = steps.once(
            "capacity",
            drain_until,
            lambda until: _take_capacity(capacity, event.event_id, until, clock, settings),
        )
        if slot.status != "succeeded":
            steps.once(
                "announce:drain_failed",
                clock.now() + timedelta(seconds=ANNOUNCE_LEASE_SECONDS),
                announce(
                    Transition.DRAIN_FAILED,
                    f"{slot.detail}: nothing drained, {_held(event.event_type)}",
                ),
            )
            return DrainResult(
                event.event_id, "held", False, slot.detail, steps.records, targets.not_drained
            )

    drained_vms = targets.drain
    # Which drain each VM really has (functions.model.drains.drain_for, from its relay's
    # verified heartbeat): the readiness probe only where a load balancer probes it.
    choices = _choices(ctx, settings, drained_vms)
    now = clock.now()
    relay_plan = {vm: (relay_step(f, settings, now), f) for vm, (f, _) in choices.items()}
    undrained = [vm for vm, (_, choice) in choices.items() if choice.kind == "none"]
    # A User Reboot or Redeploy with no drain is approved at once (its owner asked for it);
    # a scale-in Terminate is not: deleting it undrained at once cuts the in-flight work its
    # notice leaves time for (issue 33), as functions.model.policy.no_drain decides too.
    user = (event.event_source or "").casefold() == USER.casefold() and (
        event.event_type.casefold() != TERMINATE.casefold()
    )
    plan = []
    if settings.http_url and drained_vms:
        plan.append(f"HTTP drain hook for {len(drained_vms)} VM(s)")
    hooks = [vm for vm, (mode, _) in relay_plan.items() if mode == "hook"]
    ready = [vm for vm, (mode, _) in relay_plan.items() if mode == "readiness"]
    if hooks:
        plan.append(
            f"relay hook {settings.relay_hook!r} on {len(hooks)} VM(s)"
            + (
                " (its readiness probe where a relay has no such hook and a load balancer "
                "probes it)"
                if settings.readiness
                else ""
            )
        )
    if ready:
        plan.append(
            f"readiness probe 503 on {len(ready)} VM(s) a load balancer probes (out of "
            f"their load balancer), then {settings.readiness_wait_seconds():g} s to drain "
            "(the probe's timing and established connections)"
        )
    nothing = (
        _no_drain(choices, undrained, user, event.event_type)
        if drained_vms
        else "no VM's own view decided drain"
    )
    held = bool(undrained) and not user
    started = (
        "; ".join(p for p in (" then ".join(plan), nothing if undrained else "") if p) or nothing
    )
    approving = not held and not (drained_vms and not plan and not user)
    started += (f"; approval by {deadline:%H:%M:%S UTC}" if approving else "") + (
        f"; {skipped}" if skipped else ""
    )
    steps.once(
        "announce:drain_started",
        clock.now() + timedelta(seconds=ANNOUNCE_LEASE_SECONDS),
        announce(Transition.DRAIN_STARTED, started),
    )

    drain_steps: list[StepRecord] = []
    if settings.http_url and drained_vms:
        url = settings.http_url
        drain_steps.append(
            steps.once(
                "http",
                drain_until,  # an unreachable hook is tried until then (issue 40)
                lambda until: http_drain(
                    ctx.session,
                    url,
                    event,
                    until,
                    clock.now,
                    clock.sleep,
                    ctx.webhook_secret,
                    vms=drained_vms,
                    scale_set_of=ctx.scale_set_of,
                    run_seconds=settings.step_timeout_seconds,
                ),
            )
        )
    # The operator's relay hook, or the relay's readiness probe, on each VM that has one.
    drain_steps += drain_relays(ctx, steps, settings, event.event_id, relay_plan, drain_until)
    if held:
        # A VM with no working drain is never approved undrained: a Platform event is
        # held (drain_started said so) and Azure starts it at NotBefore; the VMs that have
        # a drain were drained meanwhile.
        log.warning("drain %s: %s", event.event_id, nothing)
        return DrainResult(
            event.event_id, "held", False, nothing, steps.records, targets.not_drained
        )
    failures = [
        f"{record.step}: {record.detail}" for record in drain_steps if record.status != "succeeded"
    ]
    drained = not failures and not undrained
    if failures:
        what = "; ".join(failures)
        then = "approving anyway" if settings.on_failure == "approve" else _held(event.event_type)
        steps.once(
            "announce:drain_failed",
            clock.now() + timedelta(seconds=ANNOUNCE_LEASE_SECONDS),
            announce(Transition.DRAIN_FAILED, f"{what} — {then} (DRAIN__ON_FAILURE)"),
        )
        if settings.on_failure == "hold":
            return DrainResult(
                event.event_id, "held", False, what, steps.records, targets.not_drained
            )

    # The approval is asked of a relay whose own view decided drain (it checks that view
    # against its IMDS); with none drained, the approver's own rules choose.
    approval = steps.once(
        "approve",
        deadline,
        lambda until: _approve(ctx, event.event_id, until, drained_vms or None),
    )
    outcome: Outcome = "approved" if approval.status == "succeeded" else "approval_failed"
    return DrainResult(
        event.event_id, outcome, drained, approval.detail, steps.records, targets.not_drained
    )


def await_reports(
    ctx: DrainContext, event_id: str, drain_until: datetime, poll_seconds: float
) -> DrainTargets:
    """The drain's targets (ctx.own_drains: the event row and one reporter-rows query).
    A named VM whose relay has not reported the event yet (a set-mate's document came
    first) is waited for, at most REPORT_WAIT_SECONDS and a quarter of the time left to
    drain, asking again every REPORT_POLL_SECONDS or more: a bounded number of queries
    per run, whatever the number of VMs."""
    clock = ctx.clock
    start = clock.now()
    wait = min(REPORT_WAIT_SECONDS, max((drain_until - start).total_seconds(), 0) / 4)
    every = max(poll_seconds, REPORT_POLL_SECONDS)
    for _ in range(int(wait // every) + 1):
        targets = ctx.own_drains(event_id, False)
        left = wait - (clock.now() - start).total_seconds()
        if not targets.unheard or left <= 0:
            return targets
        clock.sleep(min(every, left))
    return ctx.own_drains(event_id, False)


def _take_capacity(
    capacity: Callable[[str], bool],
    event_id: str,
    until: datetime,
    clock: Clock,
    settings: DrainSettings,
) -> tuple[bool, str]:
    """A slot in each of the event's sets and budgets (all or none), re-tried until `until`."""
    while True:
        if capacity(event_id):
            return True, "capacity taken in its sets and budgets"
        left = (until - clock.now()).total_seconds()
        if left <= 0:
            return False, "no capacity in its sets or budgets before the drain deadline"
        clock.sleep(min(settings.poll_seconds, left))


def _choices(
    ctx: DrainContext, settings: DrainSettings, vms: tuple[str, ...]
) -> dict[str, tuple[RelayFacts | None, DrainChoice]]:
    """Each VM's relay facts (ctx.relay_facts: its verified heartbeat) and drain."""
    now = ctx.clock.now()
    out: dict[str, tuple[RelayFacts | None, DrainChoice]] = {}
    for vm in vms:
        facts = None
        if ctx.relay_facts is not None:
            try:
                facts = ctx.relay_facts(vm)
            except Exception:  # no heartbeat known is what that means for its drain
                log.exception("drain: relay facts of %.200r", vm)
        out[vm] = (facts, drain_for(facts, settings, now))
    return out


def _no_drain(
    choices: dict[str, tuple[RelayFacts | None, DrainChoice]],
    undrained: list[str],
    user: bool,
    event_type: str,
) -> str:
    """The announcement's words for VMs with no working drain: held (a Platform event,
    until NotBefore) or approved at once (a User event), each VM named with why."""
    if not undrained:
        return "nothing to drain"
    then = "approved at once (a User event)" if user else f"held: {_held(event_type)}"
    named = "; ".join(
        f"{vm}: {choices[vm][1].why.removeprefix(NO_DRAIN + ': ')}" for vm in undrained[:10]
    )
    more = f" (and {len(undrained) - 10} more)" if len(undrained) > 10 else ""
    return f"{NO_DRAIN}: {then} ({named}{more})"


def _held(event_type: str) -> str:
    """What holding means for this type: a Preempt is not held, Azure evicts at NotBefore."""
    if event_type.casefold() == PREEMPT.casefold():
        return "not approving: Azure evicts it at NotBefore"
    return "holding until NotBefore"


BUSY = "another caller is approving it"
# approve_event's wait for the event's `decided` to be out first (issue 46).
ANNOUNCING = "its decision is being announced"


def _approve(
    ctx: DrainContext, event_id: str, until: datetime, relays: tuple[str, ...] | None
) -> tuple[bool, str]:
    while True:
        result = ctx.approve(event_id, until, relays)
        outcome = getattr(result, "outcome", result)
        detail = getattr(result, "detail", "") or ""
        left = (until - ctx.clock.now()).total_seconds()
        if outcome != "skipped" or detail not in (BUSY, ANNOUNCING) or left <= 0:
            break
        # Someone holds the approval's claim: perhaps this step's previous runner, which
        # died mid-approval. Its claim lapses within the approval lease and is taken over
        # here; a live holder finishes first and the next try finds it settled. Or the
        # event's `decided` is not out yet: its publisher marks it done within its
        # announcement lease, or the decider publishes it (ctx.approve) once that lapsed.
        ctx.clock.sleep(min(REPORT_POLL_SECONDS, left))
    if outcome == "approved":
        return True, f"approved {detail}".strip()
    if outcome == "skipped" and detail in SETTLED:
        return True, f"nothing to approve: {detail}"
    return False, f"{outcome}: {detail}".strip(": ")
