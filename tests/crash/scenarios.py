"""The scenarios of issue 31, each a script of calls of the app's public entry points.

Each VM has its own name per scenario (the test identity registry is keyed by name), and
every message is built once per scenario, so all runs of a scenario deliver the same
bytes. Times are the FakeClock's: T0 is 10:00 UTC; a message is observed when the clock
reaches it (`at`), and the clock is moved there first.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from functions.model.policy import Match, Policy, Rule, Window
from tests.agentless.grid import grid_event
from tests.crash.runner import (
    WATCHDOG_PERIOD_SECONDS,
    Step,
    advance,
    dead_letter,
    deliver,
    drain,
    event_grid,
    heartbeat,
    manual,
    notify,
    settle,
    watchdog,
)
from tests.crash.world import Config, Servers
from tests.functions.conftest import T0, envelope, event

# The end of every scenario: a sweep after the approval claims' staleness (budget + 60 s)
# has passed, and one after every lease (drain steps lease at most until their deadline)
# and NotBefore: whatever was left due must be done, or announced overdue, by then.
FINAL = (120.0, 1200.0)


@dataclass(frozen=True)
class Scenario:
    name: str
    title: str
    build: Callable[[Servers], tuple[Config, list[Step]]]
    # What the fault-free run must show (substrings of its effects): a scenario that does
    # not do what it says would compare nothing.
    expects: tuple[str, ...] = ()
    arm: bool = False  # needs Resource Manager (Servers.arm)
    twice: bool = False  # every crash point also kills the host that takes over (faults)


def _at(seconds: float) -> Any:
    return T0 + timedelta(seconds=seconds)


def doc(
    vm: str,
    seq: int,
    events: list[dict[str, Any]],
    servers: Servers,
    at: float,
    **where: Any,
) -> Step:
    """VM `vm`'s relay sends its `seq`-th message, observed `at` seconds after T0."""
    body = envelope(vm, seq, events, callback_url=servers.relay.url, observed_at=_at(at), **where)
    return deliver(body, f"{vm}#{seq}")


def until(now: float, at: float) -> list[Step]:
    """Time passes from `now` to `at` (seconds after T0) with the watchdog's timer ticking
    every minute, as in Azure; whatever a tick announces is drained."""
    steps: list[Step] = []
    while now + WATCHDOG_PERIOD_SECONDS <= at:
        steps += [advance(WATCHDOG_PERIOD_SECONDS), watchdog(), drain()]
        now += WATCHDOG_PERIOD_SECONDS
    if at > now:
        steps.append(advance(at - now))
    return steps


def approve_rule(*types: str) -> Rule:
    return Rule(
        name="approve-" + "-".join(types).lower(), match=Match(event_types=types), action="approve"
    )


def drain_rule(*types: str) -> Rule:
    return Rule(
        name="drain-" + "-".join(types).lower(), match=Match(event_types=types), action="drain"
    )


def approve_reboot(servers: Servers) -> tuple[Config, list[Step]]:
    """A Reboot of one VM, approved by policy through its relay, then started and done."""
    ev = event("EV-AP", "Reboot", resources=("ap1",), not_before=_at(900))
    started = {**ev, "EventStatus": "Started", "NotBefore": ""}
    steps = [
        doc("ap1", 1, [ev], servers, 0),
        drain(),
        *until(0, 120),
        doc("ap1", 2, [started], servers, 120),
        *until(120, 180),
        doc("ap1", 3, [], servers, 180),
        drain(),
        *settle(*FINAL),
    ]
    return Config(policy=Policy(rules=(approve_rule("Reboot"),))), steps


def manual_approval(servers: Servers) -> tuple[Config, list[Step]]:
    """A Reboot the policy holds, approved by a person on the pages a minute later (the
    request recorded, carried out by the decider), then started and done."""
    ev = event("EV-MA", "Reboot", resources=("ma1",), not_before=_at(900))
    started = {**ev, "EventStatus": "Started", "NotBefore": ""}
    steps = [
        doc("ma1", 1, [ev], servers, 0),
        drain(),
        *until(0, 60),
        manual("EV-MA", "alice"),
        drain(),
        *until(60, 120),
        doc("ma1", 2, [started], servers, 120),
        *until(120, 180),
        doc("ma1", 3, [], servers, 180),
        drain(),
        *settle(*FINAL),
    ]
    hold = Rule(name="hold-reboot", match=Match(event_types=("Reboot",)), action="hold")
    return Config(policy=Policy(rules=(hold,))), steps


