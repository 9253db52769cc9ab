"""Progress of each drain workflow in the `{prefix}drains` table, one row per step.

A step is claimed by inserting its row (the Table service lets exactly one insert win)
and finished by an ETag-conditional replace, so two invocations of the terminate function
(a redelivery while the first still runs, or two hosts) never run the same step twice,
and a restarted function skips every step already finished.

PartitionKey = EventId, RowKey = step name ("announce:drain_started", "http",
"hook:<vm>", "announce:drain_failed", "approve").
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import AwareDatetime, BaseModel

from functions.store.keys import table_key
from functions.store.leased import LeasedTable

StepStatus = Literal["running", "succeeded", "failed"]


class StepRecord(BaseModel):
    step: str
    status: StepStatus
    owner: str
    started_at: AwareDatetime
    lease_until: AwareDatetime  # a running step whose lease passed has lost its runner
    finished_at: AwareDatetime | None = None
    detail: str = ""
    # Whether the step's receiver may have acted on it (an undo then has something to
    # undo): True; certainly not (never delivered, refused, nothing to undo): False; None:
    # not known (a row written before this field, a runner lost mid-step).
    reached: bool | None = None
    etag: str | None = None

    @property
    def done(self) -> bool:
        return self.status != "running"


class DrainStore(LeasedTable[StepRecord]):
    TABLE = "drains"
    MODEL = StepRecord

    @staticmethod
    def _entity(event_id: str, record: StepRecord) -> dict[str, object]:
        data = record.model_dump(mode="json", exclude={"etag"})
        return {"PartitionKey": table_key(event_id), "RowKey": table_key(record.step), **data}

    def get(self, event_id: str, step: str) -> StepRecord | None:
        return self._get(event_id, step)

    def steps(self, event_id: str) -> dict[str, StepRecord]:
        return {record.step: record for record in self._partition(event_id)}

    def claim(self, event_id: str, record: StepRecord) -> bool:
        """Insert the running step; False if another invocation already has a row for it."""
        return self._insert(self._entity(event_id, record), record)

    def replace(self, event_id: str, record: StepRecord) -> bool:
        """Write `record` only if its row is unchanged since read; False if it changed."""
        return self._replace(self._entity(event_id, record), record)

    def take_over(
        self, event_id: str, stale: StepRecord, owner: str, now: datetime, lease_until: datetime
    ) -> StepRecord | None:
        """Re-claim a running step whose runner's lease expired (ETag-conditional)."""
        fresh = stale.model_copy(
            update={"owner": owner, "started_at": now, "lease_until": lease_until, "detail": ""}
        )
        return fresh if self.replace(event_id, fresh) else None
