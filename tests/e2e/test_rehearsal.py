"""A rehearsal with your own valid policy judges only what that policy allows (issue 38):
`POLICY__RULES='[{"name":"hold-all","action":"hold"}]' make demo` ended `3 NOT met` on
2cd3d60 ("announced as approved via arm" twice, the readiness probe of the VM only the
demo's policy drains), and make exited non-zero."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

from functions.model.envelope import ScheduledEvent
from functions.model.event import Decision, EventSnapshot, Notification, Transition
from functions.model.policy import Policy, PolicyLoad, Rule, decide, default_rules, sample_rules
from local.demo_ready import ready_outcomes
from local.outcomes import _pipeline_outcomes, judged_under_your_policy
from local.plan import FLEET, Step, demo_policy
from local.watcher import EventTrack

NOW = datetime.now(UTC)
HOLD_ALL = Policy(rules=(Rule(name="hold-all", action="hold"),))


def _event(
    event_id: str, event_type: str, source: str, vm: str
) -> tuple[EventTrack, EventSnapshot]:
    track = EventTrack(
        event_id=event_id,
        event_type=event_type,
        source=source,
        duration=-1,
        resources=(vm,),
        description=None,
        first_seen=0.0,
        first_seen_wall=NOW,
        first_status="Scheduled",
        not_before=NOW + timedelta(minutes=10),
    )
    snapshot = EventSnapshot(
        event_id=event_id,
        event_type=event_type,
        event_status="Scheduled",
        event_source=source,
        resources=(vm,),
        not_before=NOW + timedelta(minutes=10),
    )
    return track, snapshot


def _demo(policy: Policy, snapshot: EventSnapshot, decision: Decision, **extra) -> SimpleNamespace:
    note = Notification(
        transition=Transition.DECIDED, occurred_at=NOW, event=snapshot, decision=decision
    )
    return SimpleNamespace(
        publisher=SimpleNamespace(published=[note]),
        watcher=SimpleNamespace(approvals=[]),
        missing={},
        options=SimpleNamespace(fleet=FLEET),
        custom_policy=True,
        settings=SimpleNamespace(policy=PolicyLoad(policy=policy)),
        **extra,
    )


def test_an_event_your_policy_holds_is_not_judged_by_what_the_demo_expected():
    """The agentless redeploy the demo's policy approves through Resource Manager: held by
    your policy, 'approved through Resource Manager' and 'announced as approved via arm'
    are shown, not judged (the old filter judged the second: 'announced' was in its name)."""
    track, snapshot = _event("EV-ARM", "Redeploy", "User", "legacy-1")
    step = Step(at=0, scenario="user-redeploy", target="legacy-1", approved_via="arm")
    held = Decision(action="hold", rule="hold-all")
    demo = _demo(HOLD_ALL, snapshot, held)
    pipeline = _pipeline_outcomes(demo, "user-redeploy on legacy-1", step, track)
    assert any("announced as approved via arm" in o.name and not o.ok for o in pipeline)
    judged = judged_under_your_policy(demo, track, pipeline)
    assert [o for o in judged if not o.skipped] == []
    assert all(o.name.endswith("[demo's policy]") for o in judged)


def test_an_event_your_policy_decides_as_the_demo_would_is_judged():
    track, snapshot = _event("EV-ARM", "Redeploy", "User", "legacy-1")
    step = Step(at=0, scenario="user-redeploy", target="legacy-1", approved_via="arm")
    # Your own rules, deciding this event as the demo's reference rules do.
    yours = Policy(rules=sample_rules())
    event = ScheduledEvent.model_validate(snapshot.imds_fields())
    approved = decide(yours, event, NOW, ())
    assert approved.action == "approve"
    demo = _demo(yours, snapshot, approved)
    pipeline = _pipeline_outcomes(demo, "user-redeploy on legacy-1", step, track)
    judged = judged_under_your_policy(demo, track, pipeline)
    assert judged == pipeline and not any(o.skipped for o in judged)
    # The same decision under a dry run, other windows or capacity is not the demo's.
    dry = Policy(rules=sample_rules(), dry_run=True)
    dry_demo = _demo(dry, snapshot, approved.model_copy(update={"dry_run": True}))
    assert all(o.skipped for o in judged_under_your_policy(dry_demo, track, pipeline))


def test_what_azure_does_is_judged_under_any_policy():
    track, snapshot = _event("EV-C", "Reboot", "Platform", "workers_1")
    step = Step(at=0, scenario="cancelled", target="workers_1")
    demo = _demo(HOLD_ALL, snapshot, Decision(action="hold", rule="hold-all"))
    pipeline = _pipeline_outcomes(demo, "cancelled on workers_1", step, track)
    judged = judged_under_your_policy(demo, track, pipeline)
    kept = [o for o in judged if not o.skipped]
    assert [o.name for o in kept] == ["cancelled on workers_1: 'cancelled' announced once"]


def test_the_readiness_probe_is_judged_only_where_your_policy_drains():
    _, snapshot = _event("EV-APP", "Reboot", "Platform", "app-1")
    step = Step(at=0, scenario="platform-reboot", target="app-1", drain=True)
    probe = SimpleNamespace(vm="app-1", answers=[(0.0, 200)], stop=lambda: None)

    def outcome(policy, decision):
        demo = _demo(
            policy,
            snapshot,
            decision,
            played=[step],
            step_events={step: "EV-APP"},
            ready_probes=[probe],
        )
        (only,) = ready_outcomes(demo)
        return only

    held = outcome(HOLD_ALL, Decision(action="hold", rule="hold-all"))
    assert held.skipped and "yours: HOLD" in held.detail
    drained = outcome(demo_policy(), Decision(action="drain", rule="drain-then-approve"))
    assert not drained.skipped and not drained.ok  # judged: it never left rotation


def test_your_policy_without_the_demos_budget_is_judged_where_that_budget_covers_nothing():
    """Issue 39: the demo's budget one-per-service covers only the checkout VMs. Your
    policy with the demo's rules and no budget decides a Spot VM's reboot as the demo's
    does (judged), a checkout VM's not (its budget differs: shown, not judged)."""
    from local.outcomes import differs_from_the_demo
    from local.plan import DEMO_RULES

    yours = Policy(rules=(*DEMO_RULES, *default_rules()))
    for vm, differs in (("spot-1", False), ("checkout-z2_0", True)):
        track, snapshot = _event(f"EV-{vm}", "Reboot", "User", vm)
        event = ScheduledEvent.model_validate(snapshot.imds_fields())
        demo = _demo(yours, snapshot, decide(yours, event, NOW, ()))
        why = differs_from_the_demo(demo, track.event_id)
        assert (why is not None) == differs, (vm, why)
        if differs:
            assert "budgets differ" in why
        # With the demo's budget too, both are decided as the demo's policy decides them.
        demo = _demo(demo_policy(), snapshot, decide(demo_policy(), event, NOW, ()))
        assert differs_from_the_demo(demo, track.event_id) is None
