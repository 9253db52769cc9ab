"""Liveness hints: the heartbeats relays write to `{prefix}liveness` (contract §5).

Relays write this table themselves (one Insert Or Merge per heartbeat, a custom role scoped
to it), and Table RBAC cannot scope a writer to rows, so every relay can write every row:
nothing in it is believed, and nothing in it may cost the app without bound (issue 27).

Layout (v2, relays since issue 27): RowKey = hex HMAC-SHA256(K, "liveness-row/v1") under
the VM's callback key K, PartitionKey `lvNN` (NN = int(RowKey[:8], 16) % 8), columns
`vm_id`, `seen` (Edm.DateTime, the second of `at`), `at` (Edm.Int64 unix seconds),
`relay_version` (<= 64 characters), `key_id`, `sig` = HMAC-SHA256(K,
"liveness/v1\\n{vm_id}\\n{at}\\n{relay_version}"). Relays of contract 2 (0.2.0+, issue 44)
add `contract` (Edm.Int32, 2), `probe_at` (Edm.Int64 unix seconds: when Azure's load-balancer
probe, from 168.63.129.16, last reached the VM's readiness responder; 0 = never since it
started) and `drain` (<= 64 characters, comma-separated, from "hook", "readiness", "file":
the drain means the relay offers), and sign them all: `sig` = HMAC-SHA256(K,
"liveness/v2\\n{vm_id}\\n{at}\\n{relay_version}\\n{contract}\\n{probe_at}\\n{drain}"). A row
without `contract` is contract 1 (relays 0.1.x). ACCEPTED_CONTRACTS says which this app
reads; a row of any other contract is refused by name (UnknownContract: the app is older
than the relay), never read as if it were one it knows. A VM without K can neither find another
VM's row nor write one that verifies, so it cannot overwrite a dead relay's row to hide
its silence. Within 24 h of a rotation a relay writes its previous key's row too; that row
is "superseded" once the app knows the new key, and deleted when the watchdog finds it
stale while the current one is fresh. Rows of relays before issue 27 (RowKey = vmId,
PartitionKey from sha256(vmId)) are still read and verified the same way; their residual
risk is stated in the README.

A row is a `LivenessHint` only when its columns have the contract's types and sizes and a
`Verifier` vouches for it (vm_id enrolled, key_id that VM's current or previous key, and
RowKey and sig made with it). Everything else is junk: deleted when seen (ETag-guarded
batch deletes), counted, and the first few named in the watchdog's report.

Cost: the watchdog asks each partition for the rows not seen since a cutoff, or dated more
than MAX_FUTURE ahead (`seen lt @cutoff or seen gt @future`): 8 queries whatever the fleet,
returning only silent VMs and junk. Every further request of the sweep (another page, a
verifier's identities read, a batch delete) is spent from a `Budget` (SWEEP_REQUESTS), so a
table full of junk costs a sweep at most that many requests; what is left is classified and
deleted on the following sweeps.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import logging
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from azure.core import MatchConditions
from azure.core.exceptions import HttpResponseError, ResourceExistsError, ResourceNotFoundError
from azure.data.tables import EdmType, EntityProperty, TableServiceClient, TableTransactionError

from functions.identity.keys import key_id_of, liveness_ok, liveness_signature_v2

log = logging.getLogger(__name__)

LIVENESS_BUCKETS = 8
MAX_RELAY_VERSION = 64
MAX_DRAIN = 64
# The relay<->app contracts this app reads (relay/README.md, "Versions"): 1 = relays 0.1.x
# (v1 rows), 2 = relays 0.2.x (v2 rows: probe_at and drain, signed).
ACCEPTED_CONTRACTS = frozenset({1, 2})
UNKNOWN_CONTRACT = "relay contract"  # how an UnknownContract's reason starts
DRAIN_MEANS = frozenset({"hook", "readiness", "file"})
ROW_KEY_LABEL = b"liveness-row/v1"
# Liveness requests one sweep may make: 8 first pages, the identities listing of 10,000
# VMs (10 pages), 2 batch deletes. With the rest of a sweep (9 at 10,000 VMs) that is
# within the 30, whatever the liveness table holds.
SWEEP_REQUESTS = 20
POINT_READS = 4  # more rows than this to check: list the enrolled VMs instead
DELETES_KEPT = 2  # batch deletes (100 rows each) a sweep keeps for the junk it found
PAGE_SIZE = 1000
BATCH = 100  # deletes per transaction (Table storage's limit)
_VM_ID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
_ROW = re.compile(r"^[0-9a-f]{64}$")
_KEY_ID = re.compile(r"^[0-9a-f]{16}$")
_SIG = re.compile(r"^[0-9a-f]{64}$")

# How long a VM's anchor key's row may go unwritten before a row of its other key speaks for
# the VM (Liveness.get): RELAY_SILENT_AFTER_SECONDS' default, two heartbeats of 300 s; the
# app passes its setting where it has it.
ANCHOR_SILENT_AFTER = timedelta(seconds=600)

# How far ahead of the app a relay's liveness row may be dated (relays correct their clock
# from Table storage's Date header, so theirs are seconds apart).
MAX_FUTURE = timedelta(minutes=5)


class BadHint(ValueError):
    """A liveness row that is not what the contract says; the message names what."""


class UnknownContract(BadHint):
    """A row of a relay contract this app does not read: a relay newer than the app (or a
    forger). Refused by name and logged as an error, so the operator upgrades the app."""


# What the app knows of an enrolled VM: Azure's name for it and its callback secrets,
# current first.
Entry = tuple[str, tuple[bytes, ...]]


class Verifier(Protocol):
    """Where the app's knowledge of enrolled VMs comes from (the identities table)."""

    def lookup(self, vm_id: str) -> Entry | None:
        """One VM (one Table read); None when not enrolled."""
        ...

    def pages(self) -> Iterator[tuple[dict[str, Entry], bool]]:
        """Every enrolled VM, one Table read a page (for a sweep with many rows to check),
        each with whether more pages follow."""
        ...


