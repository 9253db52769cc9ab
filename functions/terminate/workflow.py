"""The drain workflow: take the VMs out of service, then approve, all before NotBefore.

Runs for a `decided` notification whose decision is `drain`, whatever the event type: a
scale-in Terminate (the default policy), or a Reboot, Redeploy, Preempt or Freeze a
policy rule asks to drain (the `terminate` subscription, named for its first use). Steps,
each run at most once fleet-wide (functions.store.drains):
  capacity (a slot in each of its sets, as an approval takes; not for a Terminate) →
  announce drain_started → HTTP drain hook (DRAIN__HTTP_URL) → relay hook script on each
  VM, all at once (DRAIN__RELAY_HOOK) → [on failure: announce drain_failed, then approve
  or hold per DRAIN__ON_FAILURE] → approve through a relay (or ARM).
Deadline = NotBefore - DRAIN__SAFETY_MARGIN_SECONDS. Drain steps must end
DRAIN__APPROVE_RESERVE_SECONDS before it, each within DRAIN__STEP_TIMEOUT_SECONDS; approval
gives up at the deadline. A step that cannot start in time fails ("no time left") rather
than run late. A Preempt has about 30 s of notice: its margins are DRAIN__PREEMPT_* (5 s
and 2 s), so its drain is cut short in time and the eviction is approved or let go before
NotBefore.
The undrain (run_undrain) puts back what a drain reached when the event ends with the VM
still there: cancelled (any type), or completed for a Freeze, Reboot or Redeploy.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Literal

import requests

from functions.approvers.relay import RelayTarget
from functions.clock import Clock, SystemClock
from functions.model.envelope import FREEZE, PREEMPT, REBOOT, REDEPLOY
from functions.model.event import Notification, Transition
from functions.store.drains import DrainStore, StepRecord
from functions.terminate.settings import DrainSettings, UndrainSettings
from functions.terminate.steps import budget, http_drain, relay_hook

log = logging.getLogger(__name__)

WAIT_POLL_SECONDS = 1.0  # how often a second invocation re-reads a step another one runs
ANNOUNCE_LEASE_SECONDS = 60.0  # announcements go out even after the deadline
MAX_PARALLEL_HOOKS = 16

# approve_event's "skipped" reasons that mean the approval is settled without us.
SETTLED = frozenset({"already approved", "another caller is approving it", "event already started"})

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

# Types after which the VM is still there (paused, rebooted, moved): a drain is undone when
# they complete. After a Terminate (deleted) or a Preempt (evicted) there is nothing to put
# back; a cancelled event of any type is undone.
BACK_AFTER = frozenset(t.casefold() for t in (FREEZE, REBOOT, REDEPLOY))

Outcome = Literal["approved", "held", "approval_failed", "skipped", "undrained", "undrain_failed"]


# approve(event_id, give_up_at) → "approved" | "failed" | "skipped" | ..., or an object with
# `.outcome` and `.detail` (functions.pipeline.approve.ApprovalResult).
Approve = Callable[[str, datetime], Any]
Publish = Callable[[Notification], None]
# VM name → its relay as the app knows it (Azure's address, its attested key), or None.
Targets = Callable[[str], RelayTarget | None]


@dataclass
class DrainContext:
    store: DrainStore
    session: requests.Session
    publish: Publish
    approve: Approve
    relay_target: Targets
    clock: Clock = field(default_factory=SystemClock)
    # Signs the HTTP drain hook request when set; two secrets during a WEBHOOK_SECRET
    # rotation (one signature each).
    webhook_secret: bytes | tuple[bytes, ...] | None = None
    # Whether the policy pages on a transition (functions.model.policy.transition_pages); None:
    # the channels' defaults apply (drain_failed pages).
    pages: Callable[[Transition], bool] | None = None
    owner: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    # audit(event_id, outcome, detail): a row in the state's audit table (undrain outcomes).
    audit: Callable[[str, str, str], None] | None = None
    # capacity(event_id): take the event's capacity slots (functions.pipeline.capacity), True
    # when held or not needed; None: no guard (tests of the steps alone).
    capacity: Callable[[str], bool] | None = None


@dataclass
class DrainResult:
    event_id: str
    outcome: Outcome
    drained: bool = False
    detail: str = ""
    steps: dict[str, StepRecord] = field(default_factory=dict)


def wants_undrain(note: Notification) -> bool:
    """An event whose decision was to drain ended with its VMs still there: cancelled
    (any type), or completed after a Freeze, Reboot or Redeploy. Something may need
    undoing (run_undrain finds out what its drain reached)."""
    event, decision = note.event, note.decision
    if event is None or decision is None or decision.action != "drain" or decision.dry_run:
        return False
    if note.transition is Transition.CANCELLED:
        return True
    return note.transition is Transition.COMPLETED and event.event_type.casefold() in BACK_AFTER


def wants(note: Notification) -> bool:
    """A `decided` drain, of any event type: the policy asked for it."""
    event, decision = note.event, note.decision
    return (
        note.transition is Transition.DECIDED
        and event is not None
        and decision is not None
        and decision.action == "drain"
    )


class _Steps:
    """Run-once bookkeeping for one event's workflow."""

    def __init__(self, event_id: str, ctx: DrainContext) -> None:
        self.event_id = event_id
        self.ctx = ctx
        self.records: dict[str, StepRecord] = {}

    def once(
        self,
        step: str,
        until: datetime,
        action: Callable[[datetime], tuple[bool, str]],
        *,
        rerun_if_lost: bool,
    ) -> StepRecord:
        """Run `action(until)` unless this step already ran (or runs) elsewhere.

        A running step whose lease passed lost its runner: idempotent steps (announce, the
        relay hook the relay itself runs once, approve) are taken over; the customer's HTTP
        hook is not re-sent, it counts as timed out.
        """
        ctx, store = self.ctx, self.ctx.store
        while True:
            now = ctx.clock.now()
            current = store.get(self.event_id, step)
            if current is None:
                if until <= now:
                    record = StepRecord(
                        step=step,
                        status="failed",
                        owner=ctx.owner,
                        started_at=now,
                        lease_until=now,
                        finished_at=now,
                        detail="no time left before the deadline",
                    )
                    if store.claim(self.event_id, record):
                        return self._keep(record)
                    continue
                record = StepRecord(
                    step=step, status="running", owner=ctx.owner, started_at=now, lease_until=until
                )
                if store.claim(self.event_id, record):
                    return self._run(record, until, action)
                continue
            if current.done:
                return self._keep(current)
            if current.lease_until > now:
                log.info("drain %s: %s is running elsewhere; waiting", self.event_id, step)
                ctx.clock.sleep(min(WAIT_POLL_SECONDS, (current.lease_until - now).total_seconds()))
                continue
            if rerun_if_lost and until > now:
                taken = store.take_over(self.event_id, current, ctx.owner, now, until)
                if taken is not None:
                    log.warning("drain %s: taking over %s from a lost runner", self.event_id, step)
                    return self._run(taken, until, action)
                continue
            lost = current.model_copy(
                update={
                    "status": "failed",
                    "finished_at": now,
                    "detail": "timed out: its runner stopped before finishing",
                }
            )
            if store.replace(self.event_id, lost):
                return self._keep(lost)

    def _run(
        self, record: StepRecord, until: datetime, action: Callable[[datetime], tuple[bool, str]]
    ) -> StepRecord:
        try:
            ok, detail = action(until)
        except requests.RequestException as exc:  # a step's own HTTP trouble is its failure
            ok, detail = False, f"{type(exc).__name__}"
        done = record.model_copy(
            update={
                "status": "succeeded" if ok else "failed",
                "finished_at": self.ctx.clock.now(),
                "detail": detail[:1000],
            }
        )
        if not self.ctx.store.replace(self.event_id, done):
            # Someone declared us lost meanwhile; what is stored is the truth.
            stored = self.ctx.store.get(self.event_id, record.step)
            return self._keep(stored or done)
        log.info("drain %s: %s %s: %s", self.event_id, record.step, done.status, done.detail)
        return self._keep(done)

    def _keep(self, record: StepRecord) -> StepRecord:
        self.records[record.step] = record
        return record


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
    margin, reserve = settings.margins(event.event_type)
    deadline = event.not_before - timedelta(seconds=margin)
    drain_until = deadline - timedelta(seconds=reserve)
    steps = _Steps(event.event_id, ctx)
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

    if ctx.capacity is not None:
        # The capacity guard, as for `approve`: no more VMs of a set down at once than the
        # policy allows, so a drained reboot waits for its set-mate's to end, undrained.
        capacity = ctx.capacity
        slot = steps.once(
            "capacity",
            drain_until,
            lambda until: _take_capacity(capacity, event.event_id, until, clock, settings),
            rerun_if_lost=True,
        )
        if slot.status != "succeeded":
            steps.once(
                "announce:drain_failed",
                clock.now() + timedelta(seconds=ANNOUNCE_LEASE_SECONDS),
                announce(
                    Transition.DRAIN_FAILED,
                    f"{slot.detail}: nothing drained, {_held(event.event_type)}",
                ),
                rerun_if_lost=True,
            )
            return DrainResult(event.event_id, "held", False, slot.detail, steps.records)

    plan = []
    if settings.http_url:
        plan.append("HTTP drain hook")
    if settings.relay_hook:
        plan.append(f"relay hook {settings.relay_hook!r} on {len(event.resources)} VM(s)")
    started = (
        f"{' then '.join(plan) or 'no drain steps configured'}; "
        f"approval by {deadline.strftime('%H:%M:%S UTC')}"
    )
    steps.once(
        "announce:drain_started",
        clock.now() + timedelta(seconds=ANNOUNCE_LEASE_SECONDS),
        announce(Transition.DRAIN_STARTED, started),
        rerun_if_lost=True,
    )

    drain_steps: list[StepRecord] = []
    if settings.http_url:
        url = settings.http_url
        drain_steps.append(
            steps.once(
                "http",
                budget(clock.now(), drain_until, settings.step_timeout_seconds),
                lambda until: http_drain(
                    ctx.session, url, event, until, clock.now, clock.sleep, ctx.webhook_secret
                ),
                rerun_if_lost=False,
            )
        )
    if settings.relay_hook:
        hook = settings.relay_hook

        def on_vm(vm: str) -> StepRecord:
            target = ctx.relay_target(vm)  # before the step: a lookup that dies claims nothing
            return steps.once(
                f"hook:{vm}",
                budget(clock.now(), drain_until, settings.step_timeout_seconds),
                _hook_action(ctx, hook, vm, target, event.event_id, settings.poll_seconds),
                rerun_if_lost=True,
            )

        # Every VM drains at the same time: the notice is the same for all of them.
        workers = max(1, min(MAX_PARALLEL_HOOKS, len(event.resources)))
        with ThreadPoolExecutor(workers, thread_name_prefix="drain-hook") as pool:
            futures = [pool.submit(on_vm, vm) for vm in event.resources]
            wait(futures)
        drain_steps.extend(future.result() for future in futures)  # re-raises the first error
    if not plan:
        log.warning("drain %s: no DRAIN__HTTP_URL or DRAIN__RELAY_HOOK; approving", event.event_id)
    failures = [
        f"{record.step}: {record.detail}" for record in drain_steps if record.status != "succeeded"
    ]
    drained = not failures
    if not drained:
        what = "; ".join(failures)
        then = "approving anyway" if settings.on_failure == "approve" else _held(event.event_type)
        steps.once(
            "announce:drain_failed",
            clock.now() + timedelta(seconds=ANNOUNCE_LEASE_SECONDS),
            announce(Transition.DRAIN_FAILED, f"{what} — {then} (DRAIN__ON_FAILURE)"),
            rerun_if_lost=True,
        )
        if settings.on_failure == "hold":
            return DrainResult(event.event_id, "held", False, what, steps.records)

    approval = steps.once(
        "approve",
        deadline,
        lambda until: _approve(ctx, event.event_id, until),
        rerun_if_lost=True,
    )
    outcome: Outcome = "approved" if approval.status == "succeeded" else "approval_failed"
    return DrainResult(event.event_id, outcome, drained, approval.detail, steps.records)


