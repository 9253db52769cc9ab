"""The ARM approver against the simulator's acknowledge endpoint (a real local HTTP server),
with azure-identity's ManagedIdentityCredential fetching real tokens from the simulator's
managed-identity endpoint; approver order and fallback timing on the fake clock."""

from __future__ import annotations

import base64
import json
from datetime import timedelta

import pytest
from azure.core.credentials import AccessToken
from azure.identity import ManagedIdentityCredential

from functions.pipeline.approve import approve_event
from simulator import Simulator, SimulatorServer, instance
from tests import identity_harness
from tests.agentless.grid import event, grid_event
from tests.agentless.queues import deliver
from tests.functions.conftest import T0, envelope, make_pipeline

RG = f"/subscriptions/{instance.SUBSCRIPTION_ID}/resourceGroups/{instance.RESOURCE_GROUP}"


def owner(kind: str, name: str) -> str:
    return f"{RG}/providers/Microsoft.Compute/{kind}/{name}"


@pytest.fixture
def arm(monkeypatch):
    sim = Simulator(time_scale=1.0)
    sim.add_scale_set("web", 2)
    sim.add_vm("solo")
    sim.add_availability_set("as1", ["a1", "a2"])
    server = SimulatorServer(sim).start()
    monkeypatch.setenv("AZURE_POD_IDENTITY_AUTHORITY_HOST", server.url)
    try:
        yield server
    finally:
        server.stop()


def agentless(store, clock, arm, **settings):
    # The simulated Azure runs on the wall clock (its tokens must be current for
    # azure-identity), the app on the tests' FakeClock at T0: NotBefore may be days "ahead".
    settings = {"approvers": "relay,arm", "max_not_before_days": 365, **settings}
    pipeline, pub = make_pipeline(store, clock, arm_endpoint=arm.arm_url, **settings)
    pipeline.credential = ManagedIdentityCredential()
    return pipeline, pub


def grid(pipeline, props, kind="virtualMachineScaleSets", name="web"):
    return deliver(json.dumps(grid_event(props, owner=owner(kind, name))), pipeline)


def user_event(sim, event_id, resources, event_type="Redeploy"):
    """The event as the simulated Azure holds it (IMDS, Event Grid and Resource Graph agree:
    the ARM approver acknowledges a relay-reported event only if Resource Graph shows it as
    decided), with a Description of the tests' own."""
    sim.add_event(event_type, resources=resources, event_id=event_id, source="User")
    azure = sim.describe_event(event_id)
    return {
        **event(event_id, event_type, resources=tuple(resources), source="User"),
        **{k: azure[k] for k in ("NotBefore", "DurationInSeconds", "Resources")},
    }


def acknowledges(arm):
    """ARM's acknowledge calls (not the Resource Graph queries the app also makes)."""
    return [c for c in arm.arm.calls if c.path.endswith("/acknowledge")]


def with_compute(body: str, resource_id: str) -> str:
    return identity_harness.with_resource_id(body, resource_id)


def test_event_grid_only_event_is_acknowledged_through_arm(store, clock, arm):
    pipeline, pub = agentless(store, clock, arm)
    result = grid(pipeline, user_event(arm.sim, "EV-A", ["web_1"]))
    assert pub.transitions("EV-A") == ["scheduled", "decided", "approved"]
    assert result.approvals[0].outcome == "approved" and result.approvals[0].vm == "arm"
    assert arm.sim.describe_event("EV-A")["EventStatus"] == "Started"
    (call,) = arm.arm.calls
    assert call.status == 200 and "/virtualMachineScaleSets/web/" in call.path
    record = store.get_event("EV-A")
    assert record.approval == "approved" and record.approved_by == "arm"
    assert [a["outcome"] for a in store.audit_rows("EV-A")] == ["approving", "approved via arm"]
    approved = pub.published[-1]
    assert approved.detail.startswith(
        "approved via arm: acknowledged through ARM on /subscriptions"
    )


class BadToken:
    def get_token(self, *scopes, **kwargs):
        return AccessToken("not-a-token", 4102444800)


