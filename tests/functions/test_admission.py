"""A VM Resource Graph does not know: waited for (it lags new VMs), then refused with why.

Service Bus redelivers an abandoned message at once, so ten quick deliveries would
dead-letter a new VM's first document while Resource Graph still catches up (about a
minute); each delivery waits first. Long after the message, the VM is not coming (the app's
identity cannot see its resource group, say): the message is rejected with the reason.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from functions.identity.facts import FactsUnavailable
from functions.pipeline.admission import UNKNOWN_VM_WAIT_SECONDS
from functions.pipeline.ingest import ingest_message
from tests import identity_harness
from tests.functions.conftest import T0, envelope, make_pipeline


@pytest.fixture
def unknown_vm():
    """The next message's VM is unknown to Resource Graph (its facts are forgotten)."""

    def forget(name: str) -> None:
        identity_harness.RESOLVER._facts.pop(identity_harness.vm_id(name), None)

    return forget


def test_a_new_vm_is_waited_for_then_retried(store, clock, unknown_vm):
    pipeline, _ = make_pipeline(store, clock)
    waits: list[float] = []
    pipeline.admission.sleep = waits.append
    body = envelope("fresh-vm", 1, [], observed_at=T0)
    unknown_vm("fresh-vm")
    with pytest.raises(FactsUnavailable):  # abandoned: Service Bus delivers it again
        ingest_message(body, pipeline)
    assert waits == [UNKNOWN_VM_WAIT_SECONDS]
    assert list(store.rejected_rows()) == []


def test_long_after_the_message_an_unknown_vm_is_rejected_with_the_reason(store, clock, unknown_vm):
    pipeline, _ = make_pipeline(store, clock)
    pipeline.admission.sleep = lambda _: None
    body = envelope("lost-vm", 1, [], observed_at=T0)
    unknown_vm("lost-vm")
    clock.advance(timedelta(minutes=16).total_seconds())
    result = ingest_message(body, pipeline)
    assert result.outcome == "rejected"
    assert "not in Resource Graph 16 min after this message" in result.reason
    assert "vmScopes" in result.reason


def test_a_heartbeat_of_a_vm_azure_cannot_describe_yet_is_left_out_not_the_batch(
    store, clock, unknown_vm
):
    from functions.pipeline.heartbeats import ingest_heartbeats

    pipeline, _ = make_pipeline(store, clock)
    pipeline.admission.sleep = lambda _: pytest.fail("a heartbeat batch never waits")
    known = envelope("known-vm", 1, None, kind="heartbeat", observed_at=T0)
    fresh = envelope("fresh-vm", 1, None, kind="heartbeat", observed_at=T0)
    unknown_vm("fresh-vm")
    result = ingest_heartbeats([known, fresh], pipeline)
    assert (result.heard, result.unadmitted, result.rejected) == (1, 1, 0)
    assert store.get_vm("known-vm").last_seen == clock.now()


def _max_delivery_count() -> int:
    """The documents queue's maxDeliveryCount as the Bicep deploys it by default."""
    import re
    from pathlib import Path

    bicep = (Path(__file__).resolve().parents[2] / "infra" / "main.bicep").read_text()
    found = re.search(r"^param maxDeliveryCount int = (\d+)$", bicep, re.M)
    assert found, "infra/main.bicep has no maxDeliveryCount default"
    return int(found.group(1))


def test_an_unknown_vm_is_rejected_with_the_reason_before_service_bus_dead_letters_it(
    store, clock, unknown_vm
):
    """Each delivery waits UNKNOWN_VM_WAIT_SECONDS (the clock moves by it) and Service Bus
    redelivers at once: within maxDeliveryCount deliveries the message must be rejected
    with the reason, never left to dead-letter without one."""
    pipeline, _ = make_pipeline(store, clock)
    pipeline.admission.sleep = clock.advance
    body = envelope("never-vm", 1, [], observed_at=T0)
    unknown_vm("never-vm")
    deliveries = _max_delivery_count()
    for delivery in range(1, deliveries + 1):
        try:
            result = ingest_message(body, pipeline)
        except FactsUnavailable:
            continue
        assert result.outcome == "rejected", result
        assert "not in Resource Graph" in result.reason
        assert delivery <= deliveries
        return
    pytest.fail(f"still abandoned after {deliveries} deliveries: Service Bus dead-letters it")
