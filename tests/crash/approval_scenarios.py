"""Crash scenarios of approval (issue 31): an event decided and approved through its
relay, by policy, by a person on the pages or in a maintenance window, under the capacity
and disruption-budget guards, with set-mates' differing views, or with the relay's answer
lost. Listed, with what each must show, in tests/crash/scenarios.py.

Each VM has its own name per scenario (the test identity registry is keyed by name), and
every message is built once per scenario, so all runs of a scenario deliver the same
bytes. Times are the FakeClock's: T0 is 10:00 UTC; a message is observed when the clock
reaches it (`at`), and the clock is moved there first.
"""

from __future__ import annotations

from typing import Any

from functions.model.policy import Match, Policy, Rule, Window
from tests.crash.runner import Step, drain, manual, settle
from tests.crash.scenario_steps import FINAL, approve_rule, at_seconds, doc, until
from tests.crash.world import Config, Servers
from tests.functions.conftest import event


def approve_reboot(servers: Servers) -> tuple[Config, list[Step]]:
    """A Reboot of one VM, approved by policy through its relay, then started and done."""
    ev = event("EV-AP", "Reboot", resources=("ap1",), not_before=at_seconds(900))
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
    ev = event("EV-MA", "Reboot", resources=("ma1",), not_before=at_seconds(900))
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
    ev = event("EV-HW", "Reboot", resources=("hw1",), not_before=at_seconds(1200))
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
    ev = event("EV-AS", "Freeze", resources=names, not_before=at_seconds(900), duration=5)
    steps: list[Step] = []
    for index, vm in enumerate(names):
        steps.append(doc(vm, 1, [ev], servers, index, availability_set="avset"))
    steps += [drain(), *until(0, 120)]
    for index, vm in enumerate(names):
        steps.append(doc(vm, 2, [], servers, 120 + index, availability_set="avset"))
    steps += [drain(), *settle(*FINAL)]
    return Config(), steps


def capacity(servers: Servers) -> tuple[Config, list[Step]]:
    """Two Reboots in an availability set limited to one at a time: the first is approved
    and holds the slot; the second waits, and is approved once the first has ended."""
    one = event("EV-C1", "Reboot", resources=("cap1",), not_before=at_seconds(900))
    two = event("EV-C2", "Reboot", resources=("cap2",), not_before=at_seconds(1500))
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


def lost_answer_started(servers: Servers) -> tuple[Config, list[Step]]:
    """Issue 37: a Reboot approved by a sweep when its window opens; a host that dies after
    the relay's IMDS took StartRequests (its answer lost) leaves the claim in progress, and
    the VM reports Started before anything takes the claim over: that approval is recorded,
    announced and audited from the row (the attempt was recorded as sent)."""
    policy = Policy(
        rules=(approve_rule("Reboot"),),
        windows=(Window(days=("Sat",), start="10:02", end="12:00"),),
    )
    ev = event("EV-LS", "Reboot", resources=("ls1",), not_before=at_seconds(1200))
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
                fetched_at=at_seconds(0),
            )
            for vm, zone in (("bu1", "1"), ("bu2", "2"))
        ]
        Placements(store.service.get_table_client(f"{store.prefix}identities")).put(rows)

    one = event("EV-B1", "Reboot", resources=("bu1",), not_before=at_seconds(900))
    two = event("EV-B2", "Reboot", resources=("bu2",), not_before=at_seconds(1500))
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
    ev = event("EV-SM", "Redeploy", resources=names, not_before=at_seconds(900), source="User")
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
    ev = event("EV-ST", "Redeploy", resources=names, not_before=at_seconds(900), duration=3600)
    lure = {
        **event("EV-ST", "Freeze", resources=names, not_before=at_seconds(900), duration=30),
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
