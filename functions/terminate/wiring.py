"""The drain workflow's context over the app's pipeline: one place that wires the drain to
the state (the event row and its reporter rows, for whose own view decided drain), the
approver, the relays, the capacity guard and the audit. Used by the Azure handler
(functions.triggers.terminate), the local demo and the tests, so all of them drain only
what the deployed app drains.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from functions.approvers.relay import RelayTarget
from functions.model.drains import RelayFacts
from functions.model.event import Transition
from functions.model.policy import transition_pages
from functions.pipeline.approval_record import ApprovalResult
from functions.pipeline.approve import ANNOUNCING, approve_event
from functions.pipeline.capacity import take_capacity
from functions.pipeline.context import Pipeline
from functions.pipeline.reconcile import reconcile_key
from functions.store.drains import DrainStore
from functions.terminate.context import DrainContext
from functions.terminate.settings import DrainSettings, UndrainSettings
from functions.terminate.targets import DrainTargets, drain_targets
from functions.terminate.undrain import run_undrain

BY = "drain"  # who approvals and undrain audit rows say asked


def pipeline_context(
    pipeline: Pipeline,
    drains: DrainStore,
    webhook_secret: bytes | tuple[bytes, ...] | None = None,
) -> DrainContext:
    store, settings = pipeline.store, pipeline.settings

    def approve(
        event_id: str, give_up_at: datetime, relays: tuple[str, ...] | None
    ) -> ApprovalResult:
        # Tagged: the drain step's next runner (its lease lapsed: this one died) takes the
        # approval's claim over at once; the step's lease keeps two runners apart.
        tag = f"drain:{event_id}"[:300]
        for _ in range(2):
            result = approve_event(
                event_id, pipeline, give_up_at=give_up_at, by=BY, relays=relays, tag=tag
            )
            if result.outcome != "skipped" or result.detail != ANNOUNCING:
                break
            # Its `decided` is not out (issue 46): the one decider publishes what is due
            # (one nobody claimed, or a dead holder's once its claim lapsed), then this
            # asks again; a live holder's is left to it, and the step asks again later.
            reconcile_key(pipeline, event_id, tag, worker=False)
        return result

    def relay_target(vm: str) -> RelayTarget | None:
        record = store.get_vm(vm)
        return pipeline.relay_target(record) if record else None

    def scale_set_of(vm: str) -> str | None:
        record = store.get_vm(vm)
        return None if record is None else record.scale_set or ""

    def relay_facts(vm: str) -> RelayFacts | None:
        # The VM row, then its verified liveness hint: an identities read and a point read
        # or two of the liveness table (functions.store.liveness.Liveness.get).
        record = store.get_vm(vm)
        verify = pipeline.liveness_verifier
        if record is None or not record.vm_id or verify is None:
            return None
        return RelayFacts.of(store.liveness.get(record.vm_id, verify, lambda _: None))

    def own_drains(event_id: str, ended: bool) -> DrainTargets:
        # A point read and one partition query per call, whatever the number of VMs.
        return drain_targets(store.get_event(event_id), store.reporter_rows(event_id), ended=ended)

    def pages(transition: Transition) -> bool:
        return transition_pages(settings.policy.policy, transition)

    def capacity(event_id: str) -> bool:
        return take_capacity(store, event_id, pipeline.policy, pipeline.clock.now())

    def audit(event_id: str, outcome: str, detail: str) -> None:
        record = store.get_event(event_id)
        decision = record.decision if record else None
        # Once per outcome (Insert Or Replace): an insert whose answer was lost is
        # written again by the retry, as one row.
        store.audit(
            event_id,
            once=f"undrain:{outcome}",
            anchor=record.decided_at if record else None,
            rank=4,
            at=pipeline.clock.now(),
            rule=decision.rule if decision else "",
            action="undrain",
            outcome=outcome,
            detail=detail,
            by=BY,
        )

    return DrainContext(
        store=drains,
        session=pipeline.session,
        publish=pipeline.publisher.publish,
        approve=approve,
        relay_target=relay_target,
        own_drains=own_drains,
        clock=pipeline.clock,
        webhook_secret=webhook_secret,
        pages=pages,
        audit=audit,
        capacity=capacity,
        scale_set_of=scale_set_of,
        relay_facts=relay_facts,
    )


def row_drainer(
    pipeline: Pipeline,
    context: Callable[[], DrainContext],
    drain_settings: Callable[[], DrainSettings],
    undrain_settings: Callable[[], UndrainSettings],
) -> Callable[[str, object], str]:
    """The drain workflow for an event row, as the one decider asks for it
    (functions.pipeline.reconcile): "drain" runs run_drain on the event's `decided`
    notification rebuilt from the row, "undrain" runs run_undrain on its end's; both are
    run-once per step (functions.store.drains), so running them again after the
    `terminate` subscription did, or a crash, repeats nothing. Returns the outcome."""

    def drain(what: str, row: object) -> str:
        from functions.pipeline.announce import build
        from functions.store.records import EventRecord
        from functions.terminate.workflow import run_drain

        assert isinstance(row, EventRecord)
        now = pipeline.clock.now()
        policy, settings = pipeline.policy, pipeline.settings
        if what == "undrain":
            end = Transition.COMPLETED if row.ended == "completed" else Transition.CANCELLED
            note = build(row, end, now, policy, settings)
            hook = drain_settings().relay_hook
            return run_undrain(note, undrain_settings(), context(), drain_hook=hook).outcome
        note = build(row, Transition.DECIDED, now, policy, settings)
        return run_drain(note, drain_settings(), context()).outcome

    return drain
