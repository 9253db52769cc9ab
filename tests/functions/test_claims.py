"""The one claim primitive (functions.store.claims) and the acts that use it: a claim left
pending by a crash is redone once stale, never while fresh, never once done."""

from __future__ import annotations

from datetime import timedelta

from functions.pipeline.ingest import ingest_message
from functions.pipeline.lifecycle import approval_lease
from functions.pipeline.watchdog import SILENCE_LEASE, run_watchdog
from functions.store import claims
from tests.functions.conftest import T0, envelope, event, make_pipeline, write_liveness

MINUTE = timedelta(minutes=1)


def test_a_claim_is_a_value_its_holder_and_expiry_written_when_taken():
    """Issue 37: every reader applies one rule, written with the claim: free when it has
    expired or is mine. Nobody picks a staleness of their own."""
    marks: dict[str, str] = {}
    assert claims.take(marks, "a", T0, MINUTE, "doc:vm1:7")
    assert marks["a"] == f"pending:{T0.isoformat()}|{(T0 + MINUTE).isoformat()}|doc:vm1:7"
    assert claims.holder(marks["a"]) == "doc:vm1:7"
    assert claims.expires(marks["a"]) == T0 + MINUTE
    assert not claims.is_free(marks["a"], T0 + MINUTE / 2)  # held, not mine
    assert not claims.is_free(marks["a"], T0 + MINUTE / 2, "doc:vm2:1")
    assert claims.is_free(marks["a"], T0 + MINUTE / 2, "doc:vm1:7")  # mine: act at once
    assert claims.is_free(marks["a"], T0 + MINUTE)  # expired: anyone takes it over
    assert not claims.take(marks, "a", T0 + 2 * MINUTE, MINUTE)  # only with takeover
    assert claims.take(marks, "a", T0 + 2 * MINUTE, MINUTE, "sweep", takeover=True)
    assert claims.finish(marks, ["a"]) and not claims.finish(marks, ["a"])
    assert not claims.is_free("done", T0 + 99 * MINUTE, "sweep")  # done is final
    assert not claims.take(marks, "a", T0 + 99 * MINUTE, MINUTE, takeover=True)
    assert claims.take(marks, "b", T0, MINUTE) and claims.release(marks, ["b"])
    assert "b" not in marks and not claims.release(marks, ["a"])  # done is not released
    assert claims.is_expired("pending:garbage", T0)  # unreadable: taken over
    # Written before claims carried their lease: its writer is gone, so it has expired.
    assert claims.is_expired(f"pending:{T0.isoformat()}", T0)
    assert claims.expired_keys({"x": "done", "y": claims.pending(T0, MINUTE)}, T0 + MINUTE) == ["y"]


def test_a_silence_whose_announcer_crashed_is_announced_once_when_its_claim_is_stale(store, clock):
    pipeline, publisher = make_pipeline(store, clock)
    ingest_message(envelope("vm1", 1, [event("E-1", resources=("vm1",))]), pipeline)
    write_liveness(store, "vm1", clock.now())
    clock.advance(11 * 60)
    last_seen = store.get_vm("vm1").last_seen

    def crashed(rec):  # claimed, then the process died before publishing
        rec.silent_announced_for = last_seen.isoformat()
        rec.silence_claim = claims.pending(clock.now(), SILENCE_LEASE)
        return rec

    store.mutate_vm("vm1", crashed)
    assert run_watchdog(pipeline).silent == []  # fresh claim: someone may be publishing
    clock.advance(4 * 60)
    assert run_watchdog(pipeline).silent == ["vm1"]  # stale: redone
    assert store.get_vm("vm1").silence_claim == claims.DONE
    assert run_watchdog(pipeline).silent == []
    assert [n.transition for n in publisher.published if n.vm] == ["relay_silent"]


def test_an_approval_claim_left_by_a_crash_is_taken_over_after_the_budget(store, clock, relay):
    pipeline, publisher = make_pipeline(store, clock, approval_budget_seconds=30)
    ev = event("E-A", source="User", resources=("vm1",), not_before=T0 + timedelta(hours=1))
    relay.default = (503, {"error": "busy"})
    ingest_message(envelope("vm1", 1, [ev], callback_url=relay.url), pipeline)

    def crashed(rec):
        rec.approval = "in_progress"
        rec.approval_claim = claims.pending(
            clock.now(), approval_lease(pipeline.settings.approval_budget_seconds)
        )
        return rec

    store.mutate_event("E-A", crashed)
    relay.default = (200, {"imds_status": 200})
    assert run_watchdog(pipeline).approvals == []  # the claim is fresh
    clock.advance(91)
    (result,) = run_watchdog(pipeline).approvals
    assert result.outcome == "approved", [a.outcome for a in result.attempts]
    assert store.get_event("E-A").approval_claim == "done"
    assert publisher.transitions("E-A")[-1] == "approved"
