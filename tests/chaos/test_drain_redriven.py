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
