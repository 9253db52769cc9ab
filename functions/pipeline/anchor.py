"""How the app reaches a VM's relay: Azure's address for it (`callback_url`), and which of
its callback keys the app signs with (issue 46): its anchor first. `relay_of` puts the two
together for a vmId from its identity row (the approver's relays, the drain's hooks).

Any process on a VM, root or not, can get attested documents from IMDS, so a local user can
have the app store a callback key of its own making (functions.identity.registry: such a key
becomes the row's current key, with the relay's proven key, the anchor, kept beside it). A
reimaged VM's new relay looks the same: its old key file, the one that could prove a
rotation, is gone. Signing with the current key would hand that local user the VM's
callbacks whenever it holds the callback port (the relay restarting), and cost every
approval to the real relay a 401 first.

So while the anchor is still the relay's, the app signs with the anchor alone: it is, as
long as the anchor's liveness row (RowKey and signature made with the anchor, contract §5:
nobody without it can write one) was written within RELAY_SILENT_AFTER_SECONDS (600 s by
default, two heartbeats of 300 s: the same bound after which the watchdog calls the relay
silent, so both views agree). Only once the anchor's relay has been silent that long, its
row stale or gone (a reimaged VM, whose new relay heartbeats under its new key), does the
current key come first, the anchor kept as the one retry after a 401.

Cost: nothing in the steady case (the current key is the anchor: no read). A row holding an
unproven key costs each callback lookup one point read of the anchor's liveness row.
Relays without `--heartbeat-table` write no row: for them the anchor is taken as silent,
and callbacks go as before (current key first).
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from functions.approvers.relay import RelayTarget
from functions.clock import Clock
from functions.identity.facts import VmFacts
from functions.identity.keys import CallbackKey
from functions.identity.registry import Identity
from functions.store.liveness import Liveness

log = logging.getLogger(__name__)


def callback_url(facts: VmFacts, port: int) -> str | None:
    """The VM's relay, at the address Azure gives its NIC and the one port the bridge uses:
    never an address a VM wrote."""
    if not facts.address:
        return None
    host = f"[{facts.address}]" if ":" in facts.address else facts.address
    return f"http://{host}:{facts.port or port}"


def relay_of(
    identity: Identity | None,
    port: int,
    liveness: Liveness,
    clock: Clock,
    silent_after: timedelta,
) -> tuple[RelayTarget, Identity] | None:
    """The relay of the VM whose identity row (an attested vmId's) is `identity`, with
    that row: None when Azure's address or an attested key is unknown. A read only for a
    row that holds an unproven key: the anchor's liveness row (`callback_keys`)."""
    if identity is None or not identity.keys:
        return None
    url = callback_url(identity.facts, port)
    if url is None:
        return None
    # The anchor alone while its relay heartbeats (issue 46).
    keys = callback_keys(identity, liveness, clock.now(), silent_after)
    return RelayTarget(url=url, vm_id=identity.facts.vm_id, keys=keys), identity


def callback_keys(
    identity: Identity, liveness: Liveness, now: datetime, silent_after: timedelta
) -> tuple[CallbackKey, ...]:
    """The keys to sign `identity`'s callbacks with, in the order to try them (the next
    only after a 401)."""
    if not identity.unproven_current:
        return identity.keys  # current first: the anchor, or a row of before the anchor
    anchor = identity.anchor_key
    assert anchor is not None  # unproven_current says the row holds it
    seen = liveness.seen_with(identity.vm_id, anchor.secret)
    if seen is not None and now - seen <= silent_after:
        return (anchor,)  # the relay is alive under its anchor: no other key is asked
    log.warning(
        "vmId %s: its anchor key %s has written no liveness row since %s: callbacks signed with "
        "its unproven key %s first (a reimaged VM?)",
        identity.vm_id,
        anchor.key_id,
        seen.isoformat() if seen else "ever",
        identity.keys[0].key_id,
    )
    return identity.keys
