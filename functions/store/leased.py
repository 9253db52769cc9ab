"""A table of claim rows: one pydantic record per row, claimed by a conditional insert and
changed only by ETag-conditional replaces.

The drain steps (`drains`) and the channel deliveries (`deliveries`) both keep "who is
doing this, until when" rows this way; only their keys and columns differ, so the Table
mechanics live here once and each store says how a record becomes an entity.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any, ClassVar, Generic, Self, TypeVar

from azure.core import MatchConditions
from azure.core.exceptions import (
    ResourceExistsError,
    ResourceModifiedError,
    ResourceNotFoundError,
)
from azure.data.tables import TableClient, TableServiceClient, UpdateMode
from pydantic import BaseModel

from functions.store.http import NO_ECHO
from functions.store.keys import table_key

R = TypeVar("R", bound=BaseModel)


class LeasedTable(Generic[R]):
    """Subclasses set TABLE (the name after the prefix) and MODEL (the record, which has an
    `etag` field excluded from the row)."""

    TABLE: ClassVar[str]
    MODEL: ClassVar[type[BaseModel]]

    def __init__(self, table: TableClient) -> None:
        self.table = table

    @classmethod
    def from_service(cls, service: TableServiceClient, prefix: str = "sebridge") -> Self:
        return cls(service.get_table_client(f"{prefix}{cls.TABLE}"))

    @classmethod
    def from_connection_string(cls, connection: str, prefix: str = "sebridge") -> Self:
        return cls.from_service(TableServiceClient.from_connection_string(connection), prefix)

    def ensure_table(self) -> Self:
        with contextlib.suppress(ResourceExistsError):
            self.table.create_table()
        return self

    def _load(self, entity: Mapping[str, Any]) -> R:
        fields = {key: value for key, value in entity.items() if key in self.MODEL.model_fields}
        record = self.MODEL.model_validate(fields)
        record.etag = entity.metadata.get("etag")  # type: ignore[attr-defined]
        return record  # type: ignore[return-value]

    def _get(self, partition: str, row: str) -> R | None:
        try:
            entity = self.table.get_entity(table_key(partition), table_key(row))
        except ResourceNotFoundError:
            return None
        return self._load(entity)

    def _partition(self, partition: str) -> list[R]:
        entities = self.table.query_entities(
            "PartitionKey eq @pk", parameters={"pk": table_key(partition)}
        )
        return [self._load(entity) for entity in entities]

    def _insert(self, entity: dict[str, object], record: R) -> bool:
        """Conditional insert; False if the row exists (another caller claimed it)."""
        try:
            meta = self.table.create_entity(entity, **NO_ECHO)
        except ResourceExistsError:
            return False
        record.etag = meta.get("etag")  # type: ignore[attr-defined]
        return True

    def _replace(self, entity: dict[str, object], record: R) -> bool:
        """Write only if the row is unchanged since `record` was read; False if it changed."""
        try:
            meta = self.table.update_entity(
                entity,
                mode=UpdateMode.REPLACE,
                etag=record.etag,  # type: ignore[attr-defined]
                match_condition=MatchConditions.IfNotModified,
            )
        except (ResourceModifiedError, ResourceNotFoundError):
            return False
        record.etag = meta.get("etag")  # type: ignore[attr-defined]
        return True