def liveness_partition(vm_id: str) -> str:
    """The partition of a pre-issue-27 row (RowKey = vmId)."""
    digest = hashlib.sha256(vm_id.encode()).hexdigest()
    return f"lv{int(digest[:8], 16) % LIVENESS_BUCKETS:02d}"


def row_keys_for(secret: bytes) -> tuple[str, str]:
    """(PartitionKey, RowKey) of the liveness row under a callback key (v2)."""
    row = hmac.new(secret, ROW_KEY_LABEL, hashlib.sha256).hexdigest()
    return f"lv{int(row[:8], 16) % LIVENESS_BUCKETS:02d}", row


@dataclass(frozen=True)
class LivenessHint:
    vm_id: str
    name: str  # as the verifier knows the VM (Azure's name), never the row's word
    seen: datetime
    at: int
    relay_version: str
    partition: str = ""
    row: str = ""
    current: bool = True  # False: a previous key's row (superseded once the current is fresh)
    contract: int = 1  # the relay<->app contract the row is written in (1: before issue 44)
    # When Azure's load-balancer probe last reached the VM's readiness responder (None:
    # never since it started, or a contract-1 relay, which does not say).
    probe_at: datetime | None = None
    drain: tuple[str, ...] = ()  # the drain means the relay offers: hook, readiness, file
    others: bool = False  # the verifier holds another key for the VM (Liveness.get may read it)


def is_keyed_row(row: Mapping[str, Any]) -> bool:
    """Whether the row has the v2 layout (RowKey derived from the VM's key)."""
    key = row.get("RowKey")
    return isinstance(key, str) and _ROW.match(key) is not None


