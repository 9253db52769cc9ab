"""Audit rows (one per decision or approval outcome, in the event's partition of the
events table) and the rejected table (every message not processed, with why; PartitionKey = day)."""

from __future__ import annotations

import contextlib
import hashlib
import re
import time
import uuid
from collections.abc import Iterator
from datetime import datetime
from typing import Any

from azure.core.exceptions import ResourceNotFoundError
from azure.data.tables import TableClient

from functions.store.http import NO_ECHO
from functions.store.keys import row_key
from functions.store.rows import Rows, utf16_prefix

# A relay's callback secret (`callback_key.secret`, 64 hex) travels in every message; the
# rejected table keeps bodies for people to read, so it keeps them without it: whoever reads
# the table could otherwise sign callbacks to that relay, and, with ATTESTATION_MODE=report,
# speak for its VM (functions.pipeline.admission admits a failed document by that key).
_SECRET = re.compile(r'("secret"\s*:\s*")[^"\\]*(")')
REDACTED = "(not kept)"


def without_secrets(text: str) -> str:
    """`text` with every JSON `"secret": "..."` value replaced (the rest as received)."""
    return _SECRET.sub(lambda m: f"{m.group(1)}{REDACTED}{m.group(2)}", text)


AUDIT = "a|"  # in an event's partition of the events table: one audit row, "a|<time>..."
LEGACY_AUDIT = "audit"  # the table audit rows were kept in before (read, and deleted, still)


class AuditRows(Rows):
    """Reads and writes of the audit rows (in each event's partition of the events table)
    and of the rejected table."""

    events: TableClient
    audit_table: TableClient
    rejected: TableClient

    @staticmethod
    def audit_row(
        event_id: str,
        *,
        at: datetime,
        rule: str,
        action: str,
        outcome: str,
        detail: str = "",
        by: str = "policy",
        once: str = "",
        anchor: datetime | None = None,
        rank: int = 5,
    ) -> dict[str, Any]:
        """One audit row for a decision or an approval outcome, in the event's partition
        of the events table: read with the event, deleted with it, and written in the same
        transaction as the event row's write it records where there is one
        (`EventRows.mutate_event(with_rows=...)`: an approval's outcome costs one request,
        not two, and the two exist together or not at all).

        `once`: a key for an outcome that a redelivery or a takeover may record again (the
        decision of a row, an approval's outcome): the row is then keyed by `anchor` (a
        time stored in the event row, the same on every redo; `at` if none), `rank` (the
        order of outcomes sharing an anchor) and `once`, so writing it twice (Insert Or
        Replace) leaves one row."""
        # Wall-clock nanoseconds break ties between rows written in one (injected) instant.
        # Rows of one instant sort by `rank`, then by when they were written.
        stamp = f"{at.strftime('%Y%m%dT%H%M%S.%fZ')}-o{rank}"
        key = f"{stamp}-{time.time_ns():020d}-{uuid.uuid4().hex[:6]}"
        if once:
            digest = hashlib.sha256(once.encode()).hexdigest()[:20]
            key = f"{(anchor or at).strftime('%Y%m%dT%H%M%S.%fZ')}-o{rank}-{digest}"
        return {
            "PartitionKey": row_key(event_id),
            "RowKey": AUDIT + key,
            "EventId": event_id[:1000],
            "rule": rule[:1000],
            "action": action[:100],
            "outcome": outcome[:1000],
            "detail": detail[:4000],
            "by": by[:200],
            "time": at,
        }

    def audit(self, event_id: str, **row: Any) -> None:
        """Write one audit row on its own (`audit_row` says what it holds)."""
        self.put_audit(self.audit_row(event_id, **row))

    def put_audit(self, row: dict[str, Any]) -> None:
        """Write an audit row built by `audit_row` (Insert Or Replace: see its `once`)."""
        self.events.upsert_entity(row, **NO_ECHO)

    def audit_rows(self, event_id: str) -> list[dict[str, Any]]:
        """The event's audit rows, oldest first (RowKey without its `a|`), with any kept
        in the audit table by an earlier version: one query each."""
        pk = row_key(event_id)
        rows = [
            {**row, "RowKey": row["RowKey"][len(AUDIT) :]}
            for row in self.events.query_entities(
                "PartitionKey eq @pk and RowKey gt @lo and RowKey lt @hi",
                parameters={"pk": pk, "lo": AUDIT, "hi": "a}"},
            )
        ]
        with contextlib.suppress(ResourceNotFoundError):  # no table: no earlier rows
            rows += [
                dict(r)
                for r in self.audit_table.query_entities(
                    "PartitionKey eq @pk", parameters={"pk": pk}
                )
            ]
        return sorted(rows, key=lambda r: r["RowKey"])

    def reject(self, *, at: datetime, reason: str, body: bytes | str, message_id: str = "") -> None:
        """Keep an envelope that does not validate, with why, so nothing is silently lost."""
        text = body.decode("utf-8", "replace") if isinstance(body, bytes) else body
        text = without_secrets(text)
        self.rejected.create_entity(
            {
                "PartitionKey": at.strftime("%Y-%m-%d"),
                "RowKey": f"{at.strftime('%H%M%S.%f')}-{uuid.uuid4().hex[:8]}",
                "reason": utf16_prefix(reason, 4000),
                "message_id": utf16_prefix(message_id, 512),
                # A string property holds 32 K UTF-16 units (64 KiB): cut there, not at
                # 30 000 characters, which non-BMP text would make twice as long.
                "body": utf16_prefix(text, 30000),
                "time": at,
            },
            **NO_ECHO,
        )

    def rejected_rows(self) -> Iterator[dict[str, Any]]:
        for row in self.rejected.list_entities():
            yield dict(row)

    def expired_rejects(self, before_day: str) -> list[tuple[str, str]]:
        """Rejected rows of days before `before_day`: a range query over old days only."""
        rows = self.rejected.query_entities(
            "PartitionKey lt @day",
            parameters={"day": before_day},
            select=["PartitionKey", "RowKey"],
        )
        return [(row["PartitionKey"], row["RowKey"]) for row in rows]

    def delete_rejects(self, keys: list[tuple[str, str]]) -> int:
        return self._delete_rows(self.rejected, keys)
