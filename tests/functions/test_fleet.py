"""Fleet-wide: concurrency dedupe, capacity guard, windows, approval retries and fallback,
and the watchdog."""

from __future__ import annotations

import threading
from datetime import timedelta

import requests

from functions.model.policy import Match, Policy, Rule, Window
from functions.pipeline.approve import approve_event
from functions.pipeline.context import Pipeline
from functions.pipeline.ingest import ingest_message
from functions.pipeline.publish import LocalPublisher
from functions.pipeline.watchdog import run_watchdog
from functions.store.state import Store
from tests import identity_harness
from tests.functions.conftest import (
    T0,
    envelope,
    event,
    make_pipeline,
    make_settings,
    write_liveness,
)


def test_same_event_from_40_vms_concurrently_is_decided_approved_announced_once(
    azurite, store, clock, new_relay
):
    vms = [f"as-{i}" for i in range(40)]
    relays = {vm: new_relay() for vm in vms}
    ev = event("EV-FLEET", "Reboot", source="User", resources=tuple(vms))
    publisher = LocalPublisher()
    settings = make_settings()
    barrier = threading.Barrier(len(vms))
    errors: list[BaseException] = []

    def one(index: int, vm: str) -> None:
        try:
            own = Store.from_connection_string(azurite, store.prefix)  # its own TableClients
            pipeline = Pipeline(
                own,
                settings,
                publisher,
                requests.Session(),
                clock,
                admission=identity_harness.admission(own, clock.now),
            )
            body = envelope(vm, 1, [ev], callback_url=relays[vm].url, availability_set="as")
            barrier.wait()
            ingest_message(body, pipeline)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(i, vm)) for i, vm in enumerate(vms)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert publisher.transitions("EV-FLEET") == ["scheduled", "decided", "approved"]
    assert publisher.duplicates == []
    assert sum(len(r.requests) for r in relays.values()) == 1
    record = store.get_event("EV-FLEET", reporters=True)
    assert set(record.reporters) == set(vms)
    assert len(store.audit_rows("EV-FLEET")) == 2  # the decision, the approval


def test_capacity_guard_one_impactful_approval_per_set(store, clock, relay):
    policy = Policy(rules=(Rule(name="all", action="approve"),), max_concurrent_per_set=1)
    pipeline, _pub = make_pipeline(store, clock, policy)
    ss = {"scale_set": "web", "callback_url": relay.url}
    ingest_message(envelope("web_0", 1, [event("E-0", resources=("web_0",))], **ss), pipeline)
    ingest_message(envelope("web_1", 1, [event("E-1", resources=("web_1",))], **ss), pipeline)
    # A short Freeze does not count against the limit.
    ingest_message(
        envelope("web_2", 1, [event("E-F", "Freeze", resources=("web_2",), duration=3)], **ss),
        pipeline,
    )
    assert relay.starts() == ["E-0", "E-F"]
    waiting = store.get_event("E-1")
    assert waiting.approval == "pending" and "waiting" in waiting.decision.reason
    assert "waiting for capacity" in [r["outcome"] for r in store.audit_rows("E-1")]
    run_watchdog(pipeline)
    assert relay.starts() == ["E-0", "E-F"]  # still full
    # E-0 completes: its slot goes back and wakes the event waiting for it at once (a
    # unit of work of its own; reconciled in turn here), not a sweep later.
    ingest_message(envelope("web_0", 2, [], **ss), pipeline)
    assert relay.starts() == ["E-0", "E-F", "E-1"]
    assert run_watchdog(pipeline).approvals == []


def test_window_defers_approval_until_it_opens(store, clock, relay):
    # T0 is Saturday 2026-11-21 10:00 UTC = 11:00 in Oslo; the window opens at 12:00 Oslo.
    policy = Policy(
        rules=(Rule(name="reboots", match=Match(event_types=("Reboot",)), action="approve"),),
        windows=(Window(days=("Sat",), start="12:00", end="14:00"),),
        timezone="Europe/Oslo",
    )
    pipeline, _pub = make_pipeline(store, clock, policy)
    ev = event("E-W", not_before=T0 + timedelta(hours=3))
    ingest_message(envelope("vm1", 1, [ev], callback_url=relay.url), pipeline)
    decision = store.get_event("E-W").decision
    assert decision.approve_after == T0 + timedelta(hours=1)
    assert relay.requests == []
    clock.advance(30 * 60)
    ingest_message(envelope("vm1", 2, None, kind="heartbeat", callback_url=relay.url), pipeline)
    run_watchdog(pipeline)
    assert relay.requests == []
    clock.advance(31 * 60)
    ingest_message(envelope("vm1", 3, None, kind="heartbeat", callback_url=relay.url), pipeline)
    report = run_watchdog(pipeline)
    assert [a.outcome for a in report.approvals] == ["approved"]
    assert relay.starts() == ["E-W"]


def test_window_after_not_before_means_hold(store, clock, relay):
    policy = Policy(
        rules=(Rule(name="reboots", action="approve"),),
        windows=(Window(days=("Sun",), start="01:00", end="02:00"),),
    )
    pipeline, _pub = make_pipeline(store, clock, policy)
    ingest_message(envelope("vm1", 1, [event("E-H")], callback_url=relay.url), pipeline)
    decision = store.get_event("E-H").decision
    assert decision.action == "hold" and "NotBefore" in decision.reason
    assert relay.requests == []


