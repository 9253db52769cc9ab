"""The app's side of a rollout: the relays' verified heartbeats (to wait for a new
version) and the rows the app forgets when a VM's relay is removed. Read and written with
the app's own settings, as `python -m functions ledger` does (StateStorage or
AzureWebJobsStorage, APP_SECRET to open the VMs' callback keys)."""

from __future__ import annotations

import contextlib
from typing import Any

from azure.core.exceptions import ResourceNotFoundError

from functions.identity.registry import IdentityStore, partition_of
from functions.pipeline.liveness_verifier import RegistryVerifier
from functions.rollout.targets import Target
from functions.store.liveness import liveness_partition, row_keys_for
from functions.store.state import Store


class AppState:
    """Heartbeats (functions.rollout.run.Heartbeats) and forgetting (AppRows) over the
    app's tables."""

    def __init__(self, store: Store, registry: IdentityStore) -> None:
        self.store = store
        self.registry = registry
        self.verifier = RegistryVerifier(registry)
        self.skipped: list[Any] = []

    @classmethod
    def from_settings(cls, settings: Any) -> AppState:
        secret = settings.app_secret_bytes
        if secret is None:
            raise ValueError("APP_SECRET is not set: the relays' heartbeats cannot be verified")
        store = Store.from_settings(settings)
        registry = IdentityStore.from_service(
            store.service,
            secret,
            settings.state_table_prefix,
            previous=settings.app_secret_previous_bytes,
        )
        return cls(store, registry)

    def latest(self, target: Target) -> tuple[str, int] | None:
        """The VM's verified liveness row: (relay_version, at), or None."""
        hint = self.store.liveness.get(target.vm_id, self.verifier, self.skipped.append)
        return (hint.relay_version, hint.at) if hint else None

    def forget(self, target: Target) -> list[str]:
        """Delete the VM's liveness rows (under each key the app knows, and the row from
        before issue 27), its vms row and its identity (its callback keys): the app no
        longer calls, trusts or counts a relay that is gone. Returns what was deleted."""
        gone = []
        identity = self.registry.get(target.vm_id)
        places = [row_keys_for(k.secret) for k in identity.keys] if identity else []
        places.append((liveness_partition(target.vm_id), target.vm_id))
        if sum(_delete(self.store.liveness.table, pk, rk) for pk, rk in places):
            gone.append("liveness row")
        name = identity.facts.name if identity else target.name
        if self.store.get_vm(name) is not None:
            self.store.delete_vm(name)
            gone.append("vms row")
        if _delete(self.registry.table, partition_of(target.vm_id), target.vm_id):
            gone.append("identity (callback keys)")
        return gone


def _delete(table: Any, partition: str, row: str) -> bool:
    """Delete one row if it is there (the SDK's delete does not say whether it was)."""
    try:
        table.get_entity(partition, row)
    except ResourceNotFoundError:
        return False
    with contextlib.suppress(ResourceNotFoundError):
        table.delete_entity(partition, row)
    return True
