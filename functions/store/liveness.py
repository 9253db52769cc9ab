"""Liveness hints: the heartbeats relays write to `{prefix}liveness` (contract §5).

Relays write this table themselves (one Insert Or Merge per heartbeat, a custom role scoped
to it), so nothing in it is believed: each row is parsed into a `LivenessHint` only when its
columns have the contract's types and sizes, and counts only when a `Verifier` vouches for
it (its vm_id enrolled, its key_id that VM's current or previous callback key, its `sig`
the HMAC-SHA256 of f"liveness/v1\\n{vm_id}\\n{at}\\n{relay_version}" under that key). The
verifier answers with the VM's name as Azure knows it; a row it refuses is skipped and
reported, never believed, never paged on.

Layout: PartitionKey f"lv{int(sha256(vm_id)[:8], 16) % 8:02d}", RowKey = vm_id, columns
`seen` (Edm.DateTime, the second of `at`), `at` (Edm.Int64 unix seconds), `relay_version`
(<= 64 characters), `key_id`, `sig`. The watchdog asks each partition for the rows not
seen since a cutoff (`seen lt @cutoff`): 8 queries whatever the fleet, returning only
silent VMs.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from azure.core.exceptions import ResourceExistsError, ResourceNotFoundError
from azure.data.tables import EdmType, EntityProperty, TableServiceClient

from functions.identity.keys import liveness_ok

log = logging.getLogger(__name__)

LIVENESS_BUCKETS = 8
MAX_RELAY_VERSION = 64
_VM_ID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
_KEY_ID = re.compile(r"^[0-9a-f]{16}$")
_SIG = re.compile(r"^[0-9a-f]{64}$")

# row -> the VM's name when the row is genuine (enrolled vm_id, known key_id, valid sig),
# None otherwise. The identity package provides the real one (functions/identity/).
Verifier = Callable[[Mapping[str, Any]], str | None]


# How far ahead of the app a relay's liveness row may be dated (relays correct their clock
# from Table storage's Date header, so theirs are seconds apart).
MAX_FUTURE = timedelta(minutes=5)


class BadHint(ValueError):
    """A liveness row that is not what the contract says; the message names what."""


def liveness_partition(vm_id: str) -> str:
    digest = hashlib.sha256(vm_id.encode()).hexdigest()
    return f"lv{int(digest[:8], 16) % LIVENESS_BUCKETS:02d}"


@dataclass(frozen=True)
class LivenessHint:
    vm_id: str
    name: str  # as the verifier knows the VM (Azure's name), never the row's word
    seen: datetime
    at: int
    relay_version: str


def check_row(row: Mapping[str, Any]) -> None:
    """Raise BadHint unless the row has the contract's shape (before any verifier runs)."""
    vm_id = row.get("RowKey")
    if not isinstance(vm_id, str) or not _VM_ID.match(vm_id):
        raise BadHint("RowKey is not a lower-case vmId")
    if row.get("PartitionKey") != liveness_partition(vm_id):
        raise BadHint("PartitionKey is not the vmId's bucket")
    at, seen = _int64(row.get("at")), row.get("seen")
    if isinstance(at, bool) or not isinstance(at, int) or not 0 < at < 2**33:
        raise BadHint("`at` is not unix seconds")
    if not isinstance(seen, datetime):
        raise BadHint("`seen` is not a date-time")
    if int(seen.timestamp()) != at:
        raise BadHint("`seen` is not the second of `at`")
    version = row.get("relay_version")
    if not isinstance(version, str) or len(version) > MAX_RELAY_VERSION:
        raise BadHint("`relay_version` is not a string of at most 64 characters")
    key_id, sig = row.get("key_id"), row.get("sig")
    if not isinstance(key_id, str) or not _KEY_ID.match(key_id):
        raise BadHint("`key_id` is not a key id")
    if not isinstance(sig, str) or not _SIG.match(sig):
        raise BadHint("`sig` is not a hex HMAC-SHA256")


def _int64(value: object) -> object:
    """Edm.Int64 comes back from the SDK as EntityProperty(value, INT64)."""
    if isinstance(value, EntityProperty) and value.edm_type == EdmType.INT64:
        return int(value.value) if isinstance(value.value, int | str) else value.value
    return value


