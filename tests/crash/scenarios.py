"""The scenarios of issue 31, each a script of calls of the app's public entry points:
SCENARIOS names each, says what its fault-free run must show, and which need Resource
Manager or a second crash. The scripts are built in tests/crash/approval_scenarios.py
(approvals: policy, a person, windows, the capacity and budget guards, set-mates) and
tests/crash/effect_scenarios.py (drains and undrains, channels, Event Grid and the ARM
approver, the watchdog), in the words of tests/crash/scenario_steps.py.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from tests.crash.approval_scenarios import (
    approve_reboot,
    budget,
    capacity,
    hold_then_window,
    lost_answer_started,
    manual_approval,
    set_mate_started,
    set_mate_text,
    shared_freeze,
)
from tests.crash.effect_scenarios import (
    cancel_undrain,
    channels,
    decided_lost,
    drain_reboot,
    drain_terminate,
    event_grid_arm,
    grid_completed_in_flight,
    preempt,
    watchdog_sweep,
)
from tests.crash.runner import Step
from tests.crash.world import Config, Servers


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
