"""The fleet-wide "policy invalid" incident: opened once per breakage, resolved once fixed.

Each event decided on an invalid policy is announced `policy_invalid` (its own page, keyed
by EventId; re-deciding the event resolves or re-triggers it). On top of that the fleet
gets one `policy_invalid` (PagerDuty dedup key `policy_invalid:fleet`) when a host runs with
an invalid policy, and one `policy_valid` (which resolves that key) when a host runs with a
valid policy after it. The watchdog calls `sync_policy_state` every minute, so that happens
within a minute of the host starting.

One row remembers the state (events table, PartitionKey `policy`, RowKey `state`), changed
only under its ETag: the writer that flips it publishes, so many hosts announce once. The
row keeps the last error even once valid, and a host still running the broken policy (the
old instances of a rolling restart) flips it back only for a *different* error, so a
restart does not flap the incident.
"""

from __future__ import annotations

import hashlib
import logging
from datetime import datetime
from typing import Any

from azure.core.exceptions import ResourceNotFoundError
from azure.data.tables import UpdateMode

from functions.model.event import Notification, Transition
from functions.pipeline.context import Pipeline
from functions.store.rows import put_if_unchanged, utf16_prefix

log = logging.getLogger(__name__)

PARTITION, ROW = "policy", "state"
ERROR_LIMIT = 4000


def _mark(now: datetime) -> str:
    return now.strftime("%Y%m%dT%H%M%S")


def _fingerprint(error: str) -> str:
    return hashlib.sha256(error.encode("utf-8", "replace")).hexdigest()[:16]


def sync_policy_state(pipeline: Pipeline, now: datetime) -> Transition | None:
    """Publish `policy_invalid` or `policy_valid` if this host's policy changes the fleet's
    state; return what was published (None: nothing changed, or another host won)."""
    load = pipeline.settings.policy
    table = pipeline.store.events
    try:
        row: Any = table.get_entity(PARTITION, ROW)
    except ResourceNotFoundError:
        row = None
    if load.error is not None:
        fingerprint = _fingerprint(load.error)
        if row is not None and row.get("fingerprint") == fingerprint:
            return None  # this breakage is known (announced, or already fixed elsewhere)
        new = {
            "valid": False,
            "fingerprint": fingerprint,
            "error": utf16_prefix(load.error, ERROR_LIMIT),
            "since": _mark(now),
        }
        transition = Transition.POLICY_INVALID
        detail = f"the policy or a setting does not validate, nothing is approved: {load.error}"
    else:
        if row is None or row.get("valid", True):
            return None
        new = {**_fields(row), "valid": True, "fixed_at": _mark(now)}
        transition = Transition.POLICY_VALID
        detail = "the policy validates again; events that failed closed are decided again"
    if not _write(table, row, new):
        return None
    note = Notification(
        transition=transition,
        occurred_at=now,
        detail=detail[:2000],
        occurrence=str(new["since"]),  # the breakage both announcements are about
        page=transition is Transition.POLICY_INVALID,
    )
    try:
        pipeline.publisher.publish(note)
    except Exception:
        _undo(table, row)  # the next run (or host) announces it
        raise
    log.warning("policy state: %s (%s)", transition.value, note.message_id())
    return transition


def _fields(row: Any) -> dict[str, Any]:
    return {k: v for k, v in row.items() if k not in ("PartitionKey", "RowKey")}


def _write(table: Any, row: Any, fields: dict[str, Any]) -> bool:
    """False when another host changed the state row first: theirs is the announcement."""
    return put_if_unchanged(table, {"PartitionKey": PARTITION, "RowKey": ROW, **fields}, row)


def _undo(table: Any, previous: Any) -> None:
    try:
        if previous is None:
            table.delete_entity(PARTITION, ROW)
        else:
            entity = {"PartitionKey": PARTITION, "RowKey": ROW, **_fields(previous)}
            table.update_entity(entity, mode=UpdateMode.REPLACE)
    except Exception:
        log.exception("policy state: could not restore the row after a failed publish")