def _take_capacity(
    capacity: Callable[[str], bool],
    event_id: str,
    until: datetime,
    clock: Clock,
    settings: DrainSettings,
) -> tuple[bool, str]:
    """A slot in each of the event's sets (all or none), re-tried until `until`."""
    while True:
        if capacity(event_id):
            return True, "capacity taken in its sets"
        left = (until - clock.now()).total_seconds()
        if left <= 0:
            return False, "its set had no capacity before the drain deadline"
        clock.sleep(min(settings.poll_seconds, left))


def _held(event_type: str) -> str:
    """What holding means for this type: a Preempt is not held, Azure evicts at NotBefore."""
    if event_type.casefold() == PREEMPT.casefold():
        return "not approving: Azure evicts it at NotBefore"
    return "holding until NotBefore"


# Drain step details that mean the step never reached its receiver: nothing to undo.
NEVER_STARTED = ("no time left before the deadline", "no relay known")


def _reached(record: StepRecord | None) -> bool:
    return record is not None and not record.detail.startswith(NEVER_STARTED)


def run_undrain(
    note: Notification,
    settings: UndrainSettings,
    ctx: DrainContext,
    drain_hook: str | None = None,
) -> DrainResult:
    """Undo the drain of an event that ended with its VMs still there (wants_undrain);
    run-once per step, like the drain.

    Only what the drain reached is undone: the HTTP undrain hook if the HTTP drain hook was
    called, the relay undrain hook on each VM whose relay drain hook was called (the relay
    runs it because its drain hook ran there for this EventId: `Undoes`). A drain step
    that was reached but has no undrain setting is a failure to report, not to skip: the
    VM stays out of service until someone puts it back. Announced once as
    `undrained` or `undrain_failed`, and audited."""
    if not wants_undrain(note):
        event_id = note.event.event_id if note.event else "-"
        return DrainResult(
            event_id, "skipped", detail="not an ended drained event with its VM back"
        )
    assert note.event is not None and note.decision is not None
    event = note.event
    done = _settled_drain_steps(ctx, event.event_id)
    http_reached = _reached(done.get("http"))
    vms = sorted(
        name.removeprefix("hook:")
        for name, rec in done.items()
        if name.startswith("hook:") and _reached(rec)
    )
    if not http_reached and not vms:
        return DrainResult(event.event_id, "skipped", detail="nothing was drained")
    steps = _Steps(event.event_id, ctx)
    clock = ctx.clock
    failures: list[str] = []
    records: list[StepRecord] = []

    def until() -> datetime:
        return clock.now() + timedelta(seconds=settings.step_timeout_seconds)

    if http_reached and settings.http_url:
        url = settings.http_url
        records.append(
            steps.once(
                "undrain:http",
                until(),
                lambda limit: http_drain(
                    ctx.session,
                    url,
                    event,
                    limit,
                    clock.now,
                    clock.sleep,
                    ctx.webhook_secret,
                    action="undrain",
                ),
                rerun_if_lost=False,
            )
        )
    elif http_reached:
        failures.append("the HTTP drain hook was called, but UNDRAIN__HTTP_URL is not set")
    if vms and settings.relay_hook:
        hook = settings.relay_hook

        def on_vm(vm: str) -> StepRecord:
            action = _hook_action(
                ctx,
                hook,
                vm,
                ctx.relay_target(vm),
                event.event_id,
                settings.poll_seconds,
                undoes=drain_hook,
                event_type=event.event_type,
            )
            return steps.once(f"undrain:hook:{vm}", until(), action, rerun_if_lost=True)

        workers = max(1, min(MAX_PARALLEL_HOOKS, len(vms)))
        with ThreadPoolExecutor(workers, thread_name_prefix="undrain-hook") as pool:
            futures = [pool.submit(on_vm, vm) for vm in vms]
            wait(futures)
        records.extend(future.result() for future in futures)
    elif vms:
        failures.append(
            f"the relay drain hook ran on {', '.join(vms)}, but UNDRAIN__RELAY_HOOK is not set"
        )
    failures += [f"{r.step}: {r.detail}" for r in records if r.status != "succeeded"]
    if failures:
        transition, outcome = Transition.UNDRAIN_FAILED, "undrain_failed"
        detail = "; ".join(failures) + " — put the VM back in service by hand"
    else:
        transition, outcome = Transition.UNDRAINED, "undrained"
        detail = "; ".join(r.detail for r in records)
    steps.once(
        f"announce:{transition.value}",
        clock.now() + timedelta(seconds=ANNOUNCE_LEASE_SECONDS),
        _announcer(ctx, note, transition, detail),
        rerun_if_lost=True,
    )
    if ctx.audit is not None:
        steps.once(
            "audit:undrain",
            clock.now() + timedelta(seconds=ANNOUNCE_LEASE_SECONDS),
            lambda _until: (ctx.audit(event.event_id, outcome, detail), (True, outcome))[1],
            rerun_if_lost=True,
        )
    return DrainResult(event.event_id, outcome, False, detail, steps.records)


