"""The liveness verifier over the identities table (functions.store.liveness.Verifier).

A relay's liveness row counts only when the VM it names is enrolled and the row was made
with a callback key that VM's relay gave the app in an attested message
(functions.identity.registry): the app's word on a VM, never the row's. The VM's anchor key
comes first: a key a local user enrolled does not speak for the VM while the anchor's relay
heartbeats.
"""

from __future__ import annotations

from collections.abc import Iterator

from functions.identity.registry import Identity, IdentityStore
from functions.store.liveness import PAGE_SIZE, Entry


class RegistryVerifier:
    """`lookup` is one point read of the identities table; `pages` lists it, a page of up
    to 1,000 VMs a request (the watchdog's choice when many rows need checking)."""

    def __init__(self, registry: IdentityStore) -> None:
        self.registry = registry

    def lookup(self, vm_id: str) -> Entry | None:
        return _entry(self.registry.get(vm_id))

    def pages(self) -> Iterator[tuple[dict[str, Entry], bool]]:
        listing = self.registry.table.list_entities(
            select=["PartitionKey", "RowKey", "data", "keys"], results_per_page=PAGE_SIZE
        ).by_page()
        for page in listing:
            found: dict[str, Entry] = {}
            for row in page:
                try:
                    entry = _entry(self.registry._load(row))  # the row as `get` reads it
                except (ValueError, KeyError):  # an unreadable row vouches for nothing
                    continue
                if entry is not None:
                    found[str(row["RowKey"])] = entry
            # The page's continuation token says whether another request would find more.
            more = getattr(listing, "continuation_token", None) is not None
            yield found, more
            if not more:
                return


def _entry(identity: Identity | None) -> Entry | None:
    """The VM's name and keys, its anchor first (Identity.anchored_keys): the anchor's row
    is the VM's own, a row of a key no proof brought is read only once the anchor's has
    gone silent (Liveness.get), and in the watchdog's sweep it is a previous key's row,
    superseded while the anchor's is fresh (issue 46)."""
    if identity is None or not identity.keys:
        return None
    return identity.facts.name, tuple(key.secret for key in identity.anchored_keys)
