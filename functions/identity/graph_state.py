"""A Resource Graph configuration error, announced once fleet-wide and cleared once fixed.

Resource Graph answering 4xx (other than 429) is not a slow service: the query is refused
(a documented limit broken), the app's identity lacks its role, the api-version is gone.
Waiting does not help, so it is made loud the way an invalid policy is
(functions.pipeline.policy_state): one `config_invalid` announcement (PagerDuty dedup key
`config_invalid:fleet`, a Teams card, the webhook) per distinct error with Azure's own
words, one `config_valid` (which resolves it) when Resource Graph answers again, and the
fleet page shows the error meanwhile.

One row holds the state (events table, PartitionKey `%graph`, RowKey `state`), changed only
under its ETag so that many hosts announce once. The bulk sync (functions.identity.sync,
every 5 minutes) reports each run's outcome here: one read a run; a write only when the
state flips. Admission logs a refusal once per process and retries the message slowly
(functions.pipeline.admission); the sync, asking the same query, announces it.
"""

from __future__ import annotations

import hashlib
import logging
import re
import threading
from datetime import datetime
from typing import Any, Protocol

from azure.core.exceptions import ResourceNotFoundError
from azure.data.tables import TableClient

from functions.identity.resource_graph import ResourceGraphRefused
from functions.model.event import Notification, Transition
from functions.store.keys import reserved
from functions.store.rows import put_if_unchanged

log = logging.getLogger(__name__)

PARTITION, ROW = reserved("graph"), "state"
SUBJECT = "resource-graph"  # the Notification's `vm`: what the incident is about
_VARYING = re.compile(r"timestamp = \S+|correlationId = [0-9A-Fa-f-]+", re.IGNORECASE)


class Publisher(Protocol):
    def publish(self, note: Notification) -> None: ...


def fingerprint(error: ResourceGraphRefused) -> str:
    """The same refusal asked again has the same fingerprint (Azure's support line changes
    its timestamp and correlationId on every answer)."""
    text = f"{error.status}|{error.code}|{_VARYING.sub('', error.message)}"
    return hashlib.sha256(text.encode("utf-8", "replace")).hexdigest()[:16]


def _read(table: TableClient) -> Any:
    try:
        return table.get_entity(PARTITION, ROW)
    except ResourceNotFoundError:
        return None


def _write(table: Any, row: Any, fields: dict[str, Any]) -> bool:
    """False when another host changed the state row first: theirs is the announcement."""
    return put_if_unchanged(table, {"PartitionKey": PARTITION, "RowKey": ROW, **fields}, row)


def _mark(now: datetime) -> str:
    return now.strftime("%Y%m%dT%H%M%S")


def note_refused(
    table: TableClient, publisher: Publisher, error: ResourceGraphRefused, now: datetime
) -> bool:
    """Announce `error` unless this very error is already announced; True if announced."""
    row = _read(table)
    mark = fingerprint(error)
    if row is not None and row.get("refused") and row.get("fingerprint") == mark:
        return False
    fields = {
        "refused": True,
        "fingerprint": mark,
        "status": error.status,
        "code": error.code[:80],
        "message": error.message[:2000],
        "since": _mark(now),
    }
    if not _write(table, row, fields):
        return False
    note = Notification(
        transition=Transition.CONFIG_INVALID,
        occurred_at=now,
        vm=SUBJECT,
        detail=(
            f"Resource Graph answered {error.status} {error.code}: {error.message}. New VMs "
            "cannot be admitted (known VMs keep their stored facts) until this is fixed: "
            "check the app identity's Reader role on vmScopes and ALLOWED_SUBSCRIPTIONS"
        )[:2000],
        occurrence=fields["since"],
        page=True,
    )
    publisher.publish(note)
    log.error("Resource Graph configuration error announced: %s", note.detail)
    return True


def note_answered(table: TableClient, publisher: Publisher, now: datetime) -> bool:
    """Resource Graph answered: resolve an announced refusal; True if one was resolved."""
    row = _read(table)
    if row is None or not row.get("refused"):
        return False
    fields = {k: v for k, v in row.items() if k not in ("PartitionKey", "RowKey")}
    fields.update(refused=False, fixed_at=_mark(now))
    if not _write(table, row, fields):
        return False
    publisher.publish(
        Notification(
            transition=Transition.CONFIG_VALID,
            occurred_at=now,
            vm=SUBJECT,
            detail="Resource Graph answers the app's queries again",
            occurrence=str(row.get("since", "")),
            page=False,
        )
    )
    log.warning("Resource Graph answers again: configuration error resolved")
    return True


_logged: set[str] = set()
_logged_lock = threading.Lock()


def log_refusal_once(error: ResourceGraphRefused) -> bool:
    """Log a refusal with Azure's words once per process (not once per message); True the
    first time."""
    mark = fingerprint(error)
    with _logged_lock:
        if mark in _logged:
            return False
        if len(_logged) > 100:
            _logged.clear()
        _logged.add(mark)
    log.error("RESOURCE GRAPH REFUSED THE APP'S QUERY (configuration error): %s", error)
    return True


def graph_state(table: TableClient) -> dict[str, Any] | None:
    """For the fleet page: the refusal in force (status, code, Azure's message, since), or
    None while Resource Graph answers."""
    row = _read(table)
    if row is None or not row.get("refused"):
        return None
    return {k: row.get(k) for k in ("status", "code", "message", "since")}
