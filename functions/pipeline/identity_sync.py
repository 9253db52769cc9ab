"""The bulk identity sync as the app runs it: Resource Graph and the identities table of
the pipeline's admission, and the outcome reported to functions.identity.graph_state.

A thin layer over functions.identity.sync (which knows nothing of the pipeline): it finds
the Resource Graph client admission uses, runs a bounded pass, and turns a refusal into the
fleet-wide `config_invalid` announcement (and a later answer into `config_valid`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import timedelta

from functions.identity import graph_state
from functions.identity.facts import ResourceGraphResolver
from functions.identity.resource_graph import ResourceGraphRefused
from functions.identity.sync import SyncReport, sync_identities
from functions.pipeline.context import Pipeline

log = logging.getLogger(__name__)


def run_identity_sync(
    pipeline: Pipeline,
    sleep: Callable[[float], None] = time.sleep,
    monotonic: Callable[[], float] = time.monotonic,
) -> SyncReport:
    """One timer run. Without admission or a Resource Graph resolver (the local host's
    static facts) there is nothing to sync: an empty report that says so."""
    admission = pipeline.admission
    upstream = getattr(admission.identities, "upstream", None) if admission else None
    if admission is None or not isinstance(upstream, ResourceGraphResolver):
        return SyncReport(due=False, error="no Resource Graph resolver configured")
    settings = pipeline.settings
    events = pipeline.store.events
    # The budgets' placements and group sizes (functions.store.placements). With an
    # invalid policy nothing is approved anyway: as without budgets, a pass writes none
    # (and its end deletes the earlier ones); a valid policy starts a pass at once.
    policy = pipeline.policy
    budgets = policy.budgets if policy is not None else ()
    try:
        report = sync_identities(
            upstream.graph,
            admission.registry.table,
            pipeline.clock.now,
            every=timedelta(hours=settings.resource_graph_sync_hours),
            budget_seconds=settings.resource_graph_sync_budget_seconds,
            sleep=sleep,
            monotonic=monotonic,
            budgets=budgets,
        )
    except ResourceGraphRefused as exc:
        log.error("identity sync: %s", exc)
        graph_state.note_refused(events, pipeline.publisher, exc, pipeline.clock.now())
        return SyncReport(error=str(exc)[:1000])
    if report.pages:
        graph_state.note_answered(events, pipeline.publisher, pipeline.clock.now())
    return report
