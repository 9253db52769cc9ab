"""The shared context every stage of the pipeline is handed whole.

Ingest, the watchdog, the approver and the HTTP triggers need the same five collaborators;
passing them as one object keeps call sites short and lets a test swap one part (a
recording publisher, a fake clock) without threading it through every function.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Protocol

import requests

from functions.approvers.arm import TokenCredential
from functions.approvers.relay import RelayTarget
from functions.clock import Clock
from functions.identity.registry import Identity
from functions.model.policy import Policy
from functions.pipeline.admission import Admission
from functions.pipeline.anchor import relay_of
from functions.pipeline.lanes import RelayLanes
from functions.pipeline.liveness_verifier import RegistryVerifier
from functions.pipeline.publish import Publisher
from functions.settings import Settings
from functions.store.liveness import Verifier
from functions.store.records import VmRecord
from functions.store.state import Store

# Per-VM bounds that must cost nothing to enforce (issue 27): a VM over one costs no Table
# request at all, so flooding buys it nothing. Heartbeats: one VM's liveness is worth one
# write a HEARTBEAT_MIN_SECONDS; more (a relay looping, or a compromised one flooding the
# heartbeats queue) are counted and dropped in memory before any Table request. Kept per
# worker: a VM's heartbeats arrive on its own session, so one worker sees nearly all of
# them; at worst each worker writes one a minute.
HEARTBEAT_MIN_SECONDS = 60  # relays heartbeat every 300 s by default
REMEMBERED_VMS = 200_000  # bounds the memory: about 20 MB at most


class HeartbeatBound:
    """When each VM's heartbeat was last let through, on this worker."""

    def __init__(self, min_seconds: float = HEARTBEAT_MIN_SECONDS) -> None:
        self.interval = timedelta(seconds=min_seconds)
        self._last: OrderedDict[str, datetime] = OrderedDict()
        self._lock = threading.Lock()
        self.dropped = 0

    def allow(self, vm: str, now: datetime) -> bool:
        """True (and remembered) when `vm`'s last heartbeat let through is older than the
        interval; False, counted, otherwise."""
        key = vm.casefold()
        with self._lock:
            last = self._last.get(key)
            if last is not None and now - last < self.interval and now >= last:
                self.dropped += 1
                return False
            self._last[key] = now
            self._last.move_to_end(key)
            while len(self._last) > REMEMBERED_VMS:
                self._last.popitem(last=False)
            return True


class WorkQueue(Protocol):
    """Where the sweep hands the keys of due events (functions.pipeline.watchdog): each
    becomes its own unit of work, reconciled by a worker of its own (Service Bus's
    `reconcile` queue in Azure, the local host's workers), so one slow event never holds
    up another. A sweep's items of one minute are one (duplicate detection on the
    MessageId, functions.pipeline.workqueue.item_id); any other hand-over is its own."""

    def enqueue(self, keys: list[str], now: datetime, *, sweep: bool = False) -> int:
        """Hand `keys` over; returns how many were. `sweep`: found by the sweep, so a
        sweep's items of one minute are one (functions.pipeline.workqueue.item_id)."""
        ...


# Runs the drain workflow (functions.terminate) for an event row: ("drain" | "undrain",
# the row) -> the workflow's outcome. Wired where the drain's settings are known.
Drainer = Callable[[str, object], str]


class Pipeline:
    """The collaborators ingest, the watchdog and the HTTP functions share."""

    def __init__(
        self,
        store: Store,
        settings: Settings,
        publisher: Publisher,
        session: requests.Session,
        clock: Clock,
        credential: TokenCredential | None = None,
        admission: Admission | None = None,
        liveness_verifier: Verifier | None = None,
    ) -> None:
        self.store = store
        self.settings = settings
        self.publisher = publisher
        self.session = session
        self.clock = clock
        # The token credential of the ARM approver; None: built on first use.
        self.credential = credential
        # Who sent a relay message (functions.pipeline.admission); None refuses them all.
        self.admission = admission
        # Vouches for a relay's liveness row (functions.store.liveness): the VM's name when
        # it is genuine. None: no liveness row is believed (the watchdog says so).
        if liveness_verifier is None and admission is not None:
            liveness_verifier = RegistryVerifier(admission.registry)
        self.liveness_verifier = liveness_verifier
        # Per-VM bounds enforced in memory, before any Table request (issue 27).
        self.heartbeat_bound = HeartbeatBound()
        # Where the sweep hands due events; None: it reconciles them itself, in turn (the
        # tests' single-threaded hosts).
        self.work_queue: WorkQueue | None = None
        # The drain workflow, for a drain or undrain due from the row; None: drains run
        # only from the `decided` notification (a host without drain settings).
        self.drainer: Drainer | None = None
        # Each VM's share of this host's workers for approval exchanges (issue 46); None:
        # unbounded (only the bench's negative control turns it off).
        self.relay_lanes: RelayLanes | None = RelayLanes()

    @property
    def policy(self) -> Policy | None:
        return self.settings.policy.policy

    def relay_target(self, vm: VmRecord) -> RelayTarget | None:
        """Where and how to call this VM's relay: Azure's address for its vmId and the key
        its relay gave in an attested message. None when either is unknown."""
        found = self.relay_identity(vm.vm_id) if vm.vm_id else None
        return found[0] if found is not None else None

    def relay_identity(self, vm_id: str) -> tuple[RelayTarget, Identity] | None:
        """The relay of the VM `vm_id` (an attested vmId) with the identity row it came
        from (one point read; then functions.pipeline.anchor.relay_of): None when Azure's
        address or an attested key is unknown."""
        if self.admission is None:
            return None
        try:
            identity = self.admission.registry.get(vm_id)
        except ValueError:  # not a vmId: no row can hold it
            return None
        silent_after = timedelta(seconds=self.settings.relay_silent_after_seconds)
        port = self.admission.callback_port
        return relay_of(identity, port, self.store.liveness, self.clock, silent_after)
