"""Azure handler for the bulk identity sync (functions.pipeline.identity_sync): a timer
every 5 minutes; each run continues a pass in progress or starts one when it is due
(RESOURCE_GRAPH_SYNC_HOURS), within RESOURCE_GRAPH_SYNC_BUDGET_SECONDS; then the fleet's
coverage summary, when due (functions.pipeline.coverage)."""

from __future__ import annotations

import logging

import azure.functions as func

from functions.pipeline.coverage import run_coverage
from functions.pipeline.identity_sync import run_identity_sync
from functions.triggers.core import pipeline

log = logging.getLogger(__name__)

bp = func.Blueprint()

SCHEDULE = "0 */5 * * * *"


@bp.function_name("identity_sync")
@bp.timer_trigger(arg_name="timer", schedule=SCHEDULE, run_on_startup=False)
def identity_sync(timer: func.TimerRequest) -> None:
    report = run_identity_sync(pipeline())
    log.info("identity sync: %s", report.model_dump_json())
    try:  # the fleet's coverage summary, at most once per COVERAGE_EVERY
        done = run_coverage(pipeline())
    except Exception:
        log.exception("coverage pass failed; the next run tries again")
        return
    if done is not None:
        log.info("coverage: %d Table requests", done.requests)