def test_401_is_recorded_with_arms_code(store, clock, arm):
    pipeline, pub = agentless(store, clock, arm)
    pipeline.credential = BadToken()
    grid(pipeline, user_event(arm.sim, "EV-401", ["solo"]), "virtualMachines", "solo")
    assert pub.transitions("EV-401")[-1] == "approval_failed"
    record = store.get_event("EV-401")
    assert "ARM refused 401 InvalidAuthenticationToken" in record.approval_reason
    assert arm.sim.describe_event("EV-401")["EventStatus"] == "Scheduled"
    assert "ARM refused 401" in pub.published[-1].detail


def test_403_without_the_role_then_approved_with_it_on_that_scope_only(store, clock, arm):
    pipeline, _pub = agentless(store, clock, arm)
    token = pipeline.credential.get_token(arm.arm_url + "/.default").token
    principal = json.loads(base64.urlsafe_b64decode(token.split(".")[1] + "=="))["appid"]
    arm.arm.grant(principal, owner("virtualMachineScaleSets", "other"))
    first = user_event(arm.sim, "EV-403", ["web_0"])
    grid(pipeline, first)
    record = store.get_event("EV-403")
    assert record.approval == "failed"
    assert "ARM refused 403 AuthorizationFailed" in record.approval_reason
    assert "Microsoft.Maintenance/scheduledevents/acknowledge/action" in record.approval_reason
    grid(pipeline, {**first, "EventStatus": "Canceled"})  # frees the set's capacity slot
    arm.arm.grant(principal, owner("virtualMachineScaleSets", "web"))
    grid(pipeline, user_event(arm.sim, "EV-403b", ["web_1"]))
    assert store.get_event("EV-403b").approval == "approved"
    assert [c.status for c in arm.arm.calls] == [403, 200]


def test_404_unknown_event(store, clock, arm):
    pipeline, pub = agentless(store, clock, arm)
    grid(pipeline, event("EV-GONE", "Redeploy", resources=("web_1",), source="User"))
    record = store.get_event("EV-GONE")
    # Azure's answer as recorded (tests/conformance/samples/ScheduledEvents_Acknowledge.
    # recorded-404.json): capitalised keys, read case-insensitively.
    assert (
        record.approval == "failed"
        and (
            "ARM refused 404 InvalidScheduledEventId on virtualMachineScaleSets/web: "
            "Scheduled event not found"
        )
        in record.approval_reason
    )
    assert pub.transitions("EV-GONE")[-1] == "approval_failed"


def test_409_event_no_longer_scheduled(store, clock, arm):
    """Azure started the event before the app's only call: that call approved nothing, so
    its 409 is final and Azure is not asked (tests/agentless/test_arm_repeat.py: repeats)."""
    pipeline, pub = agentless(store, clock, arm)
    props = user_event(arm.sim, "EV-409", ["web_1"])
    arm.sim.start_event("EV-409")
    grid(pipeline, props)
    record = store.get_event("EV-409")
    assert record.approval == "failed" and "ARM refused 409 Conflict" in record.approval_reason
    assert record.arm_sent_at is not None
    assert [c.path for c in arm.arm.calls if "ResourceGraph" in c.path] == []
    assert pub.transitions("EV-409")[-1] == "approval_failed"


def test_429_retried_honouring_retry_after(store, clock, arm):
    pipeline, _pub = agentless(store, clock, arm)
    arm.arm.fail_next(429, count=2, retry_after=3)
    grid(pipeline, user_event(arm.sim, "EV-429", ["web_1"]))
    assert store.get_event("EV-429").approval == "approved"
    assert [c.status for c in arm.arm.calls] == [429, 429, 200]
    assert clock.slept == [3, 3]
    assert [a.outcome.split(":")[0] for a in store.get_event("EV-429").approval_attempts] == [
        "ARM 429 TooManyRequests",
        "ARM 429 TooManyRequests",
        "Successfully approved scheduled event",
    ]


def test_5xx_until_the_deadline_fails_and_is_announced(store, clock, arm):
    pipeline, pub = agentless(store, clock, arm, approval_budget_seconds=3600)
    arm.arm.fail_next(503, count=1000, retry_after=120)
    props = user_event(arm.sim, "EV-503", ["web_1"])
    props["NotBefore"] = (T0 + timedelta(minutes=5)).strftime("%a, %d %b %Y %H:%M:%S GMT")
    grid(pipeline, props)
    record = store.get_event("EV-503")
    assert record.approval == "failed" and "before the approval deadline" in record.approval_reason
    assert clock.now() <= T0 + timedelta(minutes=5) - timedelta(seconds=10)
    assert pub.transitions("EV-503")[-1] == "approval_failed"


