"""Resource Graph refusing the app's query (4xx other than 429) is a configuration error:
a VM it already described keeps its stored facts; a VM it never described waits slowly
(fewer deliveries than Service Bus's maxDeliveryCount), then is rejected with Azure's words,
never dead-lettered; the error is logged once per process, not once per message."""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

import pytest
import requests

from functions.identity import graph_state
from functions.identity.facts import ResourceGraphRefused
from functions.pipeline.admission import CONFIG_ERROR_PATIENCE, CONFIG_ERROR_WAIT_SECONDS
from functions.pipeline.ingest import ingest_message
from tests import identity_harness
from tests.functions.conftest import T0, envelope, make_pipeline

REFUSAL = ResourceGraphRefused(
    400,
    "BadRequest",
    "InvalidQuery: Query is invalid. | CrossTableUnionNotSupported: union across tables | "
    "Please provide below info when asking for support: timestamp = 2026-11-24T10:00:00Z, "
    "correlationId = 2f0c3f5c-0bd3-4b6a-9f1c-7a0a0f6e43b1.",
)


class Refusing:
    def __init__(self) -> None:
        self.calls = 0

    def resolve(self, vm_id: str) -> Any:
        self.calls += 1
        raise REFUSAL


@pytest.fixture
def refusing(monkeypatch):
    monkeypatch.setattr(graph_state, "_logged", set())
    return Refusing()


def test_an_unknown_vm_waits_a_minute_a_delivery_then_is_rejected_with_azures_words(
    store, clock, refusing, caplog
):
    pipeline, _ = make_pipeline(store, clock)
    pipeline.admission.identities.upstream = refusing
    waits: list[float] = []
    pipeline.admission.sleep = waits.append
    identity_harness.RESOLVER._facts.pop(identity_harness.vm_id("new-vm"), None)
    body = envelope("new-vm", 1, [], observed_at=T0)
    deliveries = 0
    with caplog.at_level(logging.ERROR, logger="functions.identity.graph_state"):
        while True:
            deliveries += 1
            try:
                result = ingest_message(body, pipeline)
                break
            except ResourceGraphRefused:  # abandoned: delivered again
                clock.advance(waits[-1] + 1)
    assert result.outcome == "rejected"
    assert "Resource Graph refused the app's query" in result.reason
    assert "CrossTableUnionNotSupported" in result.reason and "vmScopes" in result.reason
    assert deliveries < 10  # Service Bus's maxDeliveryCount: never a dead-letter
    assert set(waits) == {CONFIG_ERROR_WAIT_SECONDS}
    assert len(waits) >= CONFIG_ERROR_PATIENCE.total_seconds() // 61
    logged = [r for r in caplog.records if "REFUSED" in r.getMessage()]
    assert len(logged) == 1  # once per process, not once per delivery
    (row,) = list(store.rejected_rows())
    assert row["reason"] == result.reason


def test_a_known_vm_is_admitted_on_its_stored_facts(store, clock, refusing):
    pipeline, _ = make_pipeline(store, clock)
    body = envelope("old-vm", 1, [], observed_at=T0)
    assert ingest_message(body, pipeline).outcome != "rejected"  # enrolled while Azure answered
    pipeline.admission.identities.upstream = refusing
    clock.advance(timedelta(hours=12).total_seconds())  # its facts are stale now
    later = envelope("old-vm", 2, [], observed_at=clock.now())
    assert ingest_message(later, pipeline).outcome != "rejected"
    assert refusing.calls == 1  # the refresh was asked, refused, and the stored facts served


def test_the_sync_timer_announces_a_refusal_once_and_its_fix(store, clock, monkeypatch):
    from functions.identity import sync
    from functions.identity.facts import ResourceGraphResolver
    from functions.pipeline.identity_sync import run_identity_sync
    from simulator import Simulator, SimulatorServer
    from tests.identity.test_facts import SimulatorCredential
    from tests.simulator.test_resource_graph import OLD_FACTS_QUERY

    sim = Simulator(time_scale=60.0)
    sim.add_vm("solo")
    server = SimulatorServer(sim).start()
    try:
        pipeline, pub = make_pipeline(store, clock)
        pipeline.admission.identities.upstream = ResourceGraphResolver(
            requests.Session(), SimulatorCredential(server), server.arm_url
        )
        monkeypatch.setattr(sync, "vm_query", lambda table, vm_id=None: OLD_FACTS_QUERY)
        for _ in range(2):
            report = run_identity_sync(pipeline)
            assert "CrossTableUnionNotSupported" in report.error
        (note,) = [n for n in pub.published if n.transition == "config_invalid"]
        assert note.vm == "resource-graph" and "CrossTableUnionNotSupported" in note.detail
        monkeypatch.undo()
        assert run_identity_sync(pipeline).finished_pass
        assert [n.transition for n in pub.published][-1] == "config_valid"
        solo = pipeline.admission.registry.get(server.arm.inventory()[0]["vmId"])
        assert solo is not None and solo.facts.name == "solo"
    finally:
        server.stop()
