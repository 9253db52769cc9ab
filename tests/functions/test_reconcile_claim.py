"""The reconcile approves only under the approval claim it took itself (issue 46): it claims
in the write that announces what is due and approves through `approve_claimed`, which
takes no claim of its own. A claim that is no longer this reconcile's by the time it
approves (its lease lapsed in a long drain, another holder took it) asks no relay: the
approval is `skipped`, saying why, and the next reconcile claims it again if it is due."""

from __future__ import annotations

from datetime import timedelta

from functions.model.policy import Policy, Rule
from functions.pipeline import reconcile
from functions.pipeline.due import Due
from functions.pipeline.ingest import ingest_message
from functions.pipeline.results import Reconciled
from functions.store import claims
from tests.functions.conftest import envelope, event, make_pipeline

HOLD = Policy(rules=(Rule(name="all", action="hold"),))


def test_an_approval_whose_claim_is_another_holders_asks_no_relay(store, clock, relay):
    pipeline, _ = make_pipeline(store, clock, HOLD)
    ingest_message(envelope("vm1", 1, [event("EV-C")], callback_url=relay.url), pipeline)
    now = clock.now()

    def taken(rec):
        rec.approval = "in_progress"
        rec.approval_claim = claims.pending(now, timedelta(minutes=2), "another-holder")
        return rec

    record, won = store.mutate_event("EV-C", taken)
    assert won and record is not None
    rows = store.reporter_rows("EV-C")
    assert [r.vm for r in rows] == ["vm1"]
    out = Reconciled("EV-C")
    for me in ("this-reconcile", "another-holder"):
        plan = Due(approve=True)
        reconcile._approve(pipeline, record, plan, me, "policy", now, ((), []), out, None)
        assert out.approval is not None
        assert (out.approval.outcome, out.approval.detail) == (
            "skipped",
            "its approval claim lapsed",
        ), me  # no rows read for it (an ended row): nothing is asked either
    reconcile._approve(
        pipeline, record, Due(approve=True), "this-reconcile", "policy", now, ((), []), out, rows
    )
    assert out.approval.outcome == "skipped"
    assert relay.starts() == []
    # The holder that took it approves under it: the same call, its own claim.
    reconcile._approve(
        pipeline, record, Due(approve=True), "another-holder", "policy", now, ((), []), out, rows
    )
    assert out.approval.outcome == "approved", out.approval.detail
    assert relay.starts() == ["EV-C"]