def hold_then_window(servers: Servers) -> tuple[Config, list[Step]]:
    """A Reboot held until the maintenance window opens at 10:02, then approved by the
    watchdog's sweep in the window, then started and done."""
    policy = Policy(
        rules=(approve_rule("Reboot"),),
        windows=(Window(days=("Sat",), start="10:02", end="12:00"),),
    )
    ev = event("EV-HW", "Reboot", resources=("hw1",), not_before=_at(1200))
    started = {**ev, "EventStatus": "Started", "NotBefore": ""}
    steps = [
        doc("hw1", 1, [ev], servers, 0),
        drain(),
        *until(0, 240),
        doc("hw1", 2, [started], servers, 240),
        *until(240, 300),
        doc("hw1", 3, [], servers, 300),
        *settle(*FINAL),
    ]
    return Config(policy=policy), steps


def shared_freeze(servers: Servers) -> tuple[Config, list[Step]]:
    """A short Freeze of an availability set, reported by its 3 VMs (the default policy
    approves it; the capacity guard holds one slot for the set), then gone from each."""
    names = ("as1", "as2", "as3")
    ev = event("EV-AS", "Freeze", resources=names, not_before=_at(900), duration=5)
    steps: list[Step] = []
    for index, vm in enumerate(names):
        steps.append(doc(vm, 1, [ev], servers, index, availability_set="avset"))
    steps += [drain(), *until(0, 120)]
    for index, vm in enumerate(names):
        steps.append(doc(vm, 2, [], servers, 120 + index, availability_set="avset"))
    steps += [drain(), *settle(*FINAL)]
    return Config(), steps


def drain_terminate(servers: Servers) -> tuple[Config, list[Step]]:
    """A scale-in Terminate of a scale-set VM: drained by the customer's HTTP drain hook,
    then approved through its relay (the default policy's terminate-drain), then gone."""
    ev = event("EV-TD", "Terminate", resources=("ss_0",), not_before=_at(600), source="User")
    steps = [
        doc("ss_0", 1, [ev], servers, 0, scale_set="ss"),
        drain(),
        *until(0, 120),
        doc("ss_0", 2, [], servers, 120, scale_set="ss"),
        drain(),
        *settle(*FINAL),
    ]
    return Config(), steps


def drain_reboot(servers: Servers) -> tuple[Config, list[Step]]:
    """A Reboot a rule drains: the capacity slot of its availability set, the HTTP drain
    hook, the approval through its relay; once it completed, the undrain hook."""
    ev = event("EV-DR", "Reboot", resources=("dr1",), not_before=_at(900))
    started = {**ev, "EventStatus": "Started", "NotBefore": ""}
    steps = [
        doc("dr1", 1, [ev], servers, 0, availability_set="drset"),
        drain(),
        *until(0, 120),
        doc("dr1", 2, [started], servers, 120, availability_set="drset"),
        *until(120, 180),
        doc("dr1", 3, [], servers, 180, availability_set="drset"),
        drain(),
        *settle(*FINAL),
    ]
    return Config(policy=Policy(rules=(drain_rule("Reboot"),))), steps


def capacity(servers: Servers) -> tuple[Config, list[Step]]:
    """Two Reboots in an availability set limited to one at a time: the first is approved
    and holds the slot; the second waits, and is approved once the first has ended."""
    one = event("EV-C1", "Reboot", resources=("cap1",), not_before=_at(900))
    two = event("EV-C2", "Reboot", resources=("cap2",), not_before=_at(1500))
    started = {**one, "EventStatus": "Started", "NotBefore": ""}
    where = {"availability_set": "capset"}
    steps = [
        doc("cap1", 1, [one], servers, 0, **where),
        doc("cap2", 1, [two], servers, 1, **where),
        drain(),
        *until(0, 120),
        doc("cap1", 2, [started], servers, 120, **where),
        *until(120, 180),
        doc("cap1", 3, [], servers, 180, **where),
        *until(180, 300),
        doc("cap2", 2, [], servers, 300, **where),
        drain(),
        *settle(*FINAL),
    ]
    return Config(policy=Policy(rules=(approve_rule("Reboot"),))), steps


