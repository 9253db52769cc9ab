"""What each channel did with each announcement, in the `{prefix}deliveries` table.

Service Bus delivers at least once: a crash (or a lost lock) between a successful post and
the completion of the message redelivers it, and the channel would post the Teams card or
the webhook again. So before posting, a channel claims the announcement with a conditional
insert (exactly one insert wins), and marks it `posted` with an ETag-conditional replace
right after the receiver accepted it; a redelivery that finds `posted` completes without
posting. A permanent failure (the receiver's 4xx, an invalid message, a half-configured
channel) is recorded as `rejected` with the reason and the message is completed: the
Python Service Bus binding cannot dead-letter, and retrying cannot help.

What stays at least once: a crash after the receiver accepted the post and before the
`posted` write leaves a `claimed` row; once its lease passes (the longest one invocation
can keep posting, see `RetryPolicy.longest_seconds`) a redelivery takes it over and posts
again. The window is one HTTP answer plus one Table write; webhook receivers can dedupe on
`webhook-id`, PagerDuty on its `dedup_key`.

PartitionKey = the announcement's MessageId (escaped), RowKey = channel.
"""

from __future__ import annotations

import contextlib
from datetime import datetime
from typing import Literal

from azure.core import MatchConditions
from azure.core.exceptions import (
    ResourceModifiedError,
    ResourceNotFoundError,
)
from pydantic import AwareDatetime, BaseModel

from functions.store.keys import table_key
from functions.store.leased import LeasedTable
from functions.store.rows import utf16_prefix

DeliveryStatus = Literal["claimed", "posted", "rejected"]
MARK = "mark"  # RowKey of a channel's mark on a key (PagerDuty: a key it paged)
DETAIL_LIMIT = 4000


class DeliveryRecord(BaseModel):
    message_id: str
    channel: str
    status: DeliveryStatus
    owner: str
    claimed_at: AwareDatetime
    lease_until: AwareDatetime  # a claim whose lease passed has lost its poster
    finished_at: AwareDatetime | None = None
    claims: int = 1  # how many invocations claimed it (more than one: a taken-over claim)
    detail: str = ""
    etag: str | None = None

    @property
    def final(self) -> bool:
        return self.status != "claimed"


class DeliveryLedger(LeasedTable[DeliveryRecord]):
    TABLE = "deliveries"
    MODEL = DeliveryRecord

    @staticmethod
    def _entity(record: DeliveryRecord) -> dict[str, object]:
        data = record.model_dump(mode="json", exclude={"etag"})
        data["detail"] = utf16_prefix(record.detail, DETAIL_LIMIT)
        data["message_id"] = utf16_prefix(record.message_id, 512)
        return {
            "PartitionKey": table_key(record.message_id),
            "RowKey": table_key(record.channel),
            **data,
        }

    def get(self, message_id: str, channel: str) -> DeliveryRecord | None:
        return self._get(message_id, channel)

    def rows(self, message_id: str) -> dict[str, DeliveryRecord]:
        return {record.channel: record for record in self._partition(message_id)}

    def insert(self, record: DeliveryRecord) -> bool:
        """Conditional insert; False if a row for this announcement and channel exists."""
        return self._insert(self._entity(record), record)

    def replace(self, record: DeliveryRecord) -> bool:
        """Write `record` only if its row is unchanged since read; False if it changed."""
        return self._replace(self._entity(record), record)

    def release(self, record: DeliveryRecord) -> None:
        """Drop our claim after a retryable failure, so the redelivery claims afresh at once
        (if this fails too, the claim simply goes stale after its lease)."""
        with contextlib.suppress(ResourceModifiedError, ResourceNotFoundError):
            self.table.delete_entity(
                table_key(record.message_id),
                table_key(record.channel),
                etag=record.etag,
                match_condition=MatchConditions.IfNotModified,
            )

    # Marks (functions.notify.delivery.Marks): one row each, RowKey MARK, in the key's own
    # partition. Channel rows are named for their channel, so no announcement's row is one.
    def mark(self, key: str) -> None:
        self.table.upsert_entity({"PartitionKey": table_key(key), "RowKey": MARK, "key": key})

    def marked(self, key: str) -> bool:
        try:
            self.table.get_entity(table_key(key), MARK, select=["RowKey"])
        except ResourceNotFoundError:
            return False
        return True

    def take_over(
        self, stale: DeliveryRecord, owner: str, now: datetime, lease_until: datetime
    ) -> DeliveryRecord | None:
        fresh = stale.model_copy(
            update={
                "owner": owner,
                "claimed_at": now,
                "lease_until": lease_until,
                "claims": stale.claims + 1,
            }
        )
        return fresh if self.replace(fresh) else None
