"""No VM steers another through its view of a shared event (issue 27): the approver.

The attacker is a set-mate of the victim: its IMDS shows the victim's events, and it can
report them as it likes, naming itself in `Resources` so the report is not left out. These
tests make that report with the attacker's real relay code and check what reaches the
victim's relay, IMDS and Resource Manager.
"""

from __future__ import annotations

from typing import Any

from tests.identity.test_facts import SimulatorCredential
from tests.security.conftest import Fleet


def imds_event(fleet: Fleet, vm: str, event_id: str) -> dict[str, Any]:
    return next(e for e in fleet.imds_events(vm) if e["EventId"] == event_id)


def own_document(fleet: Fleet, vm: str) -> list[dict[str, Any]]:
    return [e for e in fleet.imds_events(vm) if vm in e.get("Resources", [])]


def silence(fleet: Fleet, vm: str) -> None:
    """The attacker's own relay does not answer (it would approve nothing anyway)."""
    callback = fleet.vms[vm].callback
    if callback is not None:
        callback.stop()
        fleet.vms[vm].callback = None


def forge_short_freeze(fleet: Fleet) -> str:
    """The victim's 30 s Freeze (held: the reference policy approves only Freezes under
    9 s), reported first by the attacker as a 5 s Freeze naming both VMs (approved)."""
    fleet.deliver(fleet.vms["victim"].message([]))  # the victim's relay is known and fresh
    event_id = fleet.sim.add_event("Freeze", resources=["victim"], duration=30, notice=900)
    seen = imds_event(fleet, "attacker", event_id)  # a set-mate sees it
    forged = {**seen, "Resources": ["victim", "attacker"], "DurationInSeconds": 5}
    silence(fleet, "attacker")
    fleet.deliver(fleet.vms["attacker"].message([forged]))
    return event_id


def use_arm(fleet: Fleet, fallback_after: int = 0) -> None:
    """APPROVERS=relay,arm with the simulator's Resource Manager and the app's identity;
    ARM's turn `fallback_after` seconds after the first relay attempt."""
    fleet.pipeline.settings = fleet.pipeline.settings.model_copy(
        update={
            "approvers": "relay,arm",
            "arm_endpoint": fleet.server.arm_url,
            "arm_fallback_after_seconds": fallback_after,
        }
    )
    fleet.pipeline.credential = SimulatorCredential(fleet.server)


def acknowledged(fleet: Fleet) -> list[str]:
    return [c.path for c in fleet.server.arm.calls if c.path.endswith("/acknowledge")]


# --------------------------------------------------------------- the approving relay


def test_a_forged_duration_and_resources_cannot_get_the_victims_event_approved(fleet: Fleet):
    event_id = forge_short_freeze(fleet)

    record = fleet.store.get_event(event_id)
    assert record.decision is not None and record.decision.action == "approve"  # forged view
    victim = [a.outcome for a in record.approval_attempts if a.vm == "victim"]
    assert victim, record.approval_attempts
    assert all("differs" in o for o in victim), victim
    assert any("DurationInSeconds 5 expected, IMDS says 30" in o for o in victim), victim
    assert fleet.sim.approvals == []
    assert imds_event(fleet, "victim", event_id)["EventStatus"] == "Scheduled"
    assert record.approval == "failed"
    assert "approval_failed" in fleet.publisher.transitions(event_id)


def test_the_victims_own_view_still_gets_its_event_approved(fleet: Fleet):
    """Legitimate: the victim reports its own short Freeze; its relay agrees with the view
    and approves it in its IMDS."""
    fleet.deliver(fleet.vms["victim"].message([]))
    event_id = fleet.sim.add_event("Freeze", resources=["victim"], duration=5, notice=900)
    fleet.deliver(fleet.vms["victim"].message(own_document(fleet, "victim")))
    record = fleet.store.get_event(event_id)
    assert record.approval == "approved" and record.approved_by == "victim"
    assert [a.event_id for a in fleet.sim.approvals] == [event_id]


# --------------------------------------------------------------- ARM after a refusal


def test_a_relays_differs_is_final_for_arm_too(fleet: Fleet):
    """The victim's relay answers that its view differs; a second later ARM's turn would
    come (within the 3 s approval budget). The refusal ends the approval: Resource Manager
    is not asked."""
    use_arm(fleet, fallback_after=1)
    event_id = forge_short_freeze(fleet)

    record = fleet.store.get_event(event_id)
    assert any("differs" in a.outcome for a in record.approval_attempts if a.vm == "victim")
    assert acknowledged(fleet) == []  # Resource Manager never asked
    assert fleet.sim.approvals == []
    assert record.approval == "failed" and "differs" in record.approval_reason
    assert "arm:" not in record.approval_reason, record.approval_reason  # ARM had no turn
    assert "approval_failed" in fleet.publisher.transitions(event_id)
    audit = [row["outcome"] for row in fleet.store.audit_rows(event_id)]
    assert "failed" in audit, audit


def test_arm_acknowledges_only_what_azure_reports_the_same_way(fleet: Fleet):
    """The victim's relay is down (no refusal): ARM would take over. Resource Graph shows
    Azure's own view of the event (30 s, the victim alone), which is not the view the
    decision rests on: ARM is not asked."""
    use_arm(fleet)
    silence(fleet, "victim")
    event_id = forge_short_freeze(fleet)

    record = fleet.store.get_event(event_id)
    assert acknowledged(fleet) == []
    assert fleet.sim.approvals == []
    assert record.approval != "approved"
    assert "Azure" in record.approval_reason, record.approval_reason


def test_arm_still_acknowledges_an_event_azure_reports_as_decided(fleet: Fleet):
    """Legitimate: the victim's own short Freeze, its relay down: ARM acknowledges it once
    Resource Graph shows the event as the victim reported it."""
    use_arm(fleet)
    fleet.deliver(fleet.vms["victim"].message([]))
    silence(fleet, "victim")
    event_id = fleet.sim.add_event("Freeze", resources=["victim"], duration=5, notice=900)
    fleet.deliver(fleet.vms["victim"].message(own_document(fleet, "victim")))
    record = fleet.store.get_event(event_id)
    assert record.approval == "approved" and record.approved_by == "arm", record.approval_reason
    assert len(acknowledged(fleet)) == 1


# --------------------------------------------------------------- the first reporter


def test_the_first_reporter_does_not_fix_a_shared_events_decision(fleet: Fleet):
    """A Freeze naming both VMs, 5 s in IMDS (approved by the reference policy). The
    attacker reports it first as 30 s (held). The victim's genuine report is decided on
    its own view: the event records that the views differ, with the decision made on each;
    the stricter one holds for the whole event, and no approval rests on either."""
    fleet.deliver(fleet.vms["victim"].message([]))
    event_id = fleet.sim.add_event(
        "Freeze", resources=["victim", "attacker"], duration=5, notice=900
    )
    longer = {**imds_event(fleet, "attacker", event_id), "DurationInSeconds": 30}
    silence(fleet, "attacker")
    fleet.deliver(fleet.vms["attacker"].message([longer]))
    assert fleet.store.get_event(event_id).decision.action == "hold"

    fleet.deliver(fleet.vms["victim"].message(own_document(fleet, "victim")))

    record = fleet.store.get_event(event_id)
    assert "DurationInSeconds" in record.views_differ, record.views_differ
    decided = {v.decision.action for v in record.views}
    assert decided == {"hold", "approve"}, record.views  # each view decided on its own
    assert record.decision.action == "hold"  # the stricter outcome for the whole event
    assert fleet.sim.approvals == []
