"""The demo's fleet and the maintenance it plays: what `make demo` shows, and `--plan` replaces.

A plan is checked against the fleet and the simulator's scenarios before anything starts, so
a typo in a `--plan` file is a usage error, not a half-played demo.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from functions.model.budgets import Budget
from functions.model.policy import Match, Policy, Rule, default_rules


class VmSpec(BaseModel):
    model_config = ConfigDict(frozen=True)

    name: str
    availability_set: str | None = None
    scale_set: str | None = None
    spot: bool = False
    relay: bool = True  # False: no relay on it (agentless: Event Grid and ARM only)
    callback_down: bool = False  # its relay reports, but its callback URL answers nothing
    event_grid: bool = False  # opted in to Event Grid (scheduledEventsPolicy)
    # The operator's drain and undrain scripts are on it (relay --hook). False: a VM as a
    # first deploy sets it up, no script of the operator's, its readiness probe on: the
    # bridge drains it through the probe (issue 38).
    hooks: bool = True
    # Azure's facts about it, which Resource Graph answers (budgets group by them).
    zone: str | None = None
    tags: dict[str, str] = {}

    @property
    def group(self) -> str:
        placed = "".join(
            [f", zone {self.zone}" if self.zone else ""]
            + [f", {name}={value}" for name, value in sorted(self.tags.items())]
        )
        if self.availability_set:
            return f"availability set {self.availability_set}{placed}"
        if self.scale_set:
            return f"scale set {self.scale_set}{placed}"
        kind = "Spot VM" if self.spot else "standalone VM"
        if not self.relay:
            kind += ", no relay, Event Grid"
        elif self.callback_down:
            kind += ", relay callback down"
        return kind


class Step(BaseModel):
    """One scenario played at `at` seconds (real, already scaled) after the demo starts."""

    model_config = ConfigDict(frozen=True)

    at: float
    scenario: str
    target: str  # a VM name, or an availability set name for set-wide events
    story: str = ""  # what the audience should expect, in words
    # The demo policy's disruption budget that covers it: steps naming the same budget
    # take turns, each approved only once the one before is over (local.demo_budget).
    budget: str | None = None
    approved_via: str | None = None  # "arm": must be approved through Resource Manager
    drain: bool = False  # the demo's policy drains it: drained, approved, undrained if back


FLEET: tuple[VmSpec, ...] = (
    VmSpec(name="web-1", availability_set="web-as"),
    VmSpec(name="web-2", availability_set="web-as"),
    VmSpec(name="workers_0", scale_set="workers", hooks=False),
    VmSpec(name="workers_1", scale_set="workers", hooks=False),
    VmSpec(name="spot-1", spot=True),
    VmSpec(name="legacy-1", relay=False, event_grid=True),
    VmSpec(name="batch-1", callback_down=True),
    # Behind a load balancer, no script of the operator's: drained through its probe.
    VmSpec(name="app-1", hooks=False),
    # One service over two zonal scale sets: the budget one-per-service lets one out at a time.
    VmSpec(name="checkout-z1_0", scale_set="checkout-z1", zone="1", tags={"service": "checkout"}),
    VmSpec(name="checkout-z2_0", scale_set="checkout-z2", zone="2", tags={"service": "checkout"}),
)

# The demo's policy: the default rules (functions.model.policy.default_rules: drain, then
# approve, every disruptive event; a short Freeze approved at once) with two opt-in rules in
# front, for the stories the demo tells beside the drain: User reboots and redeploys approved
# at once (Microsoft's sample; the budget and Resource Manager stories), and Platform
# reboots of the web and workers sets held to NotBefore (an opt-in hold). The app VM's
# Platform Reboot and the Spot eviction are the default policy's: drained, then approved.
# And a disruption budget: at most one VM of each service (its `service` tag, from Resource
# Graph) out at a time, whatever its scale set or zone. Your POLICY__* settings replace it.
DEMO_RULES: tuple[Rule, ...] = (
    Rule(
        name="user-initiated",
        match=Match(event_types=("Reboot", "Redeploy"), sources=("User",)),
        action="approve",
        severity="info",
        ignore_windows=True,
    ),
    Rule(
        name="hold-set-reboots",
        match=Match(
            event_types=("Reboot",), sources=("Platform",), resources=("web-*", "workers_*")
        ),
        action="hold",
    ),
)


DEMO_BUDGETS: tuple[Budget, ...] = (
    Budget(name="one-per-service", group_by=("tag:service",), max_unavailable=1),
)


def demo_policy() -> Policy:
    """The policy the demo runs with when no POLICY__* setting is given."""
    return Policy(rules=(*DEMO_RULES, *default_rules()), budgets=DEMO_BUDGETS)


PLAN: tuple[Step, ...] = (
    Step(
        at=0.0,
        scenario="live-migration",
        target="web-1",
        story="live-migration Freeze 5 s: approved at once",
    ),
    Step(
        at=1.0,
        scenario="user-reboot",
        target="spot-1",
        story="user-initiated reboot: approved at once",
    ),
    Step(
        at=1.5,
        scenario="user-reboot",
        target="checkout-z1_0",
        story="patch-run reboot of the checkout VM in zone 1: approved at once, it takes the "
        "budget one-per-service",
        budget="one-per-service",
    ),
    Step(
        at=2.0,
        scenario="platform-reboot",
        target="web-as",
        story="platform reboot of the set: held (the demo's opt-in hold), announced once",
    ),
    Step(
        at=2.5,
        scenario="user-reboot",
        target="checkout-z2_0",
        story="patch-run reboot of the checkout VM in zone 2 (another scale set): waits for "
        "the budget, approved once zone 1's VM is back",
        budget="one-per-service",
    ),
    Step(
        at=3.0,
        scenario="terminate",
        target="workers_0",
        story="scale-in, no script of yours on the VM: out of its load balancer (readiness "
        "probe 503), then approved",
    ),
    Step(
        at=4.0,
        scenario="cancelled",
        target="workers_1",
        story="maintenance that Azure withdraws: cancelled",
    ),
    Step(
        at=5.0,
        scenario="user-redeploy",
        target="legacy-1",
        story="no relay (the path for Windows VMs): Event Grid brings it, approved through "
        "Resource Manager",
        approved_via="arm",
    ),
    Step(
        at=6.0,
        scenario="live-migration",
        target="batch-1",
        story="relay callback down: approved through Resource Manager before NotBefore",
        approved_via="arm",
    ),
    Step(
        at=7.0,
        scenario="platform-reboot",
        target="app-1",
        story="platform reboot of an app VM, the default policy: out of its load balancer "
        "(readiness probe 503) and your HTTP hook, then approved, put back once it is over",
        drain=True,
    ),
    Step(
        at=12.0,
        scenario="preempt",
        target="spot-1",
        story="Spot eviction with 30 s notice: drained within it, approved before NotBefore, paged",
        drain=True,
    ),
    Step(
        at=14.0,
        scenario="hardware-failure",
        target="workers_1",
        story="host failure: appears already Started",
    ),
)


def check_plan(plan: tuple[Step, ...], fleet: tuple[VmSpec, ...]) -> str | None:
    """A plan that cannot play says so before anything starts."""
    from simulator import SCENARIOS

    targets = {vm.name for vm in fleet}
    targets |= {s for vm in fleet for s in (vm.availability_set, vm.scale_set) if s}
    for step in plan:
        if step.scenario not in SCENARIOS:
            return f"unknown scenario {step.scenario!r}; known: {', '.join(SCENARIOS)}"
        if step.target not in targets:
            return f"unknown target {step.target!r}; the fleet has {', '.join(sorted(targets))}"
    return None