def test_approval_retries_5xx_then_succeeds(store, clock, relay):
    relay.script = [(503, {"error": "imds busy"}), (500, {"error": "x"})]
    pipeline, _pub = make_pipeline(store, clock)
    result = ingest_message(
        envelope("vm1", 1, [event("E-R", source="User")], callback_url=relay.url), pipeline
    )
    approval = result.approvals[0]
    assert approval.outcome == "approved"
    assert [a.outcome for a in approval.attempts][:2] == ["503 imds busy", "500 x"]
    assert clock.slept == [1.0, 2.0]  # backoff between rounds
    assert len(store.get_event("E-R").approval_attempts) == 3


def test_a_refusing_relay_is_not_retried_and_another_vm_approves(store, clock, new_relay):
    refuser, good = new_relay(), new_relay()
    refuser.default = (409, {"error": "event not in this VM's document"})
    pipeline, _pub = make_pipeline(store, clock)
    ev = event("E-FB", source="User", resources=("vm1", "vm2"))
    ingest_message(envelope("vm2", 1, [ev], callback_url=good.url), pipeline)
    store.mutate_event("E-FB", lambda r: r.model_copy(update={"approval": ""}))
    good.requests.clear()
    ingest_message(envelope("vm1", 1, [ev], callback_url=refuser.url), pipeline)
    result = approve_event(
        "E-FB",
        Pipeline(
            store,
            pipeline.settings,
            pipeline.publisher,
            pipeline.session,
            clock,
            admission=pipeline.admission,
        ),
        announce=False,
    )
    assert result.outcome == "approved" and result.vm == "vm2"
    assert len(refuser.requests) == 1 and len(good.requests) == 1


def test_no_relay_can_approve_announces_approval_failed(store, clock, relay):
    relay.default = (503, {"error": "down"})
    pipeline, pub = make_pipeline(store, clock, approval_budget_seconds=3600)
    ev = event("E-AF", source="User", not_before=T0 + timedelta(seconds=40))
    result = ingest_message(envelope("vm1", 1, [ev], callback_url=relay.url), pipeline)
    assert result.approvals[0].outcome == "failed"
    assert pub.transitions("E-AF") == ["scheduled", "decided", "approval_failed"]
    failed = pub.published[-1]
    assert failed.page is True and "NotBefore" in failed.detail
    assert clock.now() <= ev_deadline(ev_not_before=T0 + timedelta(seconds=40))
    assert store.get_event("E-AF").approval == "failed"


def ev_deadline(ev_not_before):
    return ev_not_before - timedelta(seconds=10)


def test_budget_exhausted_leaves_it_to_the_watchdog(store, clock, relay):
    relay.script = [(503, {})] * 3
    pipeline, pub = make_pipeline(store, clock, approval_budget_seconds=5)
    ingest_message(
        envelope("vm1", 1, [event("E-B", source="User")], callback_url=relay.url), pipeline
    )
    assert store.get_event("E-B").approval == "pending"
    assert pub.transitions("E-B") == ["scheduled", "decided"]
    ingest_message(envelope("vm1", 2, None, kind="heartbeat", callback_url=relay.url), pipeline)
    report = run_watchdog(pipeline)
    assert [a.outcome for a in report.approvals] == ["approved"]
    assert pub.transitions("E-B") == ["scheduled", "decided", "approved"]


def test_watchdog_silent_relay_and_overdue_once_each(store, clock):
    pipeline, pub = make_pipeline(store, clock)
    ingest_message(
        envelope("vm1", 1, [event("E-O", not_before=T0 + timedelta(minutes=5))]), pipeline
    )
    write_liveness(store, "vm1", clock.now())  # its relay's last liveness row
    clock.advance(6 * 60)
    ingest_message(envelope("vm1", 2, None, kind="heartbeat"), pipeline)
    first = run_watchdog(pipeline)
    second = run_watchdog(pipeline)
    assert first.overdue == ["E-O"] and second.overdue == []
    clock.advance(11 * 60)
    assert run_watchdog(pipeline).silent == ["vm1"]
    assert run_watchdog(pipeline).silent == []
    silent = [n for n in pub.published if n.transition == "relay_silent"]
    assert len(silent) == 1 and silent[0].vm == "vm1" and silent[0].page is True
    # Heard again, then silent again: announced again (a new occurrence).
    ingest_message(envelope("vm1", 3, None, kind="heartbeat"), pipeline)
    clock.advance(11 * 60)
    assert run_watchdog(pipeline).silent == ["vm1"]
    ids = [n.message_id() for n in pub.published if n.transition == "relay_silent"]
    assert len(set(ids)) == 2


def test_event_ends_when_every_reporter_went_silent_after_not_before(store, clock):
    pipeline, pub = make_pipeline(store, clock)
    ingest_message(
        envelope("vm1", 1, [event("E-S", not_before=T0 + timedelta(minutes=1))]), pipeline
    )
    write_liveness(store, "vm1", clock.now())
    clock.advance(15 * 60)
    report = run_watchdog(pipeline)
    assert report.ended == ["E-S"]
    assert pub.transitions("E-S")[-1] == "completed"
    assert "silent" in pub.published[-1].detail


def test_a_set_mates_report_is_left_out_and_the_named_vm_approves_when_it_reports(
    store, clock, relay
):
    """vm1 sees vm2's event in its document (one availability set): not its to report."""
    pipeline, pub = make_pipeline(store, clock)
    ev = event("E-MATE", source="User", resources=("vm2",))
    first = ingest_message(envelope("vm1", 1, [ev], availability_set="as"), pipeline)
    assert first.ignored_events == 1 and first.approvals == []
    assert store.get_event("E-MATE") is None
    second = ingest_message(
        envelope("vm2", 1, [ev], availability_set="as", callback_url=relay.url), pipeline
    )
    assert [a.outcome for a in second.approvals] == ["approved"]
    assert pub.transitions("E-MATE") == ["scheduled", "decided", "approved"]
