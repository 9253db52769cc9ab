"""The relay half of a drain: on every VM at once, the operator's relay hook or, where none
applies, the relay's readiness probe (issue 38), then the stated drain time.

The readiness drain asks the relay for its built-in hook `readyz:drain` (relay.ready): from
then its `/readyz` answers 503, so a load balancer probing it sends the VM no new flows.
Nothing of the operator's runs; after DRAIN__READINESS_SECONDS (never past the drain
deadline) the drain approves. The undrain undoes it with `readyz:undrain`
(functions.terminate.undrain). Which of the two runs is plan.relay_drain's.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor, wait
from datetime import datetime, timedelta

from functions.store.drains import StepRecord
from functions.terminate.context import MAX_PARALLEL_HOOKS, Action, DrainContext, Steps, hook_action
from functions.terminate.plan import (
    HOOK_STEP,
    READY_DRAIN,
    READY_STEP,
    READY_WAIT_STEP,
    lacks_hook,
    relay_drain,
)
from functions.terminate.settings import DrainSettings
from functions.terminate.steps import NO_SUCH_HOOK, StepResult

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
    vms: tuple[str, ...],
    drain_until: datetime,
) -> list[StepRecord]:
    """One step per VM, all at once (the notice is the same for all of them): `hook:<vm>`,
    or `ready:<vm>` where the readiness drain applies (also after a `hook:<vm>` the relay
    answered it has no such hook); then, if any VM was taken out through its probe, the
    stated drain time (`wait:readiness`). Returns each VM's deciding step and the wait."""
    mode = relay_drain(settings)
    if mode is None or not vms:
        return []

    def on_vm(vm: str) -> StepRecord:
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
            if not (settings.readiness and lacks_hook(record)):
                return record
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
    records = [future.result() for future in futures]  # re-raises the first error
    out = [r for r in records if r.step.startswith(READY_STEP) and r.status == "succeeded"]
    if out:
        since = max(r.finished_at or r.started_at for r in out)
        settle = since + timedelta(seconds=settings.readiness_seconds)
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
    """The stated drain time: until `settle` (the last probe turned 503 plus
    DRAIN__READINESS_SECONDS), or the drain deadline if that comes first. From the step
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