def preempt(servers: Servers) -> tuple[Config, list[Step]]:
    """A Spot VM's Preempt (30 s notice) a rule drains: the HTTP drain hook within the
    Preempt margins, the approval, then the VM is gone by NotBefore (Azure starts an
    approved event at once). Its last document comes within NOT_BEFORE_GRACE: no sweep
    in between, whose retry a minute later would come before it here (steps run in turn)
    but not in Azure, and find it overdue."""
    ev = event("EV-PE", "Preempt", resources=("spot_0",), not_before=_at(30))
    steps = [
        doc("spot_0", 1, [ev], servers, 0, scale_set="spot"),
        drain(),
        *until(0, 30),
        doc("spot_0", 2, [], servers, 30, scale_set="spot"),
        drain(),
        *settle(*FINAL),
    ]
    return Config(policy=Policy(rules=(drain_rule("Preempt"),))), steps


def cancel_undrain(servers: Servers) -> tuple[Config, list[Step]]:
    """A Terminate whose HTTP drain hook refuses (403): drain_failed, held
    (DRAIN__ON_FAILURE=hold); Azure then cancels it, and the undrain hook puts back what
    the drain reached."""
    ev = event("EV-CU", "Terminate", resources=("cu_0",), not_before=_at(600), source="User")
    steps = [
        doc("cu_0", 1, [ev], servers, 0, scale_set="cu"),
        drain(),
        *until(0, 120),
        doc("cu_0", 2, [], servers, 120, scale_set="cu"),
        drain(),
        *settle(*FINAL),
    ]
    return Config(hook_status={"/drain": 403}), steps


def channels(servers: Servers) -> tuple[Config, list[Step]]:
    """Each channel's delivery: a Redeploy (held; it pages by default) is announced
    scheduled and decided, then cancelled; Teams, PagerDuty, the webhook and Slack deliver
    each announcement with the deliveries ledger."""
    ev = event("EV-CH", "Redeploy", resources=("ch1",), not_before=_at(900))
    steps = [
        doc("ch1", 1, [ev], servers, 0),
        notify(),
        *until(0, 120),
        doc("ch1", 2, [], servers, 120),
        notify(),
        *settle(*FINAL, channels=True),
    ]
    return Config(), steps


def event_grid_arm(servers: Servers) -> tuple[Config, list[Step]]:
    """Agentless: a User Redeploy of a scale-set VM known only from Event Grid, approved
    by the ARM approver (acknowledge), then Completed."""
    from simulator import instance

    sim = servers.arm.sim
    owner = (
        f"/subscriptions/{instance.SUBSCRIPTION_ID}/resourceGroups/{instance.RESOURCE_GROUP}"
        "/providers/Microsoft.Compute/virtualMachineScaleSets/web"
    )
    props = event("EV-EG", "Redeploy", resources=("web_1",), not_before=_at(900), source="User")
    done = {**props, "EventStatus": "Completed", "NotBefore": ""}

    def reset(_servers: Servers) -> None:
        # Azure's event as it was before the run: Scheduled, not acknowledged. The simulator
        # never reuses an EventId, so the last run's event is forgotten first.
        with sim._lock:
            for key in [k for k, e in sim._events.items() if e.event_id == "EV-EG"]:
                del sim._events[key]
        sim.add_event("Redeploy", resources=["web_1"], event_id="EV-EG", source="User")

    steps = [
        event_grid(json.dumps(grid_event(props, owner=owner, grid_id="grid-1")), "grid#1"),
        drain(),
        *until(0, 120),
        event_grid(
            json.dumps(grid_event(done, owner=owner, grid_id="grid-2", at=_at(120))), "grid#2"
        ),
        drain(),
        *settle(*FINAL),
    ]
    settings = {"approvers": "relay,arm", "arm_endpoint": servers.arm.arm_url}
    return Config(settings=settings, arm=True, reset=reset), steps


def watchdog_sweep(servers: Servers) -> tuple[Config, list[Step]]:
    """One watchdog sweep with work to do: a held Reboot past its NotBefore (overdue) on a
    VM whose relay went silent (its liveness row is older than RELAY_SILENT_AFTER)."""
    ev = event("EV-WD", "Reboot", resources=("wd1",), not_before=_at(300))
    steps = [
        doc("wd1", 1, [ev], servers, 0),
        heartbeat("wd1", 0),
        advance(900),
        watchdog(),
        drain(),
    ]
    return Config(), steps


