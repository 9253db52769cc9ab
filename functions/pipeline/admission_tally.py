"""What admission decided, counted: the rejection-rate alert's line and report mode's tally.

Two readers need these numbers, and neither can afford one write per message:

- the Bicep alert `admission-rejections` (infra/modules/monitoring.bicep) compares the
  messages admission rejected with all it judged over 15 minutes: a high share is the sign
  of a mismatch with Azure (its documents, its chain, Resource Graph), not of one bad VM.
  Each process writes one `sebridge {"kind":"admission",...}` line (functions.telemetry)
  at most once a minute with its counts since the last line;
- with ATTESTATION_MODE=report, the fleet page shows how many messages failed the
  attestation check (admitted by their VM's enrolled key, or rejected), by check, and the
  last one. Those counts are added to one row of the
  events table (PartitionKey `%attest`, RowKey `report`) at most once a minute per process,
  under its ETag, and only when there is something to add: enforce mode writes nothing.

So the cost is flat: one log line and (report mode only) one read and one write a minute
per host, whatever the fleet's size.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from azure.core.exceptions import ResourceNotFoundError

from functions import telemetry
from functions.identity.attestation import CHECKS
from functions.store.keys import reserved
from functions.store.rows import put_if_unchanged

log = logging.getLogger(__name__)

PARTITION, ROW = reserved("attest"), "report"
FLUSH_EVERY = timedelta(seconds=60)
WRITE_ATTEMPTS = 3
REASON_LIMIT = 1000


@dataclass
class Unverified:
    """One message whose attestation failed in report mode (admitted by its VM's enrolled
    key, or rejected: "would reject" either way in enforce)."""

    vm_id: str
    check: str
    reason: str
    at: datetime


@dataclass
class AdmissionTally:
    """Thread-safe counts since the last flush; `table` is the events table (None: the
    report-mode counts stay in this process, as in tests of admission alone)."""

    table: Any = None
    flush_every: timedelta = FLUSH_EVERY
    admitted: int = 0
    rejected: int = 0
    unverified: Counter[str] = field(default_factory=Counter)
    last: Unverified | None = None
    _flushed_at: datetime | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def count(self, outcome: str, now: datetime, unverified: Unverified | None = None) -> None:
        """One message judged: "admitted" or "rejected" (with `unverified` when its
        attestation failed in report mode). Flushes when a minute has passed."""
        with self._lock:
            if outcome == "rejected":
                self.rejected += 1
            else:
                self.admitted += 1
            if unverified is not None:
                self.unverified[unverified.check] += 1
                self.last = unverified
            due = self._flushed_at is None or now - self._flushed_at >= self.flush_every
        if due:
            self.flush(now)

    def flush_due(self, now: datetime) -> None:
        """Flush if a minute has passed since the last flush: the watchdog calls this every
        minute, so counts a quiet process holds still reach the alert."""
        with self._lock:
            due = self._flushed_at is not None and now - self._flushed_at >= self.flush_every
        if due:
            self.flush(now)

    def flush(self, now: datetime) -> None:
        """Write the counts since the last flush (one log line; the row in report mode)."""
        with self._lock:
            admitted, rejected = self.admitted, self.rejected
            unverified, last = self.unverified, self.last
            self.admitted = self.rejected = 0
            self.unverified, self.last = Counter(), None
            self._flushed_at = now
        if not (admitted or rejected):
            return
        telemetry.admission(admitted, rejected, sum(unverified.values()), dict(unverified))
        if unverified and self.table is not None:
            try:
                add_to_report(self.table, unverified, last, now)
            except Exception:
                # The log lines above and the per-message warnings still say it; the
                # page's count is behind until a later flush succeeds.
                log.exception("attestation report: could not add %s", dict(unverified))
                with self._lock:
                    self.unverified.update(unverified)
                    self.last = self.last or last


def add_to_report(
    table: Any, unverified: Counter[str], last: Unverified | None, now: datetime
) -> None:
    """Add counts to the report row, under its ETag (another host may add at once)."""
    for _ in range(WRITE_ATTEMPTS):
        try:
            row: Any = table.get_entity(PARTITION, ROW)
        except ResourceNotFoundError:
            row = None
        entity: dict[str, Any] = {"PartitionKey": PARTITION, "RowKey": ROW}
        if row is not None:
            entity.update({k: v for k, v in row.items() if k not in ("PartitionKey", "RowKey")})
        else:
            entity["since"] = now.isoformat()
        for check, n in unverified.items():
            name = f"n_{check}" if check in CHECKS else "n_other"
            entity[name] = int(entity.get(name, 0)) + n
        entity["total"] = int(entity.get("total", 0)) + sum(unverified.values())
        if last is not None:
            entity.update(
                last_vm_id=last.vm_id,
                last_check=last.check,
                last_reason=last.reason[:REASON_LIMIT],
                last_at=last.at.isoformat(),
            )
        entity["updated_at"] = now.isoformat()
        if put_if_unchanged(table, entity, row):
            return
        # another host wrote first: read its counts and add again
    raise RuntimeError(f"the report row changed {WRITE_ATTEMPTS} times while adding to it")


def read_report(table: Any) -> dict[str, Any] | None:
    """The report row as the fleet page shows it; None when nothing was ever counted."""
    try:
        row: Any = table.get_entity(PARTITION, ROW)
    except ResourceNotFoundError:
        return None
    by_check = {k[2:]: int(v) for k, v in row.items() if k.startswith("n_") and isinstance(v, int)}
    return {
        "total": int(row.get("total", 0)),
        "by_check": dict(sorted(by_check.items())),
        "since": row.get("since"),
        "last": {
            "vm_id": row.get("last_vm_id"),
            "check": row.get("last_check"),
            "reason": row.get("last_reason"),
            "at": row.get("last_at"),
        }
        if row.get("last_check")
        else None,
    }
