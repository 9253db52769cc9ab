"""The drain wiring reads each VM's relay facts from its verified liveness hint (issue 44
item 2): the VM row's vmId, then the relay's heartbeat row. A relay that reports no
load-balancer probe (contract 1, every relay before it) has no readiness drain that is known
to work. Azurite."""

from __future__ import annotations

from datetime import timedelta

import pytest

from functions.model.drains import drain_for
from functions.store.drains import DrainStore
from functions.store.records import VmRecord
from functions.store.state import Store
from functions.terminate.settings import DrainSettings
from functions.terminate.wiring import pipeline_context
from tests.functions.conftest import FakeClock, make_pipeline, vm_id_of, write_liveness

pytestmark = pytest.mark.azurite


def test_the_drain_reads_the_relays_heartbeat(store: Store, clock: FakeClock) -> None:
    pipeline, _ = make_pipeline(store, clock)
    drains = DrainStore.from_service(store.service, store.prefix).ensure_table()
    ctx = pipeline_context(pipeline, drains)
    assert ctx.relay_facts is not None
    assert ctx.relay_facts("vm1") is None  # no VM row: nothing known of its relay

    def add(rec: VmRecord | None) -> VmRecord:
        return VmRecord(name="vm1", vm_id=vm_id_of("vm1"))

    store.mutate_vm("vm1", add)
    assert ctx.relay_facts("vm1") is None  # no heartbeat yet
    at = clock.now() - timedelta(seconds=40)
    write_liveness(store, "vm1", at)
    facts = ctx.relay_facts("vm1")
    assert facts is not None and facts.heard == at.replace(microsecond=0)
    assert facts.contract == 1 and facts.probe_at is None
    choice = drain_for(facts, DrainSettings(), clock.now())
    assert choice.kind == "none" and "contract 1" in choice.why
    assert drain_for(facts, DrainSettings(relay_hook="drain"), clock.now()).kind == "hook"
