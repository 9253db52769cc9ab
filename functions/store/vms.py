"""The VMs table: one row per VM, its document state and the liveness columns.

A VM's row is in partition `vm00`..`vm07` (hash of its name), RowKey = its name's key.
Document state is JSON in `data`; liveness is in plain columns (`seen`, `callback_url`,
`relay_version`) that a heartbeat merges without reading (functions/README.md, "What is
stored", has the why).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from datetime import datetime
from typing import Any
from urllib.parse import urlsplit

from azure.core.exceptions import ResourceNotFoundError
from azure.data.tables import TableClient, UpdateMode

from functions.store.keys import row_key, vm_partition
from functions.store.recent import RecentRows
from functions.store.records import VmRecord
from functions.store.rows import UNREAD, BadRow, Rows, _in_batches, _unchunk, _why

log = logging.getLogger(__name__)

RECENT_VM_ROWS = 2048  # VM rows a Store remembers to start its next write from: ~2 KB each


def _callback_url_ok(value: object) -> bool:
    """A relay's callback as the envelope allows it: http(s)://HOST[:PORT], no user info."""
    if not isinstance(value, str) or len(value) > 2048:
        return False
    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018 - raises ValueError for a port out of range
    except ValueError:
        return False
    return parts.scheme in ("http", "https") and bool(parts.hostname) and "@" not in parts.netloc


class VmRows(Rows):
    """Reads and writes of the VMs table."""

    vms: TableClient
    _recent_vms: RecentRows[VmRecord]

    @staticmethod
    def _load_vm(entity: Any) -> VmRecord:
        """Document state from `data`, overlaid with the liveness columns heartbeats merge."""
        try:
            text = _unchunk(entity)
            record = (
                VmRecord.model_validate_json(text)
                if text is not None
                else VmRecord(name=str(entity.get("name") or entity["RowKey"])[:1000])
            )
        except Exception as exc:  # a row that is not a VM's record: the caller skips it
            raise BadRow("VmRecord", entity, _why(exc)) from None
        seen = entity.get("seen")
        if isinstance(seen, datetime) and (record.last_seen is None or seen > record.last_seen):
            record.last_seen = seen
        url = entity.get("callback_url")
        if url and _callback_url_ok(url):
            record.callback_url = url.rstrip("/")
        elif url:
            # Relays write these columns themselves (relay.liveness), past the envelope's
            # checks: a value that is not a plain http(s) URL is never called back.
            log.warning("VM %s: ignoring callback_url column %.100r", record.name, url)
        version = entity.get("relay_version")
        if isinstance(version, str) and version:
            record.relay_version = version[:100]
        record.etag = entity.metadata.get("etag")
        return record

    @staticmethod
    def _vm_columns(record: VmRecord) -> dict[str, Any]:
        columns: dict[str, Any] = {
            "name": record.name,
            "silent": record.silent_announced_for is not None,
            "recovering": record.recovery_pending is not None,
        }
        if record.last_seen is not None:
            columns["seen"] = record.last_seen
        if record.callback_url:
            columns["callback_url"] = record.callback_url
        if record.relay_version:
            columns["relay_version"] = record.relay_version
        return columns

    def get_vm(self, name: str, *, strict: bool = False) -> VmRecord | None:
        """The VM row. One that cannot be read raises BadRow with `strict` (the watchdog
        skips and reports it); otherwise it reads as a new VM's, carrying the bad row's
        ETag, so the VM's next write replaces it and the VM is never blocked by it."""
        key = row_key(name)
        try:
            entity = self.vms.get_entity(vm_partition(name), key)
        except ResourceNotFoundError:
            self._recent_vms.forget(key)
            return None
        record = self._load_vm(entity) if strict else self._load_vm_or_fresh(name, entity)
        self._recent_vms.note(key, record)
        return record

    def recent_vm(self, name: str) -> VmRecord | None:
        """The VM row as this Store last read or wrote it, if remembered. Unverified:
        anyone may have written since (a heartbeat, the watchdog, another instance), so a
        caller relies on it only where it can tell nobody changed what it reads
        (functions.pipeline.ingest: the next document of the same relay) and writes
        with its ETag as the guard."""
        return self._recent_vms.recall(row_key(name))

    def mutate_vm(
        self,
        name: str,
        change: Callable[[VmRecord | None], VmRecord | None],
        known: VmRecord | None = UNREAD,
    ) -> tuple[VmRecord | None, bool]:
        key = row_key(name)
        try:
            record, won = self._mutate(
                self.vms,
                VmRecord,
                vm_partition(name),
                key,
                change,
                self._vm_columns,
                known=known,
                load=lambda entity: self._load_vm_or_fresh(name, entity),
            )
        except BaseException:
            self._recent_vms.forget(key)
            raise
        self._recent_vms.note(key, record)
        return record, won

    def _load_vm_or_fresh(self, name: str, entity: Any) -> VmRecord:
        """A VM row that cannot be read must not block its VM: it is logged and replaced
        (conditionally, under its ETag) by the next write, as if the VM were new."""
        try:
            return self._load_vm(entity)
        except BadRow as exc:
            log.warning("VM %.100r: replacing an unreadable row: %s", name, exc)
            record = VmRecord(name=name)
            record.etag = entity.metadata.get("etag")
            return record

    def heard(self, beats: list[tuple[str, datetime, str | None, str | None]]) -> int:
        """Liveness of many VMs at once: (name, seen, callback_url, relay_version) each.

        A merge, never a read or a replace, so it cannot undo a document's write; one
        transaction per VM partition (at most VM_BUCKETS per 100 VMs). Returns requests."""
        latest: dict[str, tuple[str, datetime, str | None, str | None]] = {}
        for beat in beats:
            key = row_key(beat[0])
            if key not in latest or beat[1] >= latest[key][1]:
                latest[key] = beat
        by_partition: dict[str, list[dict[str, Any]]] = {}
        for key, (name, seen, callback_url, relay_version) in latest.items():
            entity: dict[str, Any] = {
                "PartitionKey": vm_partition(name),
                "RowKey": key,
                "name": name,
                "seen": seen,
            }
            if callback_url:
                entity["callback_url"] = callback_url
            if relay_version:
                entity["relay_version"] = relay_version
            by_partition.setdefault(entity["PartitionKey"], []).append(entity)
        made = 0
        for key in latest:  # their rows move: a remembered one would only fail its write
            self._recent_vms.forget(key)
        for entities in by_partition.values():
            for chunk in _in_batches(entities):
                ops = [("upsert", e, {"mode": UpdateMode.MERGE}) for e in chunk]
                self.vms.submit_transaction(ops)
                made += 1
        return made

    def delete_vm(self, name: str) -> None:
        self._recent_vms.forget(row_key(name))
        with contextlib.suppress(ResourceNotFoundError):
            self.vms.delete_entity(vm_partition(name), row_key(name))

    def list_vms(self) -> list[VmRecord]:
        """Every VM (for tools and tests; the function app never lists the fleet)."""
        rows = self.vms.query_entities("PartitionKey ge 'vm' and PartitionKey lt 'vn'")
        found = []
        for row in rows:
            try:
                found.append(self._load_vm(row))
            except BadRow as exc:
                log.warning("vms: skipped %s", exc)
        return found