def lost_answer_started(servers: Servers) -> tuple[Config, list[Step]]:
    """Issue 37: a Reboot approved by a sweep when its window opens; a host that dies after
    the relay's IMDS took StartRequests (its answer lost) leaves the claim in progress, and
    the VM reports Started before anything takes the claim over: that approval is recorded,
    announced and audited from the row (the attempt was recorded as sent)."""
    policy = Policy(
        rules=(approve_rule("Reboot"),),
        windows=(Window(days=("Sat",), start="10:02", end="12:00"),),
    )
    ev = event("EV-LS", "Reboot", resources=("ls1",), not_before=_at(1200))
    started = {**ev, "EventStatus": "Started", "NotBefore": ""}
    steps = [
        doc("ls1", 1, [ev], servers, 0),
        drain(),
        *until(0, 120),
        doc("ls1", 2, [started], servers, 121),
        *until(121, 300),
        doc("ls1", 3, [], servers, 300),
        *settle(*FINAL),
    ]
    return Config(policy=policy), steps


def grid_completed_in_flight(servers: Servers) -> tuple[Config, list[Step]]:
    """Issue 37: a relay-reported Redeploy that Event Grid also describes: the approval
    through the relay, and Azure's Completed while a host that died holds the claim."""
    from simulator import instance

    owner = (
        f"/subscriptions/{instance.SUBSCRIPTION_ID}/resourceGroups/{instance.RESOURCE_GROUP}"
        "/providers/Microsoft.Compute/virtualMachineScaleSets/gc"
    )
    ev = event("EV-GC", "Redeploy", resources=("gc_0",), not_before=_at(900), source="User")
    done = {**ev, "EventStatus": "Completed", "NotBefore": ""}
    steps = [
        doc("gc_0", 1, [ev], servers, 0, scale_set="gc"),
        event_grid(json.dumps(grid_event(done, owner=owner, grid_id="gc-2", at=_at(30))), "grid"),
        drain(),
        *until(0, 120),
        doc("gc_0", 2, [], servers, 120, scale_set="gc"),
        *settle(*FINAL),
    ]
    return Config(settings={"approvers": "relay"}), steps


def decided_lost(servers: Servers) -> tuple[Config, list[Step]]:
    """Issue 37: a Reboot a rule drains, whose `decided` notification is dead-lettered on
    the drain's subscription: the drain is due from the row, and the sweep's reconcile runs
    it (drain hook, approval through the relay); then the undrain once it completed."""
    ev = event("EV-DL", "Reboot", resources=("dl1",), not_before=_at(900))
    started = {**ev, "EventStatus": "Started", "NotBefore": ""}
    steps = [
        doc("dl1", 1, [ev], servers, 0, availability_set="dlset"),
        dead_letter("terminate", "decided"),
        *until(0, 240),
        doc("dl1", 2, [started], servers, 240, availability_set="dlset"),
        *until(240, 300),
        doc("dl1", 3, [], servers, 300, availability_set="dlset"),
        dead_letter("terminate", "completed"),
        *settle(*FINAL),
    ]
    return Config(policy=Policy(rules=(drain_rule("Reboot"),))), steps


def budget(servers: Servers) -> tuple[Config, list[Step]]:
    """Issue 39: a checkout service of two VMs in different scale sets, one disruption
    budget over its `service` tag allowing one out at a time: the first Reboot approved,
    the second waits (named in the budget's row), and is approved once the first ends.
    Issue 45: bu1's relay takes StartRequests but its answer never comes (the slow relay
    of a busy machine): its slot is kept while the outcome is unknown, its Started settles
    the approval, and bu2 goes only once bu1 is back (the `budget` invariant)."""
    from functions.model.budgets import Budget, Placement
    from functions.store.placements import Placements

    def seed(store: Any) -> None:
        rows = [
            Placement(
                name=vm,
                vm_id=f"vmid-{vm}",
                zone=zone,
                scale_set=f"ss{zone}",
                tags={"service": "checkout"},
                fetched_at=_at(0),
            )
            for vm, zone in (("bu1", "1"), ("bu2", "2"))
        ]
        Placements(store.service.get_table_client(f"{store.prefix}identities")).put(rows)

    one = event("EV-B1", "Reboot", resources=("bu1",), not_before=_at(900))
    two = event("EV-B2", "Reboot", resources=("bu2",), not_before=_at(1500))
    started = {**one, "EventStatus": "Started", "NotBefore": ""}
    steps = [
        doc("bu1", 1, [one], servers, 0),
        doc("bu2", 1, [two], servers, 1),
        drain(),
        *until(0, 120),
        doc("bu1", 2, [started], servers, 120),
        *until(120, 180),
        doc("bu1", 3, [], servers, 180),
        *until(180, 300),
        doc("bu2", 2, [], servers, 300),
        drain(),
        *settle(*FINAL),
    ]
    policy = Policy(
        rules=(approve_rule("Reboot"),),
        budgets=(Budget(name="checkout", group_by=("tag:service",), max_unavailable=1),),
    )

    def slow_relay(servers: Servers) -> None:
        servers.relay.drop = {"EV-B1"}

    config = Config(policy=policy, seed=seed, reset=slow_relay, budget_events=("EV-B1", "EV-B2"))
    return config, steps


