"""Where Azure places each VM, by its name, and how many VMs each budget group holds:
what the lifecycle reads to enforce disruption budgets (functions.model.budgets).

Both are rows of the identities table, which only the function app writes (relays have no
role on it), and only the identity sync (functions.identity.sync) writes these, from
Resource Graph: everything here is Azure's word, nothing a VM said.

- A placement row per VM: PartitionKey `pl0`..`pl7` (a hash of the VM's name key), RowKey
  `<name key>|<vmId>`. Azure's VM names repeat across resource groups, so each VM has a
  row of its own under its name's prefix; `for_name` reads them all with one
  single-partition range query, at most MAX_SAME_NAME rows. `data` is the Placement's
  JSON (tags included, bounded by VmFacts), `fetched_at` when the sync wrote it: a row the
  last pass did not refresh (a deleted VM) is read as gone and swept away.
- A size row per budget group: PartitionKey `size|<budget>`, RowKey the group's key,
  `size` the VMs Azure lists in the group (as the budget's match narrows them), written
  when a sync pass ends; `size(budget, group)` is one point read.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta
from typing import Any

from azure.core.exceptions import ResourceNotFoundError
from azure.data.tables import TableClient, UpdateMode
from pydantic import ValidationError

from functions.model.budgets import Placement
from functions.store.keys import row_key, table_key

log = logging.getLogger(__name__)

BUCKETS = 8
PLACEMENT = "pl"  # placement partitions pl0..pl7
SIZES = "size|"  # size partitions: size|<budget>
MAX_SAME_NAME = 16  # VMs of one name read for a budget check (names repeat across groups)
BATCH = 100  # operations per entity group transaction


def placement_partition(name: str) -> str:
    digest = hashlib.sha256(row_key(name).encode("utf-8", "surrogatepass")).digest()
    return f"{PLACEMENT}{int.from_bytes(digest[:4], 'big') % BUCKETS}"


def placement_row(placement: Placement) -> str:
    return f"{row_key(placement.name)}|{placement.vm_id or ''}"


def size_partition(budget: str) -> str:
    return SIZES + table_key(budget, fold=True)


class Placements:
    """Reads and writes of placement and size rows through the identities TableClient."""

    def __init__(self, table: TableClient) -> None:
        self.table = table

    # ------------------------------------------------------------------ placements

    def put(self, placements: Iterable[Placement], pool: ThreadPoolExecutor | None = None) -> int:
        """Write every placement (the whole row: it is the sync's alone), 100 per entity
        group transaction, the partitions in parallel when a `pool` is given. Returns the
        requests made."""
        by_partition: dict[str, list[dict[str, Any]]] = {}
        for placement in placements:
            entity = {
                "PartitionKey": placement_partition(placement.name),
                "RowKey": placement_row(placement),
                "data": placement.model_dump_json(),
                "name": placement.name.casefold(),
                "fetched_at": placement.fetched_at,
            }
            by_partition.setdefault(placement_partition(placement.name), []).append(entity)

        def write(entities: list[dict[str, Any]]) -> int:
            made = 0
            for start in range(0, len(entities), BATCH):
                chunk = entities[start : start + BATCH]
                self.table.submit_transaction(
                    [("upsert", e, {"mode": UpdateMode.REPLACE}) for e in chunk]
                )
                made += 1
            return made

        parts = list(by_partition.values())
        return sum(pool.map(write, parts) if pool is not None else map(write, parts))

    def for_name(
        self, name: str, now: datetime | None = None, max_age: timedelta | None = None
    ) -> list[Placement]:
        """Azure's placements of the VMs named `name` (usually one): one range query in one
        partition. Rows older than `max_age` at `now` (a VM the sync no longer lists) and
        rows that cannot be read are left out, logged."""
        key = row_key(name)
        query = self.table.query_entities(
            "PartitionKey eq @pk and RowKey gt @low and RowKey lt @high",
            parameters={"pk": placement_partition(name), "low": f"{key}|", "high": f"{key}}}"},
            results_per_page=MAX_SAME_NAME + 1,
        )
        rows = list(itertools.islice(query, MAX_SAME_NAME + 1))
        if len(rows) > MAX_SAME_NAME:
            log.warning(
                "placements: more than %d VMs named %r; budgets count the first %d",
                MAX_SAME_NAME,
                name[:80],
                MAX_SAME_NAME,
            )
        found = []
        for row in rows[:MAX_SAME_NAME]:
            try:
                placement = Placement.model_validate_json(row["data"])
            except (ValidationError, KeyError, TypeError) as exc:
                log.warning("placements: unreadable row %s: %s", row.get("RowKey"), exc)
                continue
            stamped = placement.fetched_at
            if now is not None and max_age is not None and stamped and now - stamped > max_age:
                continue
            found.append(placement)
        return found

    def sweep(self, before: datetime) -> tuple[int, int]:
        """Delete placement rows the sync has not written since `before` (VMs Azure no
        longer lists); returns (requests made, rows deleted)."""
        made = deleted = 0
        for bucket in range(BUCKETS):
            pk = f"{PLACEMENT}{bucket}"
            pages = self.table.query_entities(
                "PartitionKey eq @pk and fetched_at lt @before",
                parameters={"pk": pk, "before": before},
                select=["PartitionKey", "RowKey"],
            ).by_page()
            stale: list[dict[str, Any]] = []
            for page in pages:
                made += 1
                stale.extend({"PartitionKey": pk, "RowKey": r["RowKey"]} for r in page)
            made += self._delete(stale)
            deleted += len(stale)
        return made, deleted

    def _delete(self, entities: list[dict[str, Any]]) -> int:
        made = 0
        for start in range(0, len(entities), BATCH):
            self.table.submit_transaction([("delete", e) for e in entities[start : start + BATCH]])
            made += 1
        return made

    # ------------------------------------------------------------------ sizes

    def size(self, budget: str, group: str) -> int | None:
        """VMs Azure lists in `budget`'s group `group`, as the last sync pass counted them;
        None if it counted none there (or has not counted since the budget was set)."""
        try:
            row = self.table.get_entity(size_partition(budget), table_key(group))
        except ResourceNotFoundError:
            return None
        size = row.get("size")
        return size if isinstance(size, int) and size >= 0 else None

    def sizes(self, budget: str) -> dict[str, int]:
        """Every counted group of `budget` and its size (for the fleet page, explain)."""
        rows = self.table.query_entities(
            "PartitionKey eq @pk", parameters={"pk": size_partition(budget)}
        )
        return {
            str(r.get("group")): int(r["size"])
            for r in rows
            if isinstance(r.get("size"), int) and isinstance(r.get("group"), str)
        }

    def write_sizes(self, counts: Mapping[str, Mapping[str, int]], now: datetime) -> int:
        """Replace every size row with `counts` (budget -> group -> VMs): groups and budgets
        no longer counted are deleted. Returns the requests made."""
        made = 0
        existing: dict[str, set[str]] = {}
        pages = self.table.query_entities(
            "PartitionKey gt @low and PartitionKey lt @high",
            parameters={"low": SIZES, "high": SIZES[:-1] + "}"},
            select=["PartitionKey", "RowKey"],
        ).by_page()
        for page in pages:
            made += 1
            for row in page:
                existing.setdefault(row["PartitionKey"], set()).add(row["RowKey"])
        for budget, groups in counts.items():
            pk = size_partition(budget)
            entities = [
                {
                    "PartitionKey": pk,
                    "RowKey": table_key(group),
                    "group": group,
                    "size": int(size),
                    "counted_at": now,
                }
                for group, size in sorted(groups.items())
            ]
            for start in range(0, len(entities), BATCH):
                chunk = entities[start : start + BATCH]
                self.table.submit_transaction(
                    [("upsert", e, {"mode": UpdateMode.REPLACE}) for e in chunk]
                )
                made += 1
            kept = {e["RowKey"] for e in entities}
            gone = sorted(existing.pop(pk, set()) - kept)
            made += self._delete([{"PartitionKey": pk, "RowKey": rk} for rk in gone])
        for pk, rows in existing.items():  # budgets no longer in the policy
            made += self._delete([{"PartitionKey": pk, "RowKey": rk} for rk in sorted(rows)])
        return made
