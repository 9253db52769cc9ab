"""What a drain does, by when, and what an undrain must undo, as pure functions of the
settings, the event and the drain's step rows (`functions.store.drains`): which drain runs
on each VM's relay (relay_drain, in words drain_summary), the drain deadlines a step is
retried until, and the steps an undrain undoes. No I/O, so the lifecycle can ask them of
a row, and `policy explain` says what the drain will do.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal, NamedTuple

from functions.model.drains import NO_DRAIN, RelayFacts, drain_for
from functions.store.drains import StepRecord
from functions.terminate.settings import DrainSettings
from functions.terminate.steps import NO_SUCH_HOOK

HTTP_STEP = "http"
HOOK_STEP = "hook:"  # + VM name: the operator's relay hook (DRAIN__RELAY_HOOK)
READY_STEP = "ready:"  # + VM name: out of rotation through its relay's readiness probe
READY_WAIT_STEP = "wait:readiness"  # the stated drain time after the probes turned 503
# The relay's built-in hooks (relay.ready.Readiness.hooks; a test ties the two): the
# probe answers 503 from `READY_DRAIN` until `READY_UNDRAIN` undoes it.
READY_DRAIN, READY_UNDRAIN = "readyz:drain", "readyz:undrain"

RelayDrain = Literal["hook", "readiness"]
# Details of rows written before StepRecord.reached existed that mean the step never
# reached its receiver.
NEVER_STARTED = ("no time left before the deadline", "no relay known")


class DrainDeadlines(NamedTuple):
    """`approve_by`: NotBefore less the safety margin, when the approval must be over.
    `drain_until`: that less the approval reserve; every drain step, and every retry of a
    target that cannot be reached, ends by then."""

    approve_by: datetime
    drain_until: datetime


def drain_deadlines(
    not_before: datetime, event_type: str, settings: DrainSettings
) -> DrainDeadlines:
    """The deadlines of a drain of an event with this NotBefore and type (a Preempt's
    margins are its own: DrainSettings.margins)."""
    margin, reserve = settings.margins(event_type)
    approve_by = not_before - timedelta(seconds=margin)
    return DrainDeadlines(approve_by, approve_by - timedelta(seconds=reserve))


def relay_drain(settings: DrainSettings) -> RelayDrain | None:
    """What a VM's relay may be asked to do in a drain, before knowing the VM: the
    operator's hook where it is configured (DRAIN__RELAY_HOOK; a VM whose relay has no
    such hook is drained through its probe instead where a load balancer probes it:
    lacks_hook); with no drain step of the operator's, `readiness`. None: the HTTP hook
    alone (DRAIN__HTTP_URL wins), or nothing. Per VM, relay_step decides."""
    if settings.relay_hook:
        return "hook"
    if settings.readiness and not settings.http_url:
        return "readiness"
    return None


def relay_step(
    facts: RelayFacts | None, settings: DrainSettings, now: datetime
) -> RelayDrain | None:
    """The relay's step on a VM (functions.model.drains.drain_for decides its drain): its
    hook, or its readiness probe where a load balancer probes it, including in place of a
    configured hook its relay does not offer beside the HTTP drain (as before issue 44);
    None: the HTTP drain speaks for it, or it has no drain."""
    choice = drain_for(facts, settings, now)
    if choice.kind == "hook" or choice.kind == "readiness":
        return choice.kind
    if choice.kind == "http" and settings.relay_hook:
        return probe_step(facts, settings, now)
    return None


def probe_step(
    facts: RelayFacts | None, settings: DrainSettings, now: datetime
) -> RelayDrain | None:
    """ "readiness" where the VM's probe drain works (a load balancer probes its relay),
    else None: the step in place of a hook its relay turned out not to have."""
    bare = settings.model_copy(update={"relay_hook": None, "http_url": None})
    return "readiness" if drain_for(facts, bare, now).kind == "readiness" else None


def drain_summary(settings: DrainSettings) -> str:
    """Which drain applies, in words (`policy explain`, `settings check`): the order
    functions.model.drains.drain_for follows per VM."""
    steps = []
    if settings.http_url:
        steps.append("HTTP drain hook (DRAIN__HTTP_URL)")
    relay = relay_drain(settings)
    ready = (
        f"each VM's readiness probe 503 where a load balancer probed its relay in the "
        f"{settings.probe_window_seconds():g} s before its heartbeat (it takes the VM out), "
        f"then {settings.readiness_wait_seconds():g} s to drain ({_wait_words(settings)})"
    )
    none = (
        f"{NO_DRAIN} where no load balancer probes the relay: a Platform event or a scale-in "
        "is held until NotBefore, a User Reboot or Redeploy approved at once"
    )
    if relay == "hook":
        hook = f"relay hook {settings.relay_hook!r} (DRAIN__RELAY_HOOK)"
        if settings.readiness:
            hook += f"; on a VM whose relay has no such hook, {ready}"
        steps.append(hook)
    elif relay == "readiness":
        steps.append(f"no drain step of yours configured: {ready}")
    if not steps:
        return (
            "no drain step configured (DRAIN__HTTP_URL, DRAIN__RELAY_HOOK; DRAIN__READINESS="
            f"false): {NO_DRAIN}: a Platform event or a scale-in is held until NotBefore, a "
            "User Reboot or Redeploy approved at once"
        )
    probe_only = relay == "readiness" or (settings.readiness and not settings.http_url)
    tail = f"; {none}" if probe_only else ""
    return f"{' then '.join(steps)}, then approve{tail}"


def _wait_words(settings: DrainSettings) -> str:
    if settings.readiness_seconds is not None:
        return "DRAIN__READINESS_SECONDS"
    return (
        f"probe {settings.probe_interval_seconds:g} s x {settings.probe_threshold} "
        f"(DRAIN__PROBE_INTERVAL_SECONDS, DRAIN__PROBE_THRESHOLD) + "
        f"{settings.connection_seconds:g} s for established connections "
        "(DRAIN__CONNECTION_SECONDS)"
    )


def lacks_hook(record: StepRecord) -> bool:
    """The relay answered that it has no hook of that name (404 "unknown hook"): nothing
    ran there, and the VM is drained through its readiness probe instead."""
    return record.status == "failed" and record.detail.startswith(NO_SUCH_HOOK)


def reached(record: StepRecord | None) -> bool:
    """Whether a drain step may have had an effect, so an undrain has it to undo: its row
    says so (`reached`), or, for a row without that field, it got further than the two
    failures that never call anything. A step still running (its runner lost) may have."""
    if record is None or lacks_hook(record):
        return False  # a relay without that hook ran nothing (rows before issue 47 say so)
    if record.reached is not None:
        return record.reached
    return not record.detail.startswith(NEVER_STARTED)


@dataclass(frozen=True)
class UndoPlan:
    """The drain steps an undrain undoes: the HTTP drain hook, the VMs whose relay drain
    hook may have run (`hooks`), and the VMs taken out through their probe (`ready`)."""

    http: bool = False
    hooks: tuple[str, ...] = ()
    ready: tuple[str, ...] = ()

    @property
    def empty(self) -> bool:
        return not (self.http or self.hooks or self.ready)


def steps_to_undo(rows: Mapping[str, StepRecord]) -> UndoPlan:
    """Exactly the drain steps that may have acted, from the event's step rows (the
    drains table's partition: `http`, `hook:<vm>`, and the rest, which undo nothing). A
    step that never reached its receiver (no relay known, no time left, no connection, a
    relay's refusal) is nothing to undo, so no undrain and no `undrain_failed` for it. The
    HTTP hook counts as reached once it had the request, whatever it answered."""

    def vms(prefix: str) -> tuple[str, ...]:
        return tuple(
            sorted(
                name.removeprefix(prefix)
                for name, record in rows.items()
                if name.startswith(prefix) and reached(record)
            )
        )

    return UndoPlan(http=reached(rows.get(HTTP_STEP)), hooks=vms(HOOK_STEP), ready=vms(READY_STEP))