def row_vm_id(row: Mapping[str, Any]) -> object:
    """The vmId a row claims: its `vm_id` column (v2) or its RowKey (before issue 27)."""
    return row.get("vm_id") if is_keyed_row(row) else row.get("RowKey")


def check_row(row: Mapping[str, Any]) -> None:
    """Raise BadHint unless the row has the contract's shape (before any verifier runs)."""
    key = row.get("RowKey")
    if is_keyed_row(row):
        vm_id = row.get("vm_id")
        if not isinstance(vm_id, str) or not _VM_ID.match(vm_id):
            raise BadHint("`vm_id` is not a lower-case vmId")
        if row.get("PartitionKey") != f"lv{int(str(key)[:8], 16) % LIVENESS_BUCKETS:02d}":
            raise BadHint("PartitionKey is not the RowKey's bucket")
    elif isinstance(key, str) and _VM_ID.match(key):
        if row.get("PartitionKey") != liveness_partition(key):
            raise BadHint("PartitionKey is not the vmId's bucket")
    else:
        raise BadHint("RowKey is neither a key-derived row key nor a lower-case vmId")
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
    contract = row_contract(row)
    if contract == 2:
        probe_at, drain = _int64(row.get("probe_at")), row.get("drain")
        if isinstance(probe_at, bool) or not isinstance(probe_at, int) or not 0 <= probe_at < 2**33:
            raise BadHint("`probe_at` is not unix seconds (or 0)")
        if not isinstance(drain, str) or len(drain) > MAX_DRAIN:
            raise BadHint("`drain` is not a string of at most 64 characters")
        if drain and not set(drain.split(",")) <= DRAIN_MEANS:
            raise BadHint("`drain` names a drain means other than hook, readiness, file")


def row_contract(row: Mapping[str, Any]) -> int:
    """The row's relay contract: 1 without the column; UnknownContract (loud) for any this
    app does not read, BadHint for a column that is not a number."""
    value = row.get("contract", 1)
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadHint("`contract` is not a number")
    if value not in ACCEPTED_CONTRACTS:
        accepted = ", ".join(str(c) for c in sorted(ACCEPTED_CONTRACTS))
        raise UnknownContract(
            f"{UNKNOWN_CONTRACT} {value} is not one this app reads ({accepted}): "
            "upgrade the function app before its relays"
        )
    return value


def _int64(value: object) -> object:
    """Edm.Int64 comes back from the SDK as EntityProperty(value, INT64)."""
    if isinstance(value, EntityProperty) and value.edm_type == EdmType.INT64:
        return int(value.value) if isinstance(value.value, int | str) else value.value
    return value


def genuine(row: Mapping[str, Any], vm_id: str, secret: bytes) -> bool:
    """Whether `secret` made this (shape-checked) row: its sig, and for v2 its RowKey."""
    if is_keyed_row(row) and not hmac.compare_digest(row_keys_for(secret)[1], row["RowKey"]):
        return False
    at = int(_int64(row["at"]))  # type: ignore[call-overload]
    version, sig = str(row["relay_version"]), str(row["sig"])
    if row_contract(row) == 1:
        return liveness_ok(secret, vm_id, at, version, sig)
    probe_at = int(_int64(row["probe_at"]))  # type: ignore[call-overload]
    expected = liveness_signature_v2(secret, vm_id, at, version, 2, probe_at, str(row["drain"]))
    return hmac.compare_digest(expected, sig)


