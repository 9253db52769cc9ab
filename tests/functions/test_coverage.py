"""Fleet coverage (issue 44 item 4): VMs in scope with no relay heard, relays silent, relay
versions and contracts (and VMs on one this app does not accept), and the drain each VM
really has, from one summary row a coverage pass writes. On 2f59d6a neither `/api/status`
nor the fleet page said any of it. The pass's Table requests are counted: the pages of the
two tables it lists and one write, never a request per VM; a page view reads one row.
Azurite."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from azure.data.tables import EdmType, EntityProperty

from functions.identity.keys import key_id_of, liveness_signature_v2
from functions.identity.registry import Identity
from functions.model.budgets import Placement
from functions.pipeline.coverage import COVERAGE_EVERY, PAGE, run_coverage
from functions.store.liveness import row_keys_for
from functions.store.placements import Placements
from functions.store.state import Store
from functions.terminate.settings import DrainSettings
from functions.web.views import fleet_status
from tests import identity_harness
from tests.functions.conftest import FakeClock, make_pipeline
from tests.tablecount import TableCounter

pytestmark = pytest.mark.azurite


def secret_of(name: str) -> bytes:
    return identity_harness.callback_key(name, None).secret


def enrol(pipeline, name: str, *, keyed: bool = True) -> str:
    """An identities row as the sync (no key) or admission (with the relay's key) leaves it."""
    facts = identity_harness.facts_for(name, scale_set="web")
    keys = (identity_harness.callback_key(name, None),) if keyed else ()
    pipeline.admission.registry.save(Identity(facts=facts, keys=keys))
    return facts.vm_id


def heartbeat(
    store: Store,
    name: str,
    at: datetime,
    *,
    version: str = "0.2.0",
    contract: int = 2,
    probe_at: int = 0,
    drain: str = "readiness",
) -> None:
    """The contract-2 liveness row `name`'s relay writes (signed with its key)."""
    secret = secret_of(name)
    vm_id = identity_harness.vm_id(name)
    pk, rk = row_keys_for(secret)
    unix = int(at.timestamp())
    sig = liveness_signature_v2(secret, vm_id, unix, version, contract, probe_at, drain)
    store.liveness.table.upsert_entity(
        {
            "PartitionKey": pk,
            "RowKey": rk,
            "vm_id": vm_id,
            "seen": datetime.fromtimestamp(unix, UTC),
            "at": EntityProperty(unix, EdmType.INT64),
            "relay_version": version,
            "key_id": key_id_of(secret),
            "sig": sig,
            "contract": contract,
            "probe_at": EntityProperty(probe_at, EdmType.INT64),
            "drain": drain,
        }
    )


def test_coverage_counts_what_the_fleet_page_and_api_show(store: Store, clock: FakeClock) -> None:
    pipeline, _ = make_pipeline(store, clock)
    now = clock.now()
    for i in range(3):
        enrol(pipeline, f"cold_{i}", keyed=False)  # in scope, no relay ever heard
    probed = int(now.timestamp()) - 5
    for i in range(4):  # behind a load balancer, relay 0.2.0
        enrol(pipeline, f"web_{i}")
        heartbeat(store, f"web_{i}", now - timedelta(seconds=20), probe_at=probed)
    enrol(pipeline, "batch_0")  # no load balancer probes it
    heartbeat(store, "batch_0", now - timedelta(seconds=20))
    enrol(pipeline, "old_0")  # silent for an hour, an older relay version
    heartbeat(store, "old_0", now - timedelta(hours=1), version="0.1.9")
    enrol(pipeline, "new_0")  # a relay newer than this app: contract 3
    heartbeat(store, "new_0", now, contract=3, version="0.3.0")
    store.liveness.table.upsert_entity({"PartitionKey": "lv00", "RowKey": "junk", "x": 1})
    # The budgets' placement and group-size rows share the identities table: not VMs.
    placements = Placements(store.service.get_table_client(f"{store.prefix}identities"))
    placements.put(
        [Placement(name=f"web_{i}", tags={"service": "web"}, fetched_at=now) for i in range(4)]
    )
    placements.table.upsert_entity(
        {"PartitionKey": "size|web", "RowKey": "tag:service=web", "size": 4}
    )

    assert fleet_status(pipeline, False)["coverage"] is None  # before the first pass
    done = run_coverage(pipeline)
    assert done is not None
    cov = fleet_status(pipeline, False)["coverage"]
    assert cov["in_scope"] == 10 and cov["no_relay"] == 3
    assert cov["no_relay_vms"] == ["cold_0", "cold_1", "cold_2"]
    assert cov["enrolled"] == 7 and cov["heartbeat_rows"] == 6
    assert cov["silent"] == 1 and cov["silent_vms"] == ["old_0"]
    assert cov["versions"] == {"0.1.9": 1, "0.2.0": 5}
    assert cov["contracts"] == {"2": 6, "3": 1}
    assert cov["not_accepted"] == 1 and cov["not_accepted_vms"] == ["new_0"]
    assert cov["accepted_contracts"] == [1, 2]
    # Drains with the default DRAIN__* settings: the probe only where it is probed.
    assert cov["drains"] == {"hook": 0, "http": 0, "readiness": 4, "none": 3}
    assert cov["no_drain_vms"] == ["batch_0", "new_0", "old_0"]
    assert cov["unbelieved_rows"] == 2  # the junk row and the contract-3 row

    # Not due again for COVERAGE_EVERY; then it is.
    assert run_coverage(pipeline) is None
    clock.advance(COVERAGE_EVERY.total_seconds())
    assert run_coverage(pipeline) is not None

    # The drain workflow's own settings where they are not the process's DRAIN__* (the
    # local stack's): an HTTP drain covers every VM, probed or not.
    run_coverage(pipeline, force=True, drain=DrainSettings(http_url="https://drain.example/x"))
    cov = fleet_status(pipeline, False)["coverage"]
    assert cov["drains"] == {"hook": 0, "http": 7, "readiness": 0, "none": 0}


@pytest.mark.parametrize("count", [5, 2 * PAGE + 1])
def test_a_pass_costs_pages_not_vms_and_a_page_view_one_read(
    azurite: str, clock: FakeClock, count: int
) -> None:
    """The pass lists both tables a page (1,000 rows) at a time and writes one row: 3
    requests for 5 VMs, 7 for 2,001; the page view reads the summary alone."""
    with TableCounter(azurite) as counter:
        prefix = "cv" + datetime.now(UTC).strftime("%H%M%S%f")
        store = Store.from_connection_string(counter.connection_string, prefix).ensure_tables()
        try:
            pipeline, _ = make_pipeline(store, clock)
            table = pipeline.admission.registry.table
            rows = [
                Identity(facts=identity_harness.facts_for(f"vm_{i}"), keys=()) for i in range(count)
            ]
            for start in range(0, count, 100):  # the sync writes batches; so does the test
                for row in rows[start : start + 100]:
                    table.upsert_entity(pipeline.admission.registry._entity(row))
            counter.reset()
            done = run_coverage(pipeline, force=True)
            assert done is not None and done.in_scope == count
            pages = -(-count // PAGE)
            assert done.requests == pages + 1 + 1, counter.by_kind()
            assert sum(counter.by_kind().values()) == done.requests, counter.by_kind()
            counter.reset()
            assert fleet_status(pipeline, False)["coverage"]["no_relay"] == count
            # The status reads the summary row once, whatever the fleet.
            assert counter.by_kind().get("get", 0) <= 4, counter.by_kind()
        finally:
            for t in store.service.list_tables():
                if t.name.startswith(prefix):
                    store.service.delete_table(t.name)