def set_mate_started(servers: Servers) -> tuple[Config, list[Step]]:
    """Issue 46: a set-mate reports the victim's User Redeploy first, as Started, naming
    itself too; the victim's own view says Scheduled. Its approval goes ahead (a VM's
    Started decides only for itself), then Azure starts it and it ends."""
    names = ("smv1", "smm1")
    ev = event("EV-SM", "Redeploy", resources=names, not_before=_at(900), source="User")
    started = {**ev, "EventStatus": "Started", "NotBefore": ""}
    steps = [
        doc("smm1", 1, [started], servers, 0, availability_set="smset"),
        doc("smv1", 1, [ev], servers, 1, availability_set="smset"),
        drain(),
        *until(1, 120),
        doc("smv1", 2, [started], servers, 120, availability_set="smset"),
        *until(120, 180),
        doc("smv1", 3, [], servers, 180, availability_set="smset"),
        doc("smm1", 2, [], servers, 181, availability_set="smset"),
        drain(),
        *settle(*FINAL),
    ]
    return Config(policy=Policy(rules=(approve_rule("Redeploy"),))), steps


def set_mate_text(servers: Servers) -> tuple[Config, list[Step]]:
    """Issue 46: a set-mate reports the victim's Redeploy first as a 30 s Freeze with its
    own words; the views differ, the decision is announced again showing the conflict, and
    a person approves it by hand; then it starts and ends."""
    names = ("stv1", "stm1")
    ev = event("EV-ST", "Redeploy", resources=names, not_before=_at(900), duration=3600)
    lure = {
        **event("EV-ST", "Freeze", resources=names, not_before=_at(900), duration=30),
        "Description": "Live migration pause 30 s",
    }
    started = {**ev, "EventStatus": "Started", "NotBefore": ""}
    steps = [
        doc("stm1", 1, [lure], servers, 0, availability_set="stset"),
        doc("stv1", 1, [ev], servers, 1, availability_set="stset"),
        drain(),
        *until(1, 60),
        manual("EV-ST", "alice"),
        drain(),
        *until(60, 120),
        doc("stv1", 2, [started], servers, 120, availability_set="stset"),
        doc("stm1", 2, [started], servers, 121, availability_set="stset"),
        *until(121, 180),
        doc("stv1", 3, [], servers, 180, availability_set="stset"),
        doc("stm1", 3, [], servers, 181, availability_set="stset"),
        drain(),
        *settle(*FINAL),
    ]
    hold = Rule(name="hold-all", action="hold")
    return Config(policy=Policy(rules=(hold,))), steps


