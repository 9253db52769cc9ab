"""Tell a relay the app has its document: delete the pending rows it names (contract §11).

Called by ingest once a document reached the lifecycle (processed, or a redelivery of one
already processed) or was refused for good (a row Table storage refuses); not for one
refused as over a per-VM bound, or as from a clock too far ahead or with a NotBefore too
far out, which time heals: the relay sends it again and it may pass then
(functions/store/acks.py says why and what it costs). The key is the one the admitted
message carries: its attestation vouches for it, so a VM can only ever acknowledge its own
rows.
"""

from __future__ import annotations

from functions.model.envelope import Envelope
from functions.pipeline.context import Pipeline
from functions.store.acks import acknowledge


def acknowledge_document(pipeline: Pipeline, envelope: Envelope) -> int:
    """The Table requests it took (0 for a relay that asks for none)."""
    if not envelope.acks or envelope.callback_key is None:
        return 0
    secret = bytes.fromhex(envelope.callback_key.secret)
    return acknowledge(pipeline.store.liveness.table, secret, envelope.acks)
