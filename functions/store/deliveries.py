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

A post a channel could not deliver within its Service Bus deliveries (the channel was down
for longer) is `kept` (issue 40): its delivery row says so, and the notification itself is
a row of the channel's kept partition (`kept:<channel>`, RowKey = when it happened, when
it was kept, its MessageId: one query reads them oldest first), until functions.notify.kept sends it
or finds it no longer worth sending.
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
from azure.data.tables import UpdateMode
from pydantic import AwareDatetime, BaseModel

from functions.store.keys import table_key
from functions.store.leased import LeasedTable
from functions.store.rows import utf16_prefix

DeliveryStatus = Literal["claimed", "posted", "rejected", "kept"]
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


KEPT = "kept:"  # + channel: the partition of the posts a channel keeps (no MessageId is one)
# A body must fit one string property (64 KiB, UTF-16): a notification is a few KiB.
KEPT_BODY_LIMIT = 32_000


class KeptPost(BaseModel):
    """A notification a channel keeps to send when it is back (functions.notify.kept)."""

    channel: str
    message_id: str
    occurred_at: AwareDatetime
    kept_at: AwareDatetime
    body: str  # the notification's JSON
    reason: str = ""  # why the last delivery failed
    key: str = ""  # PagerDuty: the incident's dedup_key (a trigger and its resolve)
    ends: bool = False  # an end (completed, cancelled, recovered, ...): last among equals

    @property
    def row_key(self) -> str:
        """Oldest first: when it happened (an end after anything else stamped alike, so a
        resolve never goes before its trigger), when it was kept, then its id."""
        stamp = "%Y-%m-%dT%H:%M:%S.%fZ"
        return (
            f"{self.occurred_at.strftime(stamp)}|{int(self.ends)}|"
            f"{self.kept_at.strftime(stamp)}|{self.message_id}"
        )


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

    def keep(self, post: KeptPost) -> bool:
        """Keep a post for later (Insert Or Replace: a retry writes the same row); False
        when its body is too large for a row (then it cannot be kept)."""
        if len(post.body.encode("utf-16-le", "surrogatepass")) // 2 > KEPT_BODY_LIMIT:
            return False
        entity = {
            "PartitionKey": table_key(KEPT + post.channel),
            "RowKey": table_key(post.row_key),
            **post.model_dump(mode="json"),
            "reason": utf16_prefix(post.reason, DETAIL_LIMIT),
        }
        self.table.upsert_entity(entity, mode=UpdateMode.REPLACE)
        return True

    def kept(self, channel: str) -> list[KeptPost]:
        """The channel's kept posts, oldest first (one partition query)."""
        entities = self.table.query_entities(
            "PartitionKey eq @pk", parameters={"pk": table_key(KEPT + channel)}
        )
        posts = [
            KeptPost.model_validate({k: v for k, v in e.items() if k in KeptPost.model_fields})
            for e in entities
        ]
        return sorted(posts, key=lambda post: post.row_key)

    def drop_kept(self, post: KeptPost) -> None:
        """Forget a kept post (sent, or no longer worth sending); gone already is fine."""
        with contextlib.suppress(ResourceNotFoundError):
            self.table.delete_entity(table_key(KEPT + post.channel), table_key(post.row_key))

    def unmark(self, key: str) -> None:
        with contextlib.suppress(ResourceNotFoundError):
            self.table.delete_entity(table_key(key), MARK)

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
