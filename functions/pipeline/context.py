"""The shared context every stage of the pipeline is handed whole.

Ingest, the watchdog, the approver and the HTTP triggers need the same five collaborators;
passing them as one object keeps call sites short and lets a test swap one part (a
recording publisher, a fake clock) without threading it through every function.
"""

from __future__ import annotations

import requests

from functions.clock import Clock
from functions.model.policy import Policy
from functions.pipeline.publish import Publisher
from functions.settings import Settings
from functions.store.liveness import Verifier
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
        liveness_verifier: Verifier | None = None,
    ) -> None:
        self.store = store
        self.settings = settings
        self.publisher = publisher
        self.session = session
        self.clock = clock
        # The token credential of the ARM approver; None: built on first use.
        self.credential = credential
        # Vouches for a relay's liveness row (functions.store.liveness): the VM's name when
        # it is genuine. None: no liveness row is believed (the watchdog says so).
        self.liveness_verifier = liveness_verifier

    @property
    def policy(self) -> Policy | None:
        return self.settings.policy.policy