def vouch(row: Mapping[str, Any], entry: Entry | None) -> LivenessHint:
    """The (shape-checked) row as a hint, if `entry` (its VM as the app knows it) made it:
    the key its key_id names signed it and, for v2, derived its RowKey. BadHint otherwise."""
    secret = None
    if entry is not None:
        secret = next((k for k in entry[1] if key_id_of(k) == row.get("key_id")), None)
    vm_id = str(row_vm_id(row))
    if entry is None or secret is None or not genuine(row, vm_id, secret):
        raise BadHint("not verified (vm_id not enrolled, unknown key_id, or bad RowKey or sig)")
    at = int(_int64(row["at"]))  # type: ignore[call-overload]
    contract = row_contract(row)
    probe_at = int(_int64(row.get("probe_at", 0)))  # type: ignore[call-overload]
    drain = str(row.get("drain", ""))
    return LivenessHint(
        vm_id=vm_id,
        name=entry[0],
        seen=datetime.fromtimestamp(at, UTC),
        at=at,
        relay_version=row["relay_version"],
        partition=row["PartitionKey"],
        row=row["RowKey"],
        current=not is_keyed_row(row) or secret == entry[1][0],
        contract=contract,
        probe_at=datetime.fromtimestamp(probe_at, UTC) if probe_at else None,
        drain=tuple(drain.split(",")) if drain else (),
        others=len(entry[1]) > 1,
    )


def to_hint(row: Mapping[str, Any], verify: Verifier) -> LivenessHint:
    """The row as a hint the verifier vouches for; BadHint (with why) otherwise."""
    check_row(row)
    try:
        entry = verify.lookup(str(row_vm_id(row)))
    except Exception as exc:  # a verifier's trouble is this row's, never the sweep's
        raise BadHint(f"verifier failed: {type(exc).__name__}") from None
    return vouch(row, entry)


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


class Budget:
    """Table requests a sweep may still spend on the liveness table."""

    def __init__(self, requests: int = SWEEP_REQUESTS) -> None:
        self.left = requests
        self.spent = 0

    def spend(self, count: int = 1) -> None:
        self.left -= count
        self.spent += count


class _Known:
    """One sweep's view of the enrolled VMs: point reads while few rows need checking,
    the identities table page by page once many do (while the budget allows)."""

    def __init__(self, verify: Verifier, budget: Budget) -> None:
        self.verify, self.budget = verify, budget
        self.entries: dict[str, Entry | None] = {}
        self.complete = False

    def preload(self, keep: int) -> None:
        pages = self.verify.pages()
        try:
            while self.budget.left > keep:
                self.budget.spend()
                page, more = next(pages)
                self.entries.update(page)
                if not more:
                    self.complete = True
                    return
        except Exception:  # the identities table's trouble: point reads instead
            log.exception("liveness: could not list the enrolled VMs")
        # Partial: what is not loaded is read one by one.

    def entry(self, vm_id: str) -> Entry | bool | None:
        """The VM's entry; False when it cannot be known within the budget."""
        if vm_id in self.entries or self.complete:
            return self.entries.get(vm_id)
        if self.budget.left <= 1:  # keep one request to delete what was found
            return False
        self.budget.spend()
        try:
            self.entries[vm_id] = self.verify.lookup(vm_id)
        except Exception:  # a verifier's trouble is this row's, never the sweep's
            log.exception("liveness: could not look up %s", vm_id)
            return False
        return self.entries[vm_id]