def _settled_drain_steps(ctx: DrainContext, event_id: str) -> dict[str, StepRecord]:
    """The drain's step rows once none is running any more: a cancellation can arrive
    while a drain hook still runs, and undoing it must come after it. Each running step
    ends by its lease (its time limit), so this waits at most that long."""
    while True:
        done = ctx.store.steps(event_id)
        now = ctx.clock.now()
        running = [
            r.lease_until
            for name, r in done.items()
            if (name == "http" or name.startswith("hook:")) and not r.done and r.lease_until > now
        ]
        if not running:
            return done
        log.info("undrain %s: waiting for the drain's running steps", event_id)
        ctx.clock.sleep(min(WAIT_POLL_SECONDS, (min(running) - now).total_seconds()))


def _announcer(
    ctx: DrainContext, note: Notification, transition: Transition, detail: str
) -> Callable[[datetime], tuple[bool, str]]:
    decision = note.decision

    def send(_until: datetime) -> tuple[bool, str]:
        extra = {}
        if ctx.pages is not None:
            extra["page"] = ctx.pages(transition)
        ctx.publish(
            Notification(
                transition=transition,
                occurred_at=ctx.clock.now(),
                event=note.event,
                decision=decision,
                detail=detail,
                links=note.links,
                **extra,
            )
        )
        return True, detail

    return send


def _hook_action(
    ctx: DrainContext,
    hook: str,
    vm: str,
    target: RelayTarget | None,
    event_id: str,
    poll_seconds: float,
    undoes: str | None = None,
    event_type: str | None = None,
) -> Callable[[datetime], tuple[bool, str]]:
    def act(until: datetime) -> tuple[bool, str]:
        if target is None:
            return False, f"no relay known for {vm} (no attested key or no address from Azure)"
        return relay_hook(
            ctx.session,
            target,
            hook,
            event_id,
            until,
            ctx.clock.now,
            ctx.clock.sleep,
            poll_seconds,
            undoes,
            event_type,
        )

    return act


def _approve(ctx: DrainContext, event_id: str, until: datetime) -> tuple[bool, str]:
    result = ctx.approve(event_id, until)
    outcome = getattr(result, "outcome", result)
    detail = getattr(result, "detail", "") or ""
    if outcome == "approved":
        return True, f"approved {detail}".strip()
    if outcome == "skipped" and detail in SETTLED:
        return True, f"nothing to approve: {detail}"
    return False, f"{outcome}: {detail}".strip(": ")
