"""A drain that meets a storage outage still drains, then approves, once (issue 46, 7d).

The demo's whole stack at 20x plays a scale-in Terminate (drained through its readiness
probe); storage refuses for 20 s (about 7 minutes of the demo's time) from the moment its
`decided` notification reaches the `terminate` subscription, longer than the Table SDK's
retries of a request, so the drain workflow's run raises. As in Azure
(functions.triggers.terminate), the subscription delivers the message again (local/bus.py),
and once its deliveries run out, the one decider runs the drain still due from the row
(`pipeline.drainer`, as the function app wires it).

On 75de079 the demo's drain worker dropped the run that raised and nothing drained from
the row: the Terminate was never drained, never approved (Azure deleted the VM at NotBefore).
"""

from __future__ import annotations

import threading
import time

import pytest

from tests.chaos import faults
from tests.chaos.runner import PLANS, play, step_key

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300), pytest.mark.xdist_group("chaos")]


@pytest.mark.parametrize(
    ("deliveries", "dead_letters"),
    [
        (None, 0),  # redelivered (maxDeliveryCount as deployed): a later delivery drains
        (1, 1),  # dead-lettered at once: the sweep drains it from the row
    ],
    ids=["redelivered", "dead-lettered"],
)
def test_a_drain_that_met_a_storage_outage_drains_then_approves_once(deliveries, dead_letters):
    plan = PLANS["scale-in"]
    fault = faults.StorageOutageInDrain(20, deliveries=deliveries)
    result = play(plan, fault, time_scale=20, settle_limit=120)
    (step,) = plan.steps
    seen = result.signature[step_key(step)]
    demo = fault.demo
    story = f"{fault.trace}\n{seen}\n" + "\n".join(map(str, demo.timeline.entries))
    assert fault.trace, story  # the outage met the drain
    failed = [e for e in demo.timeline.entries if "workflow failed" in str(e)]
    assert failed, story  # the drain's first run raised
    assert result.settled and seen["ended"] == "completed", story
    assert seen["drain_hook"] == ["drain"], story  # drained once
    assert seen["approved"] and seen["start_requests"] == 1, story  # approved once
    announced = demo.publisher.transitions(demo.step_events[step])
    assert "drain_failed" not in announced, story
    assert announced.count("approved") == 1, story
    assert announced.index("drain_started") < announced.index("approved"), story
    assert len(demo.terminate_subscription.dead_letters) == dead_letters, story


def test_a_demo_stopped_mid_drain_stops_at_once_and_leaves_no_drain_thread():
    """Both drain paths in flight when the demo stops: the subscription's run waiting for a
    drain hook that never answers, and the sweep's worker draining the same event from its
    row (it waits for the run holding the hook's step). The stop cuts both (local/
    stopping.py): the demo stops within a bound well under the CLI's 30 s, and no drain
    workflow or host worker thread is left to call its stopped Azurite (3f9484e reverted
    3c1894f for both). Before the stop signal the close waited for the hook's scaled step
    timeout (30 s at 4x), then for the rest of the drain: 212 s; after, 0.5 s."""
    from local.options import DemoOptions
    from local.orchestration import Demo
    from local.report import Timeline
    from tests.e2e.conftest import clean_env

    plan = PLANS["drain"]  # a Reboot drained: its HTTP drain hook first
    (step,) = plan.steps
    before = set(threading.enumerate())
    options = DemoOptions(
        report=None,
        env=clean_env(),
        time_limit=300,
        time_scale=4,  # a hook's step timeout is 30 s: the stop must not wait for it
        fleet=plan.fleet,
        plan=plan.steps,
    )
    demo = Demo(options, Timeline(stream=None))
    hook_asked, from_row, answer = threading.Event(), threading.Event(), threading.Event()
    handlers: list[threading.Thread] = []  # the hook's handler threads, joined below
    try:
        demo.start()
        probing = [t for t in threading.enumerate() if t.name.startswith("lane-probe-")]
        receiver = demo.receivers["drain"]

        def never_answers(body: object) -> object:
            handlers.append(threading.current_thread())
            hook_asked.set()
            answer.wait(120)
            return {}  # its caller is gone: an answer nobody reads

        receiver.answer = never_answers
        drainer = demo.host.pipeline.drainer

        def sweep_drains(what: str, row: object) -> str:
            if what == "drain":
                from_row.set()
            return drainer(what, row)

        demo.host.pipeline.drainer = sweep_drains
        demo.sim.play(step.scenario, target=step.target)
        story = "\n".join(map(str, demo.timeline.entries))
        assert hook_asked.wait(90), story
        assert from_row.wait(90), "\n".join(map(str, demo.timeline.entries))
    finally:
        began = time.monotonic()
        demo.close()
        took = time.monotonic() - began
        answer.set()
        for handler in handlers:  # ended here, not in a later test of this worker
            handler.join(10)
    # The bound is the CLI's own (a demo must stop within 30 s of Ctrl-C), less a margin:
    # 0.5 s here when quiet, 212 s before the stop signal; the whole suite beside it on two
    # cores once failed this test at a tighter bound, its cause hidden by pytest's renderer.
    assert took < 25, f"the demo took {took:.1f} s to stop"
    left = [t for t in set(threading.enumerate()) - before if t.is_alive()]
    workers = [t.name for t in left if t.name.startswith(("drain-workflow", "work_"))]
    assert workers == [], f"{workers} outlived the demo's stop ({took:.1f} s)"
    host = [t.name for t in left if t.name == "local-functions-host"]
    assert host == [], f"the host's thread outlived the demo's stop ({took:.1f} s)"
    # The upgrade lane's load balancer probes (local/demo_upgrade.py) stop with the demo: on
    # 7fa2009 they probed on, and one met a later test's patched getaddrinfo.
    assert probing, "the demo started no upgrade-lane probe: this check would see nothing"
    probes = [t.name for t in left if t.name.startswith("lane-probe-")]
    assert probes == [], f"{probes} outlived the demo's stop"
    for lease in [t for t in left if t.name == "drain-lease"]:
        lease.join(15)  # told to stop by its step's end; it sends nothing more
        assert not lease.is_alive(), "a drain step's lease renewal outlived the demo"