def test_relay_alone_never_calls_arm(store, clock, arm):
    pipeline, _pub = agentless(store, clock, arm, approvers="relay")
    grid(pipeline, user_event(arm.sim, "EV-R", ["web_1"]))
    record = store.get_event("EV-R")
    assert record.approval == "pending" and arm.arm.calls == []  # waits for web_1's relay
    assert "no VM named in Resources has a relay" in record.approval_reason


def test_arm_alone_skips_a_working_relay(store, clock, arm, relay):
    pipeline, _pub = agentless(store, clock, arm, approvers="arm")
    props = user_event(arm.sim, "EV-ARM", ["solo"])
    body = envelope("solo", 1, [props], callback_url=relay.url)
    deliver(with_compute(body, owner("virtualMachines", "solo")), pipeline)
    assert relay.requests == [] and store.get_event("EV-ARM").approved_by == "arm"


def test_relay_first_when_it_works(store, clock, arm, relay):
    pipeline, pub = agentless(store, clock, arm)
    props = user_event(arm.sim, "EV-RF", ["solo"])
    body = envelope("solo", 1, [props], callback_url=relay.url)
    deliver(with_compute(body, owner("virtualMachines", "solo")), pipeline)
    grid(pipeline, props, "virtualMachines", "solo")
    assert relay.starts() == ["EV-RF"] and arm.arm.calls == []
    assert pub.transitions("EV-RF") == ["scheduled", "decided", "approved"]
    assert "approved via relay:solo" in pub.published[-1].detail


def test_relay_down_falls_back_to_arm_after_the_fallback_time(store, clock, arm, relay):
    pipeline, _pub = agentless(store, clock, arm, arm_fallback_after_seconds=30)
    relay.default = (503, {"error": "callback down"})
    props = user_event(arm.sim, "EV-FB", ["a1"])
    body = envelope("a1", 1, [props], callback_url=relay.url, availability_set="as1")
    deliver(with_compute(body, owner("virtualMachines", "a1")), pipeline)
    record = store.get_event("EV-FB")
    assert record.approved_by == "arm" and len(relay.requests) >= 3
    relay_tries = [a.at for a in record.approval_attempts if a.vm == "a1"]
    arm_try = next(a.at for a in record.approval_attempts if a.vm == "arm")
    assert arm_try - relay_tries[0] <= timedelta(seconds=30)
    assert arm_try - relay_tries[0] >= timedelta(seconds=15)  # relays had their turn
    (call,) = acknowledges(arm)
    assert "/availabilitySets/as1/" in call.path  # the set owns its VMs' events
    assert [a["outcome"] for a in store.audit_rows("EV-FB")] == ["approving", "approved via arm"]


def test_relay_refusal_hands_over_to_arm_at_once(store, clock, arm, relay):
    pipeline, _pub = agentless(store, clock, arm)
    relay.default = (400, {"error": "malformed"})
    props = user_event(arm.sim, "EV-RR", ["web_0"])
    body = envelope("web_0", 1, [props], callback_url=relay.url, scale_set="web")
    body = with_compute(body, f"{owner('virtualMachineScaleSets', 'web')}/virtualMachines/0")
    deliver(body, pipeline)
    assert store.get_event("EV-RR").approved_by == "arm" and clock.slept == []


def test_fallback_waits_within_budget_then_the_watchdog_hands_over(store, clock, arm, relay):
    """One ingest invocation's budget ends before the fallback time: the event stays
    pending; the next attempt after the fallback time goes to ARM."""
    pipeline, _pub = agentless(
        store, clock, arm, arm_fallback_after_seconds=120, approval_budget_seconds=10
    )
    relay.default = (503, {"error": "down"})
    props = user_event(arm.sim, "EV-W", ["solo"])
    body = envelope("solo", 1, [props], callback_url=relay.url)
    deliver(with_compute(body, owner("virtualMachines", "solo")), pipeline)
    assert store.get_event("EV-W").approval == "pending" and arm.arm.calls == []
    clock.advance(120)
    result = approve_event(
        "EV-W", pipeline, by="watchdog", give_up_at=clock.now() + timedelta(seconds=10)
    )
    assert result.outcome == "approved" and result.vm == "arm"