SCENARIOS: list[Scenario] = [
    Scenario(
        "approve",
        "new Reboot, one VM, approve policy",
        approve_reboot,
        ("relay ap1 /v1/start EV-AP", "EV-AP:approved", "EV-AP:completed"),
    ),
    Scenario(
        "hold-window",
        "Reboot held, then approved in a window",
        hold_then_window,
        ("relay hw1 /v1/start EV-HW", "EV-HW:approved", "EV-HW:completed"),
    ),
    Scenario(
        "shared",
        "shared Freeze, 3 VMs of an availability set",
        shared_freeze,
        ("/v1/start EV-AS", "EV-AS:approved", "EV-AS:completed"),
    ),
    Scenario(
        "drain-terminate",
        "Terminate drained by an HTTP hook, then approved",
        drain_terminate,
        ("drain-hook /drain EV-TD drain", "relay ss_0 /v1/start EV-TD", "EV-TD:drain_started"),
    ),
    Scenario(
        "drain-reboot",
        "Reboot drained (capacity, HTTP hook), approved, undrained",
        drain_reboot,
        ("/drain EV-DR drain", "relay dr1 /v1/start EV-DR", "/undrain EV-DR", "EV-DR:undrained"),
    ),
    Scenario(
        "capacity",
        "two Reboots in a set limited to one at a time",
        capacity,
        ("relay cap1 /v1/start EV-C1", "relay cap2 /v1/start EV-C2", "EV-C2:approved"),
    ),
    Scenario(
        "preempt",
        "Preempt drained within its 30 s notice, approved",
        preempt,
        ("/drain EV-PE drain", "relay spot_0 /v1/start EV-PE", "EV-PE:approved"),
    ),
    Scenario(
        "cancel-undrain",
        "Terminate drain refused, held, cancelled, undrained",
        cancel_undrain,
        ("/drain EV-CU drain", "/undrain EV-CU", "EV-CU:drain_failed", "EV-CU:undrained"),
    ),
    Scenario(
        "event-grid-arm",
        "Event Grid only, approved by the ARM approver",
        event_grid_arm,
        ("arm acknowledge EV-EG 200", "EV-EG:approved", "EV-EG:completed"),
        arm=True,
    ),
    Scenario(
        "channels",
        "Teams, PagerDuty, webhook and Slack delivery of 3 announcements",
        channels,
        (
            "teams event:EV-CH:decided",
            "slack event:EV-CH:decided",
            "event:EV-CH:decided trigger event:EV-CH",
            "event:EV-CH:cancelled resolve",
            "event:EV-CH:scheduled event:EV-CH:scheduled",
        ),
    ),
    Scenario(
        "watchdog",
        "one sweep: a silent relay and an overdue event",
        watchdog_sweep,
        ("relay_silent", "EV-WD:completed"),
    ),
    Scenario(
        "manual",
        "a held Reboot approved by a person on the pages",
        manual_approval,
        ("relay ma1 /v1/start EV-MA", "EV-MA:approved", "EV-MA:completed"),
    ),
    Scenario(
        "lost-answer-started",
        "approval's answer lost, the VM reports Started before any takeover",
        lost_answer_started,
        ("relay ls1 /v1/start EV-LS", "EV-LS:approved", "EV-LS:completed"),
    ),
    Scenario(
        "grid-completed-in-flight",
        "Event Grid's Completed while an approval is in flight",
        grid_completed_in_flight,
        ("relay gc_0 /v1/start EV-GC", "EV-GC:approved", "EV-GC:completed"),
    ),
    Scenario(
        "decided-lost",
        "a drain's `decided` dead-lettered: drained from the row, undrained",
        decided_lost,
        ("/drain EV-DL drain", "relay dl1 /v1/start EV-DL", "/undrain EV-DL", "EV-DL:undrained"),
    ),
    Scenario(
        "budget",
        "a disruption budget over a service tag: the second VM waits for the first, whose "
        "relay's answer never comes",
        budget,
        (
            "relay bu1 /v1/start EV-B1",
            "relay bu2 /v1/start EV-B2",
            "EV-B1:approved",
            "EV-B2:approved",
        ),
    ),
    Scenario(
        "set-mate-started",
        "a set-mate reports the victim's Redeploy Started first",
        set_mate_started,
        ("/v1/start EV-SM", "EV-SM:approved", "EV-SM:completed"),
    ),
    Scenario(
        "set-mate-text",
        "a set-mate describes the victim's Redeploy as a Freeze; a person approves",
        set_mate_text,
        ("/v1/start EV-ST", "EV-ST:decided", "EV-ST:approved", "EV-ST:completed"),
    ),
    Scenario(
        "approve-twice",
        "new Reboot approved; the host that takes over dies too",
        approve_reboot,
        ("relay ap1 /v1/start EV-AP", "EV-AP:approved", "EV-AP:completed"),
        twice=True,
    ),
    Scenario(
        "drain-twice",
        "Reboot drained and undrained; the host that takes over dies too",
        drain_reboot,
        ("/drain EV-DR drain", "relay dr1 /v1/start EV-DR", "/undrain EV-DR", "EV-DR:undrained"),
        twice=True,
    ),
]
