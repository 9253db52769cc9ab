"""Progress of each drain workflow in the `{prefix}drains` table, one row per step.

A step is claimed by inserting its row (the Table service lets exactly one insert win)
and finished by an ETag-conditional replace, so two invocations of the terminate function
(a redelivery while the first still runs, or two hosts) never run the same step twice,
and a restarted function skips every step already finished.

PartitionKey = EventId, RowKey = step name ("announce:drain_started", "http",
"hook:<vm>", "announce:drain_failed", "approve").
"""

from __future__ import annotations

import contextlib
from datetime import datetime
from typing import Literal

from azure.core import MatchConditions
from azure.core.exceptions import (
    ResourceExistsError,
    ResourceModifiedError,
    ResourceNotFoundError,
)
from azure.data.tables import TableClient, TableServiceClient, UpdateMode
from pydantic import AwareDatetime, BaseModel

from functions.store.keys import table_key

StepStatus = Literal["running", "succeeded", "failed"]


class StepRecord(BaseModel):
    step: str
    status: StepStatus
    owner: str
    started_at: AwareDatetime
    lease_until: AwareDatetime  # a running step whose lease passed has lost its runner
    finished_at: AwareDatetime | None = None
    detail: str = ""
    etag: str | None = None

    @property
    def done(self) -> bool:
        return self.status != "running"


class DrainStore:
    def __init__(self, table: TableClient) -> None:
        self.table = table

    @classmethod
    def from_service(cls, service: TableServiceClient, prefix: str = "sebridge") -> DrainStore:
        return cls(service.get_table_client(f"{prefix}drains"))

    @classmethod
    def from_connection_string(cls, connection: str, prefix: str = "sebridge") -> DrainStore:
        return cls.from_service(TableServiceClient.from_connection_string(connection), prefix)

    def ensure_table(self) -> DrainStore:
        with contextlib.suppress(ResourceExistsError):
            self.table.create_table()
        return self

    @staticmethod
    def _entity(event_id: str, record: StepRecord) -> dict[str, object]:
        data = record.model_dump(mode="json", exclude={"etag"})
        return {"PartitionKey": table_key(event_id), "RowKey": table_key(record.step), **data}

    @staticmethod
    def _load(entity: dict[str, object]) -> StepRecord:
        fields = {key: value for key, value in entity.items() if key in StepRecord.model_fields}
        record = StepRecord.model_validate(fields)
        record.etag = entity.metadata.get("etag")  # type: ignore[attr-defined]
        return record

    def get(self, event_id: str, step: str) -> StepRecord | None:
        try:
            entity = self.table.get_entity(table_key(event_id), table_key(step))
        except ResourceNotFoundError:
            return None
        return self._load(entity)

    def steps(self, event_id: str) -> dict[str, StepRecord]:
        query = "PartitionKey eq @pk"
        entities = self.table.query_entities(query, parameters={"pk": table_key(event_id)})
        return {record.step: record for record in map(self._load, entities)}

    def claim(self, event_id: str, record: StepRecord) -> bool:
        """Insert the running step; False if another invocation already has a row for it."""
        try:
            meta = self.table.create_entity(self._entity(event_id, record))
        except ResourceExistsError:
            return False
        record.etag = meta.get("etag")
        return True

    def replace(self, event_id: str, record: StepRecord) -> bool:
        """Write `record` only if its row is unchanged since read; False if it changed."""
        try:
            meta = self.table.update_entity(
                self._entity(event_id, record),
                mode=UpdateMode.REPLACE,
                etag=record.etag,
                match_condition=MatchConditions.IfNotModified,
            )
        except (ResourceModifiedError, ResourceNotFoundError):
            return False
        record.etag = meta.get("etag")
        return True

    def take_over(
        self, event_id: str, stale: StepRecord, owner: str, now: datetime, lease_until: datetime
    ) -> StepRecord | None:
        """Re-claim a running step whose runner's lease expired (ETag-conditional)."""
        fresh = stale.model_copy(
            update={"owner": owner, "started_at": now, "lease_until": lease_until, "detail": ""}
        )
        return fresh if self.replace(event_id, fresh) else None