def to_hint(row: Mapping[str, Any], verify: Verifier) -> LivenessHint:
    """The row as a hint the verifier vouches for; BadHint (with why) otherwise."""
    check_row(row)
    row = {**row, "at": _int64(row["at"])}
    try:
        name = verify(row)
    except Exception as exc:  # a verifier's trouble is this row's, never the sweep's
        raise BadHint(f"verifier failed: {type(exc).__name__}") from None
    if not name:
        raise BadHint("not verified (vm_id not enrolled, unknown key_id or bad sig)")
    return LivenessHint(
        vm_id=row["RowKey"],
        name=name,
        seen=datetime.fromtimestamp(row["at"], UTC),
        at=row["at"],
        relay_version=row["relay_version"],
    )


@dataclass(frozen=True)
class Skipped:
    """A row that was not believed: its keys (clipped) and why."""

    table: str
    partition: str
    row: str
    reason: str

    def __str__(self) -> str:
        return f"{self.table}/{self.partition}/{self.row}: {self.reason}"


def _key(value: object) -> str:
    return repr(value)[:80] if not isinstance(value, str) else value[:80]


class Liveness:
    """The liveness table, as the app reads it (and deletes from it, for retention)."""

    def __init__(self, service: TableServiceClient, prefix: str = "sebridge") -> None:
        self.name = f"{prefix}liveness"
        self.table = service.get_table_client(self.name)
        self._service = service

    def ensure(self) -> Liveness:
        with contextlib.suppress(ResourceExistsError):
            self._service.create_table_if_not_exists(self.name)
        return self

    def stale(
        self,
        cutoff: datetime,
        verify: Verifier,
        skipped: Callable[[Skipped], None],
        now: datetime | None = None,
    ) -> Iterator[LivenessHint]:
        """Verified hints of VMs not seen since `cutoff`: one query per partition. A row
        that is malformed or fails verification goes to `skipped`, never stops the rest.

        The same query returns rows dated more than MAX_FUTURE ahead of `now`: a relay's
        clock is corrected from Table storage's, so only a forger writes those (a future
        `seen` would keep a dead relay's row out of `seen lt cutoff` forever); they are
        reported as skipped, each sweep, instead of hiding."""
        future = (now or datetime.now(UTC)) + MAX_FUTURE
        for bucket in range(LIVENESS_BUCKETS):
            pk = f"lv{bucket:02d}"
            rows = self.table.query_entities(
                "PartitionKey eq @pk and (seen lt @cutoff or seen gt @future )",
                parameters={"pk": pk, "cutoff": cutoff, "future": future},
            )
            for row in rows:
                seen = row.get("seen")
                if isinstance(seen, datetime) and seen > future:
                    self._skip(row, "dated in the future (a forged row?)", skipped)
                    continue
                hint = self._believe(row, verify, skipped)
                if hint is not None:
                    yield hint

    def get(
        self, vm_id: str, verify: Verifier, skipped: Callable[[Skipped], None]
    ) -> LivenessHint | None:
        """One VM's verified hint (a point read), None when absent or not believed."""
        try:
            row = self.table.get_entity(liveness_partition(vm_id), vm_id)
        except ResourceNotFoundError:
            return None
        return self._believe(row, verify, skipped)

    def _believe(
        self, row: Mapping[str, Any], verify: Verifier, skipped: Callable[[Skipped], None]
    ) -> LivenessHint | None:
        try:
            return to_hint(row, verify)
        except BadHint as exc:
            self._skip(row, str(exc), skipped)
            return None

    def _skip(self, row: Mapping[str, Any], why: str, skipped: Callable[[Skipped], None]) -> None:
        skip = Skipped(self.name, _key(row.get("PartitionKey")), _key(row.get("RowKey")), why)
        log.warning("liveness: skipped %s", skip)
        skipped(skip)

    def delete(self, vm_id: str) -> None:
        with contextlib.suppress(ResourceNotFoundError):
            self.table.delete_entity(liveness_partition(vm_id), vm_id)


class DictVerifier:
    """vm_id -> (name, {key_id: secret}): for tests and the local host. The identity
    package's verifier does the same over the identities table."""

    def __init__(self, known: Mapping[str, tuple[str, Mapping[str, bytes]]]) -> None:
        self.known = dict(known)

    def __call__(self, row: Mapping[str, Any]) -> str | None:
        entry = self.known.get(str(row.get("RowKey")))
        if entry is None:
            return None
        name, keys = entry
        secret = keys.get(str(row.get("key_id")))
        if secret is None:
            return None
        genuine = liveness_ok(
            secret, row["RowKey"], row["at"], row["relay_version"], str(row.get("sig"))
        )
        return name if genuine else None
