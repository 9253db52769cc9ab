"""All state the function app keeps, as one object: the VMs, events, audit and rejected
tables (each in its own module) and the relays' liveness table."""

from __future__ import annotations

import contextlib
import threading
from collections import OrderedDict
from datetime import datetime
from typing import Any

from azure.core.exceptions import ResourceExistsError
from azure.data.tables import TableServiceClient

from functions.store.audit import AuditRows
from functions.store.budget_slots import BudgetSlots
from functions.store.events import RECENT_EVENT_ROWS, EventRows
from functions.store.liveness import Liveness
from functions.store.recent import RecentRows
from functions.store.records import EventRecord, VmRecord
from functions.store.rows import transport_options
from functions.store.vms import RECENT_VM_ROWS, VmRows


class Store(VmRows, EventRows, AuditRows, BudgetSlots):
    """All state the function app keeps. Thread-safe to share; cheap to create per thread.

    Layout (functions/README.md, "What is stored", has the why):
    - `{prefix}vms`: a VM's row in partition `vm00`..`vm07` (hash of its name), RowKey =
      its name's key. Document state is JSON in `data`; liveness is in plain columns
      (`seen`, `callback_url`, `relay_version`) that a heartbeat merges without reading.
    - `{prefix}events`: each event is its own partition (PartitionKey = EventId's key):
      RowKey `event` holds the lifecycle, decision, approval and announcements; RowKey
      `r|<vm>` is one reporter, written by that reporter alone; RowKey `a|...` one audit
      row (written with the outcome it records where there is one). Index partitions: `%open`
      (events not ended), `%ended|<day>` (for retention), `%cap|<set>` (capacity slots),
      `%once` (fleet-wide markers), `%budget|<budget>` (disruption budget slots:
      functions.store.budget_slots).
    - `{prefix}audit`: audit rows of earlier versions (read and deleted with their event).
    - `{prefix}rejected`: PartitionKey = day.
    """

    def __init__(self, service: TableServiceClient, prefix: str = "sebridge") -> None:
        self.service = service
        self.prefix = prefix
        self.vms = service.get_table_client(f"{prefix}vms")
        self.events = service.get_table_client(f"{prefix}events")
        self.audit_table = service.get_table_client(f"{prefix}audit")
        self.rejected = service.get_table_client(f"{prefix}rejected")
        # Relays' heartbeats (contract §5): read as hints, never as truth.
        self.liveness = Liveness(service, prefix)
        self._recent_events: RecentRows[EventRecord] = RecentRows(RECENT_EVENT_ROWS)
        self._recent_vms: RecentRows[VmRecord] = RecentRows(RECENT_VM_ROWS)
        # What this Store last wrote as each event's due time in the open index (a memo:
        # a reconcile rewrites the index only when that changes; another process's write
        # unknown here costs one more index write, never a wrong one).
        self._due_written: OrderedDict[str, datetime | None] = OrderedDict()
        self._due_lock = threading.Lock()

    @classmethod
    def from_connection_string(cls, connection_string: str, prefix: str = "sebridge") -> Store:
        endpoint = TableServiceClient.from_connection_string(connection_string).url
        service = TableServiceClient.from_connection_string(
            connection_string, **transport_options(endpoint)
        )
        return cls(service, prefix)

    @classmethod
    def from_settings(cls, settings: Any) -> Store:
        kind, value = settings.table_connection()
        if kind == "connection_string":
            return cls.from_connection_string(value, settings.state_table_prefix)
        from azure.identity import DefaultAzureCredential

        service = TableServiceClient(
            endpoint=value, credential=DefaultAzureCredential(), **transport_options(value)
        )
        return cls(service, settings.state_table_prefix)

    def ensure_tables(self) -> Store:
        for name in ("vms", "events", "audit", "rejected", "drains", "identities", "liveness"):
            # A concurrent creator winning is fine.
            with contextlib.suppress(ResourceExistsError):
                self.service.create_table_if_not_exists(f"{self.prefix}{name}")
        return self
