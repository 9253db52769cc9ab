"""The app's side of a rollout, against Azurite: a relay's verified heartbeat is what a
batch waits for, and removing a VM's relay makes the app forget it (issue 44: removal did
not exist; the app kept calling, trusting and counting a VM whose relay was gone)."""

from __future__ import annotations

from datetime import UTC, datetime

from azure.data.tables import EdmType, EntityProperty

from functions.identity.facts import VmFacts
from functions.identity.keys import (
    CallbackKey,
    key_id_of,
    liveness_signature,  # a contract-1 row (still read)
)
from functions.identity.registry import Identity, IdentityStore
from functions.rollout.app import AppState
from functions.rollout.targets import Target
from functions.store.state import Store
from relay.liveness import liveness_row_keys

VM_ID = "12345678-1234-1234-1234-1234567890ab"
SECRET = b"k" * 32


def _state(azurite: str, prefix: str) -> AppState:
    store = Store.from_connection_string(azurite, prefix).ensure_tables()
    registry = IdentityStore.from_service(store.service, b"a" * 32, prefix).ensure_table()
    store.liveness.ensure()
    return AppState(store, registry)


def _target() -> Target:
    return Target(
        id="/subscriptions/s/resourceGroups/rg/providers/Microsoft.Compute/virtualMachines/web-1",
        name="web-1",
        vm_id=VM_ID,
        location="westeurope",
        subscription="s",
        resource_group="rg",
    )


def test_a_heartbeat_is_read_verified_and_removal_forgets_every_row(azurite) -> None:
    state = _state(azurite, "rollout1")
    facts = VmFacts(
        vm_id=VM_ID,
        name="web-1",
        resource_id=_target().id,
        subscription_id="s",
        resource_group="rg",
        fetched_at=datetime.now(UTC),
    )
    key = CallbackKey(key_id=key_id_of(SECRET), secret=SECRET)
    state.registry.save(Identity(facts=facts, keys=(key,)))
    at = int(datetime.now(UTC).timestamp())
    pk, rk = liveness_row_keys(SECRET)
    state.store.liveness.table.upsert_entity(
        {
            "PartitionKey": pk,
            "RowKey": rk,
            "vm_id": VM_ID,
            "seen": datetime.fromtimestamp(at, UTC),
            "at": EntityProperty(at, EdmType.INT64),
            "relay_version": "0.2.0",
            "key_id": key.key_id,
            "sig": liveness_signature(SECRET, VM_ID, at, "0.2.0"),
        }
    )
    state.store.heard([("web-1", datetime.now(UTC), None, "0.2.0")])
    assert state.latest(_target()) == ("0.2.0", at), state.skipped
    gone = state.forget(_target())
    assert gone == ["liveness row", "vms row", "identity (callback keys)"]
    assert state.latest(_target()) is None
    assert state.store.get_vm("web-1") is None
    assert state.registry.get(VM_ID) is None
    assert state.forget(_target()) == []  # again: nothing left, nothing claimed


def test_a_row_not_signed_by_the_vms_key_is_no_heartbeat(azurite) -> None:
    state = _state(azurite, "rollout2")
    pk, rk = liveness_row_keys(SECRET)
    at = int(datetime.now(UTC).timestamp())
    state.store.liveness.table.upsert_entity(
        {
            "PartitionKey": pk,
            "RowKey": rk,
            "vm_id": VM_ID,
            "seen": datetime.fromtimestamp(at, UTC),
            "at": EntityProperty(at, EdmType.INT64),
            "relay_version": "9.9.9",
            "key_id": key_id_of(SECRET),
            "sig": liveness_signature(b"x" * 32, VM_ID, at, "9.9.9"),
        }
    )
    assert state.latest(_target()) is None  # not enrolled, not signed by its key