class Liveness:
    """The liveness table, as the app reads it (and deletes from it: junk, retention)."""

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
        budget: Budget | None = None,
    ) -> Iterator[LivenessHint]:
        """Verified hints of VMs not seen since `cutoff`: one query per partition. A row
        that is malformed, fails verification or is dated more than MAX_FUTURE ahead of
        `now` (only a forger writes those: relays correct their clock from Table
        storage's) goes to `skipped` and is deleted; none stops the rest. Every request
        (pages, identities reads, deletes) is spent from `budget`; rows not reached are
        classified on a later sweep."""
        budget = budget or Budget()
        future = (now or datetime.now(UTC)) + MAX_FUTURE
        junk: dict[str, list[Mapping[str, Any]]] = {}
        reasons: list[Skipped] = []
        pending: list[Mapping[str, Any]] = []
        for row in self._read(cutoff, future, budget):
            seen = row.get("seen")
            why = "dated in the future (a forged row?)"
            if not (isinstance(seen, datetime) and seen > future):
                try:
                    check_row(row)
                    pending.append(row)
                    continue
                except BadHint as exc:
                    why = str(exc)
            self._junk(row, why, junk, reasons)
        known = _Known(verify, budget)
        if len(pending) > POINT_READS:
            known.preload(keep=DELETES_KEPT)
        for row in pending:
            entry = known.entry(str(row_vm_id(row)))
            if entry is False:
                continue  # not checked this sweep: neither believed nor deleted
            try:
                hint = vouch(row, entry)  # type: ignore[arg-type]
            except BadHint as exc:
                self._junk(row, str(exc), junk, reasons)
                continue
            yield hint
        self._report(reasons, skipped)
        self._delete_junk(junk, budget)

    def _read(self, cutoff: datetime, future: datetime, budget: Budget) -> list[Mapping[str, Any]]:
        """Each partition's first page (up to 1,000 rows): genuine silent rows are few, so
        more pages mean junk, which is checked and deleted first; the pages behind it are
        read on the following sweeps (the rows ahead of them are gone by then)."""
        rows: list[Mapping[str, Any]] = []
        for bucket in range(LIVENESS_BUCKETS):
            pages = self.table.query_entities(
                # The space before ")": the SDK's @name substitution splits on spaces.
                "PartitionKey eq @pk and (seen lt @cutoff or seen gt @future )",
                parameters={"pk": f"lv{bucket:02d}", "cutoff": cutoff, "future": future},
                results_per_page=PAGE_SIZE,
            ).by_page()
            for page in pages:  # one request, made as the loop asks for it
                budget.spend()
                rows.extend(page)
                break
        return rows

    def _junk(
        self,
        row: Mapping[str, Any],
        why: str,
        junk: dict[str, list[Mapping[str, Any]]],
        reasons: list[Skipped],
    ) -> None:
        pk, rk = _key(row.get("PartitionKey")), _key(row.get("RowKey"))
        reasons.append(Skipped(self.name, pk, rk, why))
        junk.setdefault(str(row.get("PartitionKey")), []).append(row)

    def _report(self, reasons: list[Skipped], skipped: Callable[[Skipped], None]) -> None:
        for reason in reasons:
            skipped(reason)
        newer = [r for r in reasons if r.reason.startswith(UNKNOWN_CONTRACT)]
        if newer:  # not junk to shrug at: relays this app cannot read (UnknownContract)
            log.error(
                "liveness: %d row(s) of a relay contract this app does not read; first: %s",
                len(newer),
                newer[0],
            )
        if reasons:
            log.warning(
                "liveness: %d row(s) not believed, deleted as the budget allows; first: %s",
                len(reasons),
                reasons[0],
            )

    def _delete_junk(self, junk: dict[str, list[Mapping[str, Any]]], budget: Budget) -> None:
        """ETag-guarded batch deletes, 100 a request: a row rewritten since it was read
        fails its batch, which is left for a later sweep."""
        for pk, rows in junk.items():
            for start in range(0, len(rows), BATCH):
                if budget.left <= 0:
                    return
                budget.spend()
                guard = MatchConditions.IfNotModified
                batch = [
                    (
                        "delete",
                        {"PartitionKey": pk, "RowKey": r["RowKey"]},
                        {"etag": r.metadata["etag"], "match_condition": guard},  # type: ignore[attr-defined]
                    )
                    for r in rows[start : start + BATCH]
                ]
                try:
                    self.table.submit_transaction(batch)
                except (TableTransactionError, HttpResponseError) as exc:
                    log.info("liveness: junk batch in %s not deleted now: %s", pk, exc)

    def get(
        self,
        vm_id: str,
        verify: Verifier,
        skipped: Callable[[Skipped], None],
        *,
        silent_after: timedelta = ANCHOR_SILENT_AFTER,
        now: datetime | None = None,
    ) -> LivenessHint | None:
        """One VM's verified hint, None when absent or not believed: its first key's row (a
        point read; the anchor, for the identities table's verifier), else its row from
        before issue 27 (a second one). Only when the first key's row is missing or older
        than `silent_after` (its relay silent: a reimaged VM's old key) is the row of its
        other key read (one more): while the anchor's relay heartbeats, a row signed by a
        key a local user enrolled never speaks for the VM (issue 46)."""
        try:
            entry = verify.lookup(vm_id)
        except Exception:
            log.exception("liveness: could not look up %s", vm_id)
            return None
        keys = entry[1] if entry else ()
        first = self._read_row(row_keys_for(keys[0]), entry, skipped) if keys else None
        cutoff = (now or datetime.now(UTC)) - silent_after
        if len(keys) > 1 and (first is None or first.seen < cutoff):
            other = self._read_row(row_keys_for(keys[1]), entry, skipped)
            if other is not None and (first is None or other.seen > first.seen):
                return replace(other, current=True)  # the first key's relay is silent
        if first is not None:
            return first
        return self._read_row((liveness_partition(vm_id), vm_id), entry, skipped)

    def _read_row(
        self, place: tuple[str, str], entry: Entry | None, skipped: Callable[[Skipped], None]
    ) -> LivenessHint | None:
        """The row at `place` as a hint `entry` vouches for; None (and `skipped`) if not."""
        pk, rk = place
        try:
            row = self.table.get_entity(pk, rk)
        except ResourceNotFoundError:
            return None
        try:
            check_row(row)
            return vouch(row, entry)
        except BadHint as exc:
            skip = Skipped(self.name, _key(pk), _key(rk), str(exc))
            loud = logging.ERROR if isinstance(exc, UnknownContract) else logging.WARNING
            log.log(loud, "liveness: skipped %s", skip)
            skipped(skip)
            return None

    def last_heard(
        self,
        vm_id: str | None,
        seen: datetime | None,
        verify: Verifier | None,
        *,
        silent_after: timedelta,
        now: datetime,
    ) -> datetime | None:
        """When a VM's relay was last heard: `seen` (its last message), or its verified
        hint if later (relays heartbeat into this table, not the VM row). No read without
        a vmId or a verifier: no row is believed then."""
        if not vm_id or verify is None:
            return seen
        hint = self.get(vm_id, verify, lambda _: None, silent_after=silent_after, now=now)
        if hint is not None and (seen is None or hint.seen > seen):
            return hint.seen
        return seen

    def seen_with(self, vm_id: str, secret: bytes) -> datetime | None:
        """When the relay last heartbeated under `secret` (the row it keys, checked and
        signed by it), None when there is no such row: one point read. What tells the app
        that a VM's anchor key is still its relay's (functions.pipeline.anchor)."""
        hint = self._read_row(row_keys_for(secret), ("", (secret,)), lambda _: None)
        return hint.seen if hint is not None and hint.vm_id == vm_id else None

    def delete(self, hint: LivenessHint) -> None:
        with contextlib.suppress(ResourceNotFoundError):
            self.table.delete_entity(hint.partition, hint.row)


class DictVerifier:
    """vm_id -> (name, {key_id: secret}) with the current key first: for tests and the
    local host. functions.pipeline.liveness_verifier does the same over the identities
    table."""

    def __init__(self, known: Mapping[str, tuple[str, Mapping[str, bytes]]]) -> None:
        self.known = dict(known)

    def lookup(self, vm_id: str) -> Entry | None:
        entry = self.known.get(vm_id)
        return (entry[0], tuple(entry[1].values())) if entry else None

    def pages(self) -> Iterator[tuple[dict[str, Entry], bool]]:
        entries = {
            vm_id: (name, tuple(keys.values())) for vm_id, (name, keys) in self.known.items()
        }
        yield entries, False
