"""The relay half of a drain: on every VM at once, the operator's relay hook or, where none
applies and a load balancer probes the relay, its readiness probe (issue 38, issue 44),
then the wait for the load balancer and established connections.

The readiness drain asks the relay for its built-in hook `readyz:drain` (relay.ready): from
then its `/readyz` answers 503, so a load balancer probing it sends the VM no new flows.
Nothing of the operator's runs; after the probe's timing (DRAIN__PROBE_INTERVAL_SECONDS x
DRAIN__PROBE_THRESHOLD) plus DRAIN__CONNECTION_SECONDS, never past the drain deadline, the
drain approves. The undrain undoes it with `readyz:undrain`
(functions.terminate.undrain). Which of the two runs on a VM is plan.relay_step's.
"""

from __future__ import annotations

from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor, wait
from datetime import datetime, timedelta

from functions.model.drains import RelayFacts
from functions.store.drains import StepRecord
from functions.terminate.context import MAX_PARALLEL_HOOKS, Action, DrainContext, Steps, hook_action
from functions.terminate.plan import (
    HOOK_STEP,
    READY_DRAIN,
    READY_STEP,
    READY_WAIT_STEP,
    RelayDrain,
    lacks_hook,
    probe_step,
)
from functions.terminate.settings import DrainSettings
from functions.terminate.steps import NO_SUCH_HOOK, StepResult

# A VM's relay step (plan.relay_step; None: none) and its relay's facts.
RelayPlan = tuple[RelayDrain | None, RelayFacts | None]

# Said instead of the relay's 404 "unknown hook" for the built-in: why a relay has none.
NO_PROBE = (
    "the relay's readiness probe is off (RELAY_READY_LISTEN unset) or the relay is older "
    "than this app: it cannot be drained through its probe"
)


def drain_relays(
    ctx: DrainContext,
    steps: Steps,
    settings: DrainSettings,
    event_id: str,
    plan: Mapping[str, RelayPlan],
    drain_until: datetime,
) -> list[StepRecord]:
    """One step per VM with a relay step in `plan` (plan.relay_step), all at once (the
    notice is the same for all of them): `hook:<vm>`, or `ready:<vm>` where its readiness
    drain works (also after a `hook:<vm>` the relay answered it has no such hook, where a
    load balancer probes it: plan.probe_step); then, if any VM was taken out through its
    probe, the wait for its load balancer and established connections (`wait:readiness`).
    Returns each VM's deciding step and the wait."""
    vms = [vm for vm, (mode, _) in plan.items() if mode is not None]
    if not vms:
        return []

    def on_vm(vm: str) -> StepRecord | None:
        mode, facts = plan[vm]
        target = ctx.relay_target(vm)  # before the step: a lookup that dies claims nothing
        if mode == "hook":
            assert settings.relay_hook
            record = steps.once(
                f"{HOOK_STEP}{vm}",
                drain_until,  # an unreachable relay is asked again until then (issue 40)
                hook_action(
                    ctx,
                    settings.relay_hook,
                    vm,
                    target,
                    event_id,
                    settings.poll_seconds,
                    run_seconds=settings.step_timeout_seconds,
                ),
            )
            if not lacks_hook(record):
                return record
            if probe_step(facts, settings, ctx.clock.now()) is None:
                # No such hook and no probed readiness drain: the HTTP drain speaks for the
                # VM where it is configured, else the hook's failure stands (no drain).
                return None if settings.http_url else record
        action = hook_action(
            ctx,
            READY_DRAIN,
            vm,
            target,
            event_id,
            settings.poll_seconds,
            run_seconds=settings.step_timeout_seconds,
        )
        return steps.once(f"{READY_STEP}{vm}", drain_until, _out_of_rotation(action))

    workers = max(1, min(MAX_PARALLEL_HOOKS, len(vms)))
    with ThreadPoolExecutor(workers, thread_name_prefix="drain-hook") as pool:
        futures = [pool.submit(on_vm, vm) for vm in vms]
        wait(futures)
    found = [future.result() for future in futures]  # re-raises the first error
    records = [r for r in found if r is not None]
    out = [r for r in records if r.step.startswith(READY_STEP) and r.status == "succeeded"]
    if out:
        since = max(r.finished_at or r.started_at for r in out)
        settle = since + timedelta(seconds=settings.readiness_wait_seconds())
        records.append(steps.once(READY_WAIT_STEP, drain_until, _wait_until(ctx, settle)))
    return records


def _out_of_rotation(action: Action) -> Action:
    """The built-in hook's step, in words an operator reads."""

    def run(until: datetime) -> StepResult:
        result = StepResult(*action(until))
        if result.ok:
            return result._replace(detail="readiness probe 503: out of rotation")
        if result.detail.startswith(NO_SUCH_HOOK):
            return result._replace(detail=NO_PROBE)
        return result

    return run


def _wait_until(ctx: DrainContext, settle: datetime) -> Action:
    """The wait: until `settle` (the last probe turned 503 plus
    DrainSettings.readiness_wait_seconds), or the drain deadline if that comes first. From the step
    rows' times, so a runner taking this over waits only what is left."""

    def run(until: datetime) -> StepResult:
        end = min(settle, until)
        left = (end - ctx.clock.now()).total_seconds()
        if left > 0:
            ctx.clock.sleep(left)
        cut = " (cut at the drain deadline)" if until < settle else ""
        return StepResult(True, f"out of rotation until {end:%H:%M:%S} UTC{cut}", False)

    return run


def back_in_rotation(action: Action) -> Action:
    """The built-in undo's step (`readyz:undrain`), in words an operator reads."""

    def run(until: datetime) -> StepResult:
        result = StepResult(*action(until))
        if result.ok and result.reached:
            return result._replace(detail="readiness probe 200: back in rotation")
        return result

    return run