def test_a_relay_event_is_acknowledged_on_azures_resource_id_not_the_relays(
    store, clock, arm, relay
):
    """The owner ARM is asked about comes from Azure (Resource Graph's row for the event);
    the relay's own resource_id claim is never used."""
    pipeline, _ = agentless(store, clock, arm, approvers="relay,arm")
    relay.default = (400, {"error": "refused"})
    props = user_event(arm.sim, "EV-L", ["web_1"])
    body = json.loads(envelope("web_1", 1, [props], callback_url=relay.url, scale_set="web"))
    body["vm"]["resource_id"] = owner("virtualMachines", "someone-else")
    deliver(identity_harness.attest(body, clock.now()), pipeline)
    assert arm.arm.calls and all("someone-else" not in c.path for c in arm.arm.calls)
    # Azure's owner of the event: Resource Graph's row for it names scale set web in the
    # simulated Azure's resource group; the relay's claim is never used.
    group = f"/resourcegroups/{instance.RESOURCE_GROUP.lower()}/"
    assert acknowledges(arm)
    assert all(group in c.path.lower() and "/web/" in c.path for c in acknowledges(arm))


def test_mixed_sources_pending_relay_then_event_grid_approves_once(store, clock, arm, new_relay):
    """A set-mate's relay lists an event that names only web_1: not its report to make, so
    it is left out. Event Grid then names the owner: ARM approves, once; the named VM's
    relay reports later and nothing is approved or announced again."""
    pipeline, pub = agentless(store, clock, arm, approvers="relay,arm")
    mate, named = new_relay(), new_relay()
    props = user_event(arm.sim, "EV-X", ["web_1"])
    result = deliver(
        envelope("web_0", 1, [props], callback_url=mate.url, scale_set="web"), pipeline
    )
    assert result.ignored_events == 1 and store.get_event("EV-X") is None
    grid(pipeline, props)
    assert store.get_event("EV-X").approved_by == "arm"
    deliver(envelope("web_1", 1, [props], callback_url=named.url, scale_set="web"), pipeline)
    assert mate.requests == [] and named.requests == []
    assert pub.transitions("EV-X") == ["scheduled", "decided", "approved"]
    assert len(arm.arm.calls) == 1


def test_arm_first_throttled_hands_over_to_the_relay(store, clock, arm, relay):
    pipeline, _ = agentless(store, clock, arm, approvers="arm,relay", approval_budget_seconds=5)
    arm.arm.fail_next(429, count=10, retry_after=10)
    props = user_event(arm.sim, "EV-AR", ["solo"])
    body = envelope("solo", 1, [props], callback_url=relay.url)
    deliver(with_compute(body, owner("virtualMachines", "solo")), pipeline)
    record = store.get_event("EV-AR")
    assert record.approved_by == "solo" and relay.starts() == ["EV-AR"]
    assert [c.status for c in arm.arm.calls] == [429]


def test_resource_graph_throttled_is_asked_again_after_retry_after(store, clock, arm, relay):
    """Before acknowledging a relay-reported event ARM's approver reads Azure's own view
    (Resource Graph); a 429 there is waited out (Retry-After), not a failed approval."""
    pipeline, _pub = agentless(store, clock, arm, arm_fallback_after_seconds=0)
    relay.default = (503, {"error": "callback down"})
    props = user_event(arm.sim, "EV-RG429", ["solo"])
    arm.arm.fail_next(429, count=1, retry_after=2)
    deliver(
        with_compute(
            envelope("solo", 1, [props], callback_url=relay.url), owner("virtualMachines", "solo")
        ),
        pipeline,
    )
    record = store.get_event("EV-RG429")
    assert record.approved_by == "arm", record.approval_reason
    assert 2 in clock.slept
    assert [c.status for c in arm.arm.calls][:2] == [429, 200]  # the view, asked again
