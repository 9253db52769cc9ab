"""The relays' pending-document rows in `{prefix}liveness`: how a relay learns that the app
has a document (contract §11, issue 40).

Service Bus answers a send with no word of what became of the message, and a relay sends a
document only when IMDS changes, so a dead-lettered or dropped "it is over" document was
lost for good: its event stayed Started while the VM kept heartbeating. Now a relay writes
a row before each document (RowKey = HMAC-SHA256(its callback key,
"doc-pending/v1\\n{sequence}"), PartitionKey `akNN`), names the rows in the document
(`acks`), and sends the document again while the row is there (relay/liveness.py
`SplitSender`). The app deletes the rows once the document reached the lifecycle.

The relay may only insert and merge in this table (it cannot read it), and it does not need
to: a Merge Entity with If-Match: * of a deleted row is a 404 ("Merge Entity", Learn), so
the row's absence is the acknowledgement. Only the app can delete. A row's key needs the
VM's key, so no other VM can find it, and every relay writes only its own.

Cost: one Table request (a delete) per sequence a document names, almost always one: the
documents of relays before this name none and cost nothing. Never raises: a delete that
fails leaves the row, so the relay sends the document again and the app deletes it then.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
from collections.abc import Iterable

from azure.core.exceptions import AzureError, ResourceNotFoundError
from azure.data.tables import TableClient

log = logging.getLogger(__name__)

PENDING_LABEL = b"doc-pending/v1\n"
BUCKETS = 8
MAX_ACKS = 8  # the relay names at most this many (its latest document and 7 before it)


def pending_row_keys(secret: bytes, sequence: int) -> tuple[str, str]:
    """(PartitionKey, RowKey) of the row saying document `sequence` awaits the app."""
    row = hmac.new(secret, PENDING_LABEL + str(sequence).encode(), hashlib.sha256).hexdigest()
    return f"ak{int(row[:8], 16) % BUCKETS:02d}", row


def acknowledge(table: TableClient, secret: bytes, sequences: Iterable[int]) -> int:
    """Delete the pending rows of `sequences` (at most MAX_ACKS); the requests made."""
    requests = 0
    for sequence in list(sequences)[:MAX_ACKS]:
        requests += 1
        try:
            table.delete_entity(*pending_row_keys(secret, sequence))
        except ResourceNotFoundError:
            pass  # acknowledged before (a redelivery), or the relay's write failed
        except AzureError as exc:
            log.warning("could not acknowledge document %d: %s", sequence, exc)
    return requests
