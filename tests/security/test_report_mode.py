"""ATTESTATION_MODE=report only reports (issue 32).

The red team, with root on one VM and the bridge in report mode (a rollout): a made-up
Terminate sent in another VM's name counted as that VM's own view (and drained it through
the customer's hook); a key sent in the name of a VM that had not sent yet was enrolled as
that VM's, and stayed as its previous key after the switch back to enforce; random claimed
vmIds each cost Resource Graph queries and a 15 s wait holding a session.

Now a message whose attested document fails is logged ("would reject") and counted, and
admitted only with its VM's callback key from an earlier attested message: it gives its
sender no power over any other VM. The attacker's messages here are made by its real relay
code (its IMDS attests them, for its own vmId), claiming the victim's.
"""

from __future__ import annotations

import logging
import time
import uuid
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import pytest

from functions.identity.facts import FactsUnavailable
from functions.pipeline.admission import REPORT
from tests.security.conftest import Fleet
from tests.security.hostile import Meter

pytestmark = pytest.mark.azurite


def reporting(fleet: Fleet) -> list[float]:
    """The fleet in report mode; the waits admission asks for, recorded (not slept)."""
    fleet.pipeline.admission.mode = REPORT
    waits: list[float] = []
    fleet.pipeline.admission.sleep = waits.append
    return waits


def made_up_terminate(vm: str) -> dict:
    return {
        "EventId": str(uuid.uuid4()).upper(),
        "EventType": "Terminate",
        "ResourceType": "VirtualMachine",
        "Resources": [vm],
        "EventStatus": "Scheduled",
        "NotBefore": format_datetime(datetime.now(UTC) + timedelta(minutes=15), usegmt=True),
        "Description": "",
        "EventSource": "Platform",
        "DurationInSeconds": -1,
    }


def test_a_made_up_terminate_in_another_vms_name_is_not_its_view(
    fleet: Fleet, caplog: pytest.LogCaptureFixture
):
    caplog.set_level(logging.WARNING)
    victim, attacker = fleet.vms["victim"], fleet.vms["attacker"]
    assert fleet.deliver(victim.message([])).outcome == "processed"  # enrolled, attested
    reporting(fleet)
    event = made_up_terminate("victim")
    forged = attacker.message([event], claims={"vm_id": victim.vm_id, "name": "victim"})

    result = fleet.deliver(forged)

    assert result.outcome == "rejected", result
    assert "does not match" in result.reason and "not the VM's key" in result.reason
    assert fleet.store.get_event(event["EventId"]) is None  # no view, so nothing to drain
    assert fleet.publisher.transitions(event["EventId"]) == []
    assert any("would reject" in r.getMessage() for r in caplog.records)
    # Legitimate: the victim's own message, failing attestation the same way (a mismatch
    # with Azure), is admitted by the key its attested message enrolled.
    fleet.pipeline.admission.verifier.allowed_subscriptions = frozenset({"not-azures"})
    assert fleet.deliver(victim.message([])).outcome == "processed"


def test_no_vm_can_plant_its_key_for_a_vm_that_has_not_sent(fleet: Fleet):
    victim, attacker = fleet.vms["victim"], fleet.vms["attacker"]
    reporting(fleet)
    planted = attacker.message([], claims={"vm_id": victim.vm_id, "name": "victim"})

    assert fleet.deliver(planted).outcome == "rejected"
    registry = fleet.pipeline.admission.registry
    assert registry.get(victim.vm_id) is None  # nothing stored, not even facts

    fleet.pipeline.admission.mode = "enforce"  # the switch back
    assert fleet.deliver(victim.message([])).outcome == "processed"
    keys = [k.key_id for k in registry.get(victim.vm_id).keys]
    assert keys == [victim.keys.current.id], keys  # the victim's key, and no other


def test_random_claimed_vm_ids_cost_no_query_and_no_wait(fleet: Fleet):
    attacker = fleet.vms["attacker"]
    assert fleet.deliver(attacker.message([])).outcome == "processed"
    waits = reporting(fleet)
    meter = Meter()
    began = time.monotonic()
    with meter.counting():
        outcomes = []
        for _ in range(5):
            claim = {"vm_id": str(uuid.uuid4()), "name": f"vm-{uuid.uuid4().hex[:8]}"}
            try:
                outcomes.append(fleet.deliver(attacker.message([], claims=claim)).outcome)
            except FactsUnavailable as exc:  # retried: the session held for the wait
                outcomes.append(f"retry: {exc}")
    assert outcomes == ["rejected"] * 5, outcomes
    assert meter.resource_graph() == 0 and waits == []
    assert time.monotonic() - began < 5.0


def test_a_rejected_message_is_kept_without_its_relays_secret(fleet: Fleet):
    """The rejected table keeps bodies for people; a relay's callback secret in one would
    let its reader sign callbacks to that relay and, in report mode, speak for its VM."""
    victim = fleet.vms["victim"]
    far = made_up_terminate("victim")
    far["NotBefore"] = format_datetime(datetime.now(UTC) + timedelta(days=400), usegmt=True)
    result = fleet.deliver(victim.message([far]))
    assert result.outcome == "rejected" and "NotBefore" in result.reason
    bodies = [row["body"] for row in fleet.store.rejected_rows()]
    assert bodies and all(victim.keys.current.secret.hex() not in b for b in bodies)
    assert victim.keys.current.id in bodies[0]  # the rest as received
