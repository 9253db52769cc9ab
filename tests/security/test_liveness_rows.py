"""Liveness rows no relay can forge, find or bloat for another VM (issue 27).

The attacker holds the relay's table right (Insert and Merge on `{prefix}liveness`, the
SAS the demo's relays use) and knows the victim's vmId. The victim's relay writes its
heartbeats with the real relay code (relay.liveness.TableLiveness and its own key file).
"""

from __future__ import annotations

import hashlib
import json
import secrets
import uuid
from datetime import UTC, datetime, timedelta

import requests
from azure.core.credentials import AzureSasCredential
from azure.data.tables import EdmType, EntityProperty, TableClient, UpdateMode

from functions.identity.keys import liveness_signature
from functions.identity.registry import IdentityStore
from functions.pipeline.context import Pipeline
from functions.pipeline.liveness_verifier import RegistryVerifier
from functions.pipeline.watchdog import run_watchdog
from functions.store.liveness import SWEEP_REQUESTS, liveness_partition, row_keys_for
from functions.store.state import Store
from local.azurite import table_sas, table_url
from relay.liveness import TableLiveness
from relay.models import parse_envelope
from tests.security.conftest import APP_SECRET, Fleet, Vm
from tests.security.test_state import Later
from tests.tablecount import TableCounter

SWEEP_LIMIT = 30  # the bound on one sweep's Table requests at any fleet size


def heartbeat_row_of(fleet: Fleet, vm: Vm, azurite: str) -> None:
    """`vm`'s relay writes one heartbeat, as relays do (its key, the relay's SAS)."""
    table = f"{fleet.store.prefix}liveness"
    url = table_url(azurite, table)
    text = json.dumps(
        {
            "schema": 1,
            "kind": "heartbeat",
            "vm": {"name": vm.name, "vm_id": vm.vm_id},
            "relay_version": "security-suite",
            "sequence": 1,
            "observed_at": datetime.now(UTC).isoformat(),
        }
    )
    TableLiveness(url, sas=table_sas(table), keys=vm.keys).write(parse_envelope(text))


def attacker_table(fleet: Fleet) -> TableClient:
    table = f"{fleet.store.prefix}liveness"
    return TableClient(
        fleet.store.service.url, table, credential=AzureSasCredential(table_sas(table))
    )


def forged(vm_id: str, key: bytes, at: datetime, row: str | None = None) -> dict:
    """A well-formed row the attacker signs with its own key, at RowKey `row` (v2 layout)
    or at the vmId (the layout before issue 27)."""
    unix = int(at.timestamp())
    kid = hashlib.sha256(key).hexdigest()[:16]
    keys = (f"lv{int(row[:8], 16) % 8:02d}", row) if row else (liveness_partition(vm_id), vm_id)
    return {
        "PartitionKey": keys[0],
        "RowKey": keys[1],
        **({"vm_id": vm_id} if row else {}),
        "seen": datetime.fromtimestamp(unix, UTC),
        "at": EntityProperty(unix, EdmType.INT64),
        "relay_version": "x",
        "key_id": kid,
        "sig": liveness_signature(key, vm_id, unix, "x"),
    }


def silent(fleet: Fleet) -> list[str]:
    return [n.vm for n in fleet.publisher.published if n.transition == "relay_silent"]


def test_a_forger_cannot_find_or_overwrite_a_dead_relays_row(fleet: Fleet, azurite: str):
    attacker, victim = fleet.vms["attacker"], fleet.vms["victim"]
    for vm in (attacker, victim):
        fleet.deliver(vm.message([]))
    heartbeat_row_of(fleet, victim, azurite)  # its last heartbeat; then the victim dies
    heartbeat_row_of(fleet, attacker, azurite)
    # The attacker writes over every row it can name for the victim: the vmId-keyed row,
    # kept fresh with its own key, and one dated a year ahead.
    writer = attacker_table(fleet)
    mine = attacker.keys.current_key().secret
    later = datetime.now(UTC) + timedelta(hours=2)
    writer.upsert_entity(forged(victim.vm_id, mine, later), mode=UpdateMode.MERGE)
    ahead = secrets.token_hex(32)
    writer.upsert_entity(forged(victim.vm_id, mine, later + timedelta(days=365), ahead))
    heartbeat_row_of(fleet, attacker, azurite)  # (its own relay stays alive: written "2 h later")

    fleet.pipeline.clock = Later(hours=2)
    keep_alive(fleet, attacker)
    report = run_watchdog(fleet.pipeline)

    assert "victim" in report.silent, report
    assert "victim" in silent(fleet)
    assert "attacker" not in silent(fleet)
    left = {row["RowKey"] for row in fleet.store.liveness.table.list_entities()}
    victims_row = row_keys_for(victim.keys.current_key().secret)[1]
    assert victims_row in left and ahead not in left  # the forged rows were deleted


