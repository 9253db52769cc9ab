"""The shared context every stage of the pipeline is handed whole.

Ingest, the watchdog, the approver and the HTTP triggers need the same five collaborators;
passing them as one object keeps call sites short and lets a test swap one part (a
recording publisher, a fake clock) without threading it through every function.
"""

from __future__ import annotations

import requests

from functions.approvers.relay import RelayTarget
from functions.clock import Clock
from functions.model.policy import Policy
from functions.pipeline.admission import Admission, callback_url
from functions.pipeline.publish import Publisher
from functions.settings import Settings
from functions.store.records import VmRecord
from functions.store.tables import Store


class Pipeline:
    """The collaborators ingest, the watchdog and the HTTP functions share."""

    def __init__(
        self,
        store: Store,
        settings: Settings,
        publisher: Publisher,
        session: requests.Session,
        clock: Clock,
        credential: object | None = None,
        admission: Admission | None = None,
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

    @property
    def policy(self) -> Policy | None:
        return self.settings.policy.policy

    def relay_target(self, vm: VmRecord) -> RelayTarget | None:
        """Where and how to call this VM's relay: Azure's address for its vmId and the key
        its relay gave in an attested message. None when either is unknown."""
        if self.admission is None or not vm.vm_id:
            return None
        identity = self.admission.registry.get(vm.vm_id)
        if identity is None or not identity.keys:
            return None
        url = callback_url(identity.facts, self.admission.callback_port)
        if url is None:
            return None
        return RelayTarget(url=url, vm_id=identity.facts.vm_id, keys=tuple(identity.keys))
