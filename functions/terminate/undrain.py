"""The undrain: put back what a drain reached once its event ended with the VM still there.

Cancelled by Azure (any type), or completed for a Freeze, Reboot or Redeploy (the VM was
paused, rebooted or moved, and is back); after a Terminate (deleted) or a Preempt (evicted)
there is nothing to put back.
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor, wait
from datetime import datetime, timedelta

from functions.model.envelope import FREEZE, REBOOT, REDEPLOY
from functions.model.event import Notification, Transition
from functions.store.drains import StepRecord
from functions.terminate.context import (
    ANNOUNCE_LEASE_SECONDS,
    MAX_PARALLEL_HOOKS,
    WAIT_POLL_SECONDS,
    DrainContext,
    DrainResult,
    Outcome,
    Steps,
    announcer,
    hook_action,
)
from functions.terminate.plan import READY_DRAIN, READY_UNDRAIN, steps_to_undo
from functions.terminate.relays import back_in_rotation
from functions.terminate.settings import UndrainSettings
from functions.terminate.steps import http_drain

log = logging.getLogger("functions.terminate.workflow")

# Types after which the VM is still there (paused, rebooted, moved): a drain is undone when
# they complete. After a Terminate (deleted) or a Preempt (evicted) there is nothing to put
# back; a cancelled event of any type is undone.
BACK_AFTER = frozenset(t.casefold() for t in (FREEZE, REBOOT, REDEPLOY))


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


def run_undrain(
    note: Notification,
    settings: UndrainSettings,
    ctx: DrainContext,
    drain_hook: str | None = None,
) -> DrainResult:
    """Undo the drain of an event that ended with its VMs still there (wants_undrain);
    run-once per step, like the drain.

    Only what the drain may have done is undone (plan.steps_to_undo): the HTTP undrain hook
    if the HTTP drain hook may have acted, the relay's built-in `readyz:undrain` on each VM
    taken out through its readiness probe (no setting needed: its probe answers 200 again),
    the relay undrain hook on each VM whose relay drain hook may have run (the relay runs it
    only if its drain hook ran there for this EventId: `Undoes`; where it never ran, the
    relay's "unknown EventId" means nothing to undo, not a failure). A drain step that was
    reached but has no undrain setting is a failure to report, not to skip: the VM stays out
    of service until someone puts it back. Announced once as `undrained` or
    `undrain_failed`, and audited; when it turns out nothing was out of service, nothing is
    announced (no page to act on)."""
    if not wants_undrain(note):
        event_id = note.event.event_id if note.event else "-"
        return DrainResult(
            event_id, "skipped", detail="not an ended drained event with its VM back"
        )
    assert note.event is not None and note.decision is not None
    event = note.event
    undo = steps_to_undo(_settled_drain_steps(ctx, event.event_id))
    http_reached, vms = undo.http, list(undo.hooks)
    if undo.empty:
        return DrainResult(event.event_id, "skipped", detail="nothing was drained")
    steps = Steps(event.event_id, ctx)
    clock = ctx.clock
    # How the event ended, for the relay's undrain hook (SCHEDULED_EVENT_STATUS).
    status = "Cancelled" if note.transition is Transition.CANCELLED else "Completed"
    failures: list[str] = []
    records: list[StepRecord] = []

    def until() -> datetime:
        return clock.now() + timedelta(seconds=settings.step_timeout_seconds)

    if http_reached and settings.http_url:
        url = settings.http_url
        # The VMs the drain request listed: those whose own view decided drain (as they
        # last showed it), and any whose relay was drained.
        own = ctx.own_drains(event.event_id, True).drain
        listed = {vm.casefold() for vm in own}
        http_vms = (*own, *(vm for vm in (*vms, *undo.ready) if vm.casefold() not in listed))
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
                    vms=http_vms or None,  # none found: every named VM (harmless)
                    scale_set_of=ctx.scale_set_of,
                ),
            )
        )
    elif http_reached:
        failures.append("the HTTP drain hook was called, but UNDRAIN__HTTP_URL is not set")
    # (step, VM, hook, the drain hook it undoes): the operator's undrain hook where its
    # drain hook may have run, the built-in readyz:undrain where the probe was turned 503.
    jobs: list[tuple[str, str, str, str | None]] = [
        (f"undrain:ready:{vm}", vm, READY_UNDRAIN, READY_DRAIN) for vm in undo.ready
    ]
    if vms and settings.relay_hook:
        jobs += [(f"undrain:hook:{vm}", vm, settings.relay_hook, drain_hook) for vm in vms]
    elif vms:
        failures.append(
            f"the relay drain hook ran on {', '.join(vms)}, but UNDRAIN__RELAY_HOOK is not set"
        )

    def on_vm(job: tuple[str, str, str, str | None]) -> StepRecord:
        step, vm, hook, undoes = job
        action = hook_action(
            ctx,
            hook,
            vm,
            ctx.relay_target(vm),
            event.event_id,
            settings.poll_seconds,
            undoes=undoes,
            event_type=event.event_type,
            event_status=status,
        )
        return steps.once(
            step, until(), back_in_rotation(action) if hook == READY_UNDRAIN else action
        )

    if jobs:
        workers = max(1, min(MAX_PARALLEL_HOOKS, len(jobs)))
        with ThreadPoolExecutor(workers, thread_name_prefix="undrain-hook") as pool:
            futures = [pool.submit(on_vm, job) for job in jobs]
            wait(futures)
        records.extend(future.result() for future in futures)
    failures += [f"{r.step}: {r.detail}" for r in records if r.status != "succeeded"]
    if not failures and records and all(r.reached is False for r in records):
        # Every receiver said its drain never ran: nothing was out of service.
        detail = "nothing was drained: " + "; ".join(f"{r.step}: {r.detail}" for r in records)
        log.info("undrain %s: %s", event.event_id, detail)
        return DrainResult(event.event_id, "skipped", False, detail, steps.records)
    outcome: Outcome
    if failures:
        transition, outcome = Transition.UNDRAIN_FAILED, "undrain_failed"
        detail = "; ".join(failures) + " — put the VM back in service by hand"
    else:
        transition, outcome = Transition.UNDRAINED, "undrained"
        detail = "; ".join(r.detail for r in records)
    steps.once(
        f"announce:{transition.value}",
        clock.now() + timedelta(seconds=ANNOUNCE_LEASE_SECONDS),
        announcer(ctx, note, transition, detail),
    )
    audit = ctx.audit
    if audit is not None:
        steps.once(
            "audit:undrain",
            clock.now() + timedelta(seconds=ANNOUNCE_LEASE_SECONDS),
            lambda _until: (audit(event.event_id, outcome, detail), (True, outcome))[1],
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
            if (name == "http" or name.startswith(("hook:", "ready:")))
            and not r.done
            and r.lease_until > now
        ]
        if not running:
            return done
        log.info("undrain %s: waiting for the drain's running steps", event_id)
        ctx.clock.sleep(min(WAIT_POLL_SECONDS, (min(running) - now).total_seconds()))