def keep_alive(fleet: Fleet, vm: Vm) -> None:
    """`vm`'s relay heartbeats at the app's (moved) clock: its row stays fresh."""
    keep_alive_at(fleet.store, vm, fleet.pipeline.clock.now())


def test_junk_rows_cost_a_bounded_sweep_and_are_deleted(fleet: Fleet, azurite: str):
    """3,000 well-formed rows for vmIds nobody enrolled, signed with the attacker's key:
    each sweep stays within 30 Table requests, the junk is deleted as it is seen, and the
    victim's real silence is announced."""
    attacker, victim = fleet.vms["attacker"], fleet.vms["victim"]
    for vm in (attacker, victim):
        fleet.deliver(vm.message([]))
    heartbeat_row_of(fleet, victim, azurite)
    mine = attacker.keys.current_key().secret
    old = datetime.now(UTC) - timedelta(hours=1)
    rows = [forged(str(uuid.uuid4()), mine, old, secrets.token_hex(32)) for _ in range(3000)]
    # (Written in batches with the app's credential for speed: the attacker's SAS writes
    # the same rows one by one, as the first test shows.)
    writer = fleet.store.liveness.table
    by_partition: dict[str, list[dict]] = {}
    for row in rows:
        by_partition.setdefault(row["PartitionKey"], []).append(row)
    for chunk in by_partition.values():
        for start in range(0, len(chunk), 100):
            writer.submit_transaction([("upsert", r) for r in chunk[start : start + 100]])

    with TableCounter(azurite) as counter:
        counted = Store.from_connection_string(counter.connection_string, fleet.store.prefix)
        registry = IdentityStore.from_service(counted.service, APP_SECRET, counted.prefix)
        pipeline = Pipeline(
            counted,
            fleet.pipeline.settings,
            fleet.publisher,
            requests.Session(),
            Later(hours=2),
            admission=fleet.pipeline.admission,
            liveness_verifier=RegistryVerifier(registry),
        )
        keep_alive_at(counted, attacker, pipeline.clock.now())
        costs, liveness, left = [], [], []
        for _ in range(6):
            counter.reset()
            run_watchdog(pipeline)
            costs.append(counter.total())
            # The junk's share: liveness pages, identities reads, batch deletes (the only
            # batches of these sweeps).
            liveness.append(
                sum(
                    n
                    for (kind, table), n in counter.counts().items()
                    if table.endswith(("liveness", "identities")) or kind == "batch"
                )
            )
            left.append(sum(1 for _ in counted.liveness.table.list_entities()))
    assert max(liveness) <= SWEEP_REQUESTS, liveness
    # The sweeps after the first (which also announces the victim's silence: its VM row
    # reads and writes) within the bound, whatever the table holds.
    assert max(costs[1:]) <= SWEEP_LIMIT, costs
    assert left[0] < 3000 and left == sorted(left, reverse=True), left
    assert left[-1] == 2, left  # the two genuine rows
    assert silent(fleet) == ["victim"]
    assert SWEEP_REQUESTS < SWEEP_LIMIT


def keep_alive_at(store: Store, vm: Vm, now: datetime) -> None:
    secret = vm.keys.current_key().secret
    pk, rk = row_keys_for(secret)
    unix = int(now.timestamp())
    store.liveness.table.upsert_entity(
        {
            "PartitionKey": pk,
            "RowKey": rk,
            "vm_id": vm.vm_id,
            "seen": datetime.fromtimestamp(unix, UTC),
            "at": EntityProperty(unix, EdmType.INT64),
            "relay_version": "security-suite",
            "key_id": vm.keys.current_key().id,
            "sig": liveness_signature(secret, vm.vm_id, unix, "security-suite"),
        },
        mode=UpdateMode.MERGE,
    )
