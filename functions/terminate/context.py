"""What every drain step shares: the context (store, session, publisher, approver, relay
lookup, clock), the result, run-once bookkeeping of steps in the drains table, and the two
actions the drain and the undrain both use (an announcement, a relay hook call).
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Literal

import requests

from functions.approvers.relay import RelayTarget
from functions.clock import Clock, SystemClock
from functions.model.drains import RelayFacts
from functions.model.event import Notification, Transition
from functions.store.drains import DrainStore, StepRecord
from functions.terminate.steps import StepResult, relay_hook
from functions.terminate.targets import DrainTargets

log = logging.getLogger("functions.terminate.workflow")

WAIT_POLL_SECONDS = 1.0  # how often a second invocation re-reads a step another one runs
ANNOUNCE_LEASE_SECONDS = 60.0  # announcements go out even after the deadline
MAX_PARALLEL_HOOKS = 16

Outcome = Literal["approved", "held", "approval_failed", "skipped", "undrained", "undrain_failed"]
# A step's action: given the time it must end by, (ok, detail) or a StepResult (with
# `reached`, what an undrain reads).
Action = Callable[[datetime], tuple[bool, str] | StepResult]


# approve(event_id, give_up_at, relays) → "approved" | "failed" | "skipped" | ..., or an
# object with `.outcome` and `.detail` (functions.pipeline.approval_record.ApprovalResult).
# `relays`: the only VMs whose relays may be asked (the VMs the drain drained), or None.
Approve = Callable[[str, datetime, tuple[str, ...] | None], Any]
Publish = Callable[[Notification], None]
# VM name → its relay as the app knows it (Azure's address, its attested key), or None.
Targets = Callable[[str], RelayTarget | None]
# own_drains(event_id, ended) → the named VMs whose own view decided drain
# (functions.terminate.targets.drain_targets on the event row and its reporter rows).
OwnDrains = Callable[[str, bool], DrainTargets]


@dataclass
class DrainContext:
    store: DrainStore
    session: requests.Session
    publish: Publish
    approve: Approve
    relay_target: Targets
    # Who may be drained: only VMs whose own view decided drain (issue 27). No default:
    # draining every name in Resources lets one VM's forged view drain its set-mates.
    own_drains: OwnDrains
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
    # scale_set_of(vm): Azure's scale set of a VM for the HTTP drain request (the VM row;
    # functions.terminate.steps.ScaleSetOf); None: labelled by name only.
    scale_set_of: Callable[[str], str | None] | None = None
    # relay_facts(vm): what its relay's verified heartbeat says (contract, last load-balancer
    # probe, drain means: functions.model.drains.RelayFacts), which decides the drain it
    # really has; None, or None for a VM: no heartbeat known, so no readiness drain there.
    relay_facts: Callable[[str], RelayFacts | None] | None = None


@dataclass
class DrainResult:
    event_id: str
    outcome: Outcome
    drained: bool = False
    detail: str = ""
    steps: dict[str, StepRecord] = field(default_factory=dict)
    # Named VMs left out of service changes, each with why (their own view did not
    # decide drain, or their relay never reported the event).
    not_drained: dict[str, str] = field(default_factory=dict)


# A running step is its runner's for LEASE past its last renewal; the runner renews it
# every RENEW_EVERY while the step runs (a hook may take minutes). A runner that died is
# taken over within LEASE, and the step runs again: every step is safe to repeat (the
# relay runs a hook once per event and answers a repeat from memory, the HTTP drain hook
# carries one webhook-id per step, announcements one MessageId, the approval one claim).
LEASE = timedelta(seconds=10)
RENEW_EVERY = 3.0  # seconds of real time between renewals


class Steps:
    """Run-once bookkeeping for one event's workflow."""

    def __init__(self, event_id: str, ctx: DrainContext) -> None:
        self.event_id = event_id
        self.ctx = ctx
        self.records: dict[str, StepRecord] = {}

    def once(
        self,
        step: str,
        until: datetime,
        action: Action,
    ) -> StepRecord:
        """Run `action(until)` unless this step already ran (or runs) elsewhere.

        A running step whose lease lapsed lost its runner: it is taken over and run again
        while its time allows, never marked failed without having run (issue 31). Only a
        step whose time is up is marked failed, saying so.
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
                        reached=False,
                    )
                    if store.claim(self.event_id, record):
                        return self._keep(record)
                    continue
                record = StepRecord(
                    step=step,
                    status="running",
                    owner=ctx.owner,
                    started_at=now,
                    lease_until=now + LEASE,
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
            if until > now:
                taken = store.take_over(self.event_id, current, ctx.owner, now, now + LEASE)
                if taken is not None:
                    log.warning("drain %s: taking over %s from a lost runner", self.event_id, step)
                    return self._run(taken, until, action)
                continue
            lost = current.model_copy(
                update={
                    "status": "failed",
                    "finished_at": now,
                    "detail": "its runner stopped, and no time was left to run it again",
                }
            )
            if store.replace(self.event_id, lost):
                return self._keep(lost)

    def _run(self, record: StepRecord, until: datetime, action: Action) -> StepRecord:
        lease = _Renewal(self.ctx, self.event_id, record)
        try:
            result = StepResult(*action(until))
        except requests.RequestException as exc:  # a step's own HTTP trouble is its failure
            result = StepResult(False, f"{type(exc).__name__}")
        finally:
            held = lease.stop()
        done = held.model_copy(
            update={
                "status": "succeeded" if result.ok else "failed",
                "finished_at": self.ctx.clock.now(),
                "detail": result.detail[:1000],
                "reached": result.reached,
            }
        )
        if not self.ctx.store.replace(self.event_id, done):
            # Someone took it over meanwhile (this runner stalled past its lease); what is
            # stored is the truth.
            stored = self.ctx.store.get(self.event_id, record.step)
            return self._keep(stored or done)
        log.info("drain %s: %s %s: %s", self.event_id, record.step, done.status, done.detail)
        return self._keep(done)

    def _keep(self, record: StepRecord) -> StepRecord:
        self.records[record.step] = record
        return record


class _Renewal:
    """Keeps a running step's lease fresh from a background thread until `stop`."""

    def __init__(self, ctx: DrainContext, event_id: str, record: StepRecord) -> None:
        self.ctx, self.event_id, self.record = ctx, event_id, record
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="drain-lease")
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(RENEW_EVERY):
            with self._lock:
                if self._stop.is_set():
                    return
                fresh = self.record.model_copy(update={"lease_until": self.ctx.clock.now() + LEASE})
                try:
                    if not self.ctx.store.replace(self.event_id, fresh):
                        return  # taken over: the new runner's row is the truth
                except Exception:
                    log.warning("drain %s: lease renewal failed", self.event_id, exc_info=True)
                    continue
                self.record = fresh

    def stop(self) -> StepRecord:
        with self._lock:
            self._stop.set()
            return self.record


def announcer(ctx: DrainContext, note: Notification, transition: Transition, detail: str) -> Action:
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


def hook_action(
    ctx: DrainContext,
    hook: str,
    vm: str,
    target: RelayTarget | None,
    event_id: str,
    poll_seconds: float,
    undoes: str | None = None,
    event_type: str | None = None,
    event_status: str = "Cancelled",
    run_seconds: float | None = None,
) -> Action:
    """Run `hook` on `vm`'s relay until the step's time (`until`, the drain deadline);
    `run_seconds`: how long the hook may run once the relay took it."""

    def act(until: datetime) -> StepResult:
        if target is None:
            why = f"no relay known for {vm} (no attested key or no address from Azure)"
            return StepResult(False, why, False)
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
            event_status,
            run_seconds,
        )

    return act
