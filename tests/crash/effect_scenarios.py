"""Crash scenarios of the app's other effects and inputs (issue 31): drain and undrain
hooks (a scale-in, a drained Reboot, a Spot eviction, a refused drain, a lost `decided`),
the notification channels, Event Grid and the ARM approver, and the watchdog's sweep.
Listed, with what each must show, in tests/crash/scenarios.py.

Each VM has its own name per scenario (the test identity registry is keyed by name), and
every message is built once per scenario, so all runs of a scenario deliver the same
bytes. Times are the FakeClock's: T0 is 10:00 UTC; a message is observed when the clock
reaches it (`at`), and the clock is moved there first.
"""

from __future__ import annotations

import json

from functions.model.policy import Policy
from tests.agentless.grid import grid_event
from tests.crash.runner import (
    Step,
    advance,
    dead_letter,
    drain,
    event_grid,
    heartbeat,
    notify,
    settle,
    watchdog,
)
from tests.crash.scenario_steps import FINAL, at_seconds, doc, drain_rule, until
from tests.crash.world import Config, Servers
from tests.functions.conftest import event


def drain_terminate(servers: Servers) -> tuple[Config, list[Step]]:
    """A scale-in Terminate of a scale-set VM: drained by the customer's HTTP drain hook,
    then approved through its relay (the default policy's terminate-drain), then gone."""
    ev = event("EV-TD", "Terminate", resources=("ss_0",), not_before=at_seconds(600), source="User")
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
    ev = event("EV-DR", "Reboot", resources=("dr1",), not_before=at_seconds(900))
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


def preempt(servers: Servers) -> tuple[Config, list[Step]]:
    """A Spot VM's Preempt (30 s notice) a rule drains: the HTTP drain hook within the
    Preempt margins, the approval, then the VM is gone by NotBefore (Azure starts an
    approved event at once). Its last document comes within NOT_BEFORE_GRACE: no sweep
    in between, whose retry a minute later would come before it here (steps run in turn)
    but not in Azure, and find it overdue."""
    ev = event("EV-PE", "Preempt", resources=("spot_0",), not_before=at_seconds(30))
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
    ev = event("EV-CU", "Terminate", resources=("cu_0",), not_before=at_seconds(600), source="User")
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
    ev = event("EV-CH", "Redeploy", resources=("ch1",), not_before=at_seconds(900))
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
    props = event(
        "EV-EG", "Redeploy", resources=("web_1",), not_before=at_seconds(900), source="User"
    )
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
            json.dumps(grid_event(done, owner=owner, grid_id="grid-2", at=at_seconds(120))),
            "grid#2",
        ),
        drain(),
        *settle(*FINAL),
    ]
    settings = {"approvers": "relay,arm", "arm_endpoint": servers.arm.arm_url}
    return Config(settings=settings, arm=True, reset=reset), steps


def watchdog_sweep(servers: Servers) -> tuple[Config, list[Step]]:
    """One watchdog sweep with work to do: a held Reboot past its NotBefore (overdue) on a
    VM whose relay went silent (its liveness row is older than RELAY_SILENT_AFTER)."""
    ev = event("EV-WD", "Reboot", resources=("wd1",), not_before=at_seconds(300))
    steps = [
        doc("wd1", 1, [ev], servers, 0),
        heartbeat("wd1", 0),
        advance(900),
        watchdog(),
        drain(),
    ]
    return Config(), steps


def grid_completed_in_flight(servers: Servers) -> tuple[Config, list[Step]]:
    """Issue 37: a relay-reported Redeploy that Event Grid also describes: the approval
    through the relay, and Azure's Completed while a host that died holds the claim."""
    from simulator import instance

    owner = (
        f"/subscriptions/{instance.SUBSCRIPTION_ID}/resourceGroups/{instance.RESOURCE_GROUP}"
        "/providers/Microsoft.Compute/virtualMachineScaleSets/gc"
    )
    ev = event("EV-GC", "Redeploy", resources=("gc_0",), not_before=at_seconds(900), source="User")
    done = {**ev, "EventStatus": "Completed", "NotBefore": ""}
    steps = [
        doc("gc_0", 1, [ev], servers, 0, scale_set="gc"),
        event_grid(
            json.dumps(grid_event(done, owner=owner, grid_id="gc-2", at=at_seconds(30))), "grid"
        ),
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
    ev = event("EV-DL", "Reboot", resources=("dl1",), not_before=at_seconds(900))
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
