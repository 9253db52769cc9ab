"""Issues 45 and 46: a slot is held only as long as Azure could mean it, and the bridge's
own approvals never put a budget group over its limit.

- A VM's made-up Started Redeploy with a 366-day DurationInSeconds held its budget group
  for 366 days and 30 minutes (its set-mates waited "for budget checkout (1 of 1:
  attacker)"); a Started event now holds for at most what its type can last
  (`slot_rules.IMPACT_AT_MOST`) and STARTED_GRACE, and not once its VM's own document is
  back to normal.
- An approval whose relay never answered (its StartRequests may have reached Azure) gave
  its slot to the next waiter at once: two VMs out under a budget of one ("peak 2 of 1").
  Its slots now stay until the event is seen Started, or UNKNOWN_HOLD passes.
- One event naming two VMs of a group that allows one was approved for both.
- A 20 % budget was silently cut to one VM per set by `max_concurrent_per_set`.
"""

from __future__ import annotations

from datetime import timedelta

from functions.model.budgets import Budget, Placement
from functions.model.policy import Policy, Rule
from functions.pipeline import slot_rules
from functions.pipeline.ingest import ingest_message
from functions.pipeline.watchdog import run_watchdog
from functions.store.budget_slots import BudgetSlots
from functions.store.placements import Placements
from tests.functions.conftest import (  # noqa: F401  (fixtures)
    T0,
    clock,
    envelope,
    event,
    make_pipeline,
    new_relay,
    relay,
    store,
    write_liveness,
)

BUDGET = Budget(name="checkout", group_by=("tag:service",), max_unavailable=1)
POLICY = Policy(rules=(Rule(name="all", action="approve"),), budgets=(BUDGET,))
GROUP = "tag:service=checkout"
YEAR = 366 * 24 * 3600


def _place(store, *names: str, scale_set: str | None = None) -> None:  # noqa: F811
    rows = [
        Placement(
            name=name,
            vm_id=f"vmid-{name}",
            zone=str(index + 1),
            scale_set=scale_set or f"ss-{index}",
            tags={"service": "checkout"},
            fetched_at=T0,
        )
        for index, name in enumerate(names)
    ]
    Placements(store.service.get_table_client(f"{store.prefix}identities")).put(rows)


def _holders(store) -> list[str]:  # noqa: F811
    slot = BudgetSlots(store.events).get_budget_slot("checkout", GROUP)
    return [h.vm for h in slot.holders] if slot else []


def _sweep(pipeline, store, clock, *names: str) -> None:  # noqa: F811
    for name in names:  # their relays are alive (heartbeats)
        write_liveness(store, name, clock.now())
    run_watchdog(pipeline)


def test_a_made_up_year_long_started_redeploy_holds_its_budget_an_hour_at_most(
    store,  # noqa: F811
    clock,  # noqa: F811
    relay,  # noqa: F811
):
    _place(store, "attacker", "victim")
    pipeline, _ = make_pipeline(store, clock, POLICY)
    made_up = event("MADE-UP", "Redeploy", status="Started", resources=("attacker",))
    made_up.update(NotBefore="", DurationInSeconds=YEAR)
    where = {"callback_url": relay.url}
    ingest_message(envelope("attacker", 1, [made_up], observed_at=clock.now(), **where), pipeline)
    assert _holders(store) == ["attacker"]  # counted: Azure (it says) started it
    mine = event("EV-V", "Reboot", resources=("victim",), not_before=T0 + timedelta(hours=3))
    ingest_message(envelope("victim", 1, [mine], observed_at=clock.now(), **where), pipeline)
    assert relay.starts() == []
    assert store.get_event("EV-V").waiting_for == "waiting for budget checkout (1 of 1: attacker)"
    # The attacker keeps listing it Started and keeps heartbeating: no silence ends it.
    for seq, minutes in enumerate((20, 40, 59), start=2):
        clock.advance(minutes * 60 - (clock.now() - T0).total_seconds())
        ingest_message(
            envelope("attacker", seq, [made_up], observed_at=clock.now(), **where), pipeline
        )
        _sweep(pipeline, store, clock, "attacker", "victim")
        assert relay.starts() == [], minutes  # within what a Redeploy can last
    clock.advance(2 * 60)  # 61 min: 30 min of Redeploy impact at most, and 30 min of grace
    ingest_message(envelope("attacker", 9, [made_up], observed_at=clock.now(), **where), pipeline)
    _sweep(pipeline, store, clock, "attacker", "victim")
    assert relay.starts() == ["EV-V"]  # before: waiting for 366 days and 30 minutes
    assert _holders(store) == ["victim"]


def test_the_longest_hold_of_a_started_event_is_its_types(store):  # noqa: F811
    record = _started(store, "Redeploy", YEAR)
    until = slot_rules.started_until(record)
    assert until - record.started_at == timedelta(minutes=60)
    assert slot_rules.started_until(_started(store, "Freeze", YEAR)) - record.started_at == (
        timedelta(minutes=31)
    )
    short = _started(store, "Reboot", 5)  # what a VM says, when shorter, is what counts
    assert slot_rules.started_until(short) - short.started_at == timedelta(minutes=30, seconds=5)


def _started(store, event_type: str, duration: int):  # noqa: F811
    from functions.store.records import EventRecord

    return EventRecord(
        event_id="X",
        event_type=event_type,
        event_status="Started",
        duration_in_seconds=duration,
        first_seen=T0,
        started=True,
        started_at=T0,
    )


def test_a_set_mates_listing_keeps_no_budget_slot_for_a_vm_back_to_normal(
    store,  # noqa: F811
    clock,  # noqa: F811
    relay,  # noqa: F811
):
    """A shared Freeze of two VMs: both counted when it starts. The victim's own document
    is back to normal; the set-mate keeps listing it Started. The victim's slot in its
    budget group goes back (its own view), so its next event is not held by it."""
    freeze = event("EV-F", "Freeze", status="Started", resources=("victim", "mate"))
    freeze.update(NotBefore="", DurationInSeconds=30)
    _place(store, "victim", "other")
    other = Placement(name="mate", vm_id="vmid-mate", tags={"service": "web"}, fetched_at=T0)
    Placements(store.service.get_table_client(f"{store.prefix}identities")).put([other])
    pipeline, _ = make_pipeline(store, clock, POLICY)
    where = {"callback_url": relay.url}
    ingest_message(envelope("victim", 1, [freeze], observed_at=clock.now(), **where), pipeline)
    ingest_message(envelope("mate", 1, [freeze], observed_at=clock.now(), **where), pipeline)
    assert _holders(store) == ["victim"]
    clock.advance(60)
    ingest_message(envelope("victim", 2, [], observed_at=clock.now(), **where), pipeline)
    later = event("EV-O", "Reboot", resources=("other",), not_before=T0 + timedelta(hours=1))
    ingest_message(envelope("mate", 2, [freeze], observed_at=clock.now(), **where), pipeline)
    clock.advance(60)  # past the take grace
    ingest_message(envelope("other", 1, [later], observed_at=clock.now(), **where), pipeline)
    assert relay.starts() == ["EV-O"]  # before: waiting for budget checkout (1 of 1: victim)
    assert _holders(store) == ["other"]


def test_an_approval_whose_answer_never_came_keeps_its_slot(store, clock, relay):  # noqa: F811
    """Issue 45's "peak 2 of 1": co-a's relay takes StartRequests, but its answer never
    comes (the app's deadline passes first). Its slot is not handed to co-b until co-a is
    seen Started and back."""
    _place(store, "co-a", "co-b")
    pipeline, _ = make_pipeline(store, clock, POLICY)
    relay.drop = {"EV-A"}
    where = {"callback_url": relay.url}
    one = event("EV-A", resources=("co-a",), not_before=T0 + timedelta(minutes=15))
    two = event("EV-B", resources=("co-b",), not_before=T0 + timedelta(minutes=20))
    ingest_message(envelope("co-a", 1, [one], observed_at=clock.now(), **where), pipeline)
    reached = [r for r in relay.requests if r.get("dropped")]
    assert reached and store.get_event("EV-A").approval == "pending"
    ingest_message(envelope("co-b", 1, [two], observed_at=clock.now(), **where), pipeline)
    assert "EV-B" not in relay.starts()  # before: co-b approved while co-a may be going out
    assert store.get_event("EV-B").waiting_for == "waiting for budget checkout (1 of 1: co-a)"
    audit = [r["outcome"] for r in store.audit_rows("EV-A")]
    assert "outcome unknown" in audit  # said, not silent
    # co-a's IMDS had taken it: Azure starts it, and it is back a minute later.
    clock.advance(30)
    started = {**one, "EventStatus": "Started", "NotBefore": ""}
    ingest_message(envelope("co-a", 2, [started], observed_at=clock.now(), **where), pipeline)
    _sweep(pipeline, store, clock, "co-a", "co-b")
    assert "EV-B" not in relay.starts()
    clock.advance(60)
    ingest_message(envelope("co-a", 3, [], observed_at=clock.now(), **where), pipeline)
    assert relay.starts()[-1] == "EV-B"
    assert _holders(store) == ["co-b"]


def test_an_unknown_outcome_is_settled_by_the_relays_next_answer_or_lapses(
    store,  # noqa: F811
    clock,  # noqa: F811
    relay,  # noqa: F811
):
    """The relay's next answer to the same AttemptId says what happened: a refusal gives
    the slot back. With no answer and no start, it lapses after UNKNOWN_HOLD, as an
    approved event's slot would."""
    _place(store, "co-a", "co-b")
    pipeline, _ = make_pipeline(store, clock, POLICY)
    relay.drop = {"EV-A"}
    where = {"callback_url": relay.url}
    one = event("EV-A", resources=("co-a",), not_before=T0 + timedelta(hours=2))
    two = event("EV-B", resources=("co-b",), not_before=T0 + timedelta(hours=2, minutes=5))
    ingest_message(envelope("co-a", 1, [one], observed_at=clock.now(), **where), pipeline)
    ingest_message(envelope("co-b", 1, [two], observed_at=clock.now(), **where), pipeline)
    assert "EV-B" not in relay.starts()
    record = store.get_event("EV-A")
    until = slot_rules.unknown_until(record)
    assert until == record.approval_attempts[-1].at + slot_rules.UNKNOWN_HOLD
    assert slot_rules.holds_slot(record, until - timedelta(seconds=1))
    assert not slot_rules.holds_slot(record, until)
    relay.drop = set()
    relay.script = [(400, {"error": "no such event in my IMDS"})]  # co-a's relay: refused
    clock.advance(60)
    _sweep(pipeline, store, clock, "co-a", "co-b")
    assert store.get_event("EV-A").approval == "failed"
    assert relay.starts()[-1] == "EV-B"
    assert _holders(store) == ["co-b"]


def test_one_event_naming_more_vms_of_a_group_than_it_allows_is_not_approved_early(
    store,  # noqa: F811
    clock,  # noqa: F811
    relay,  # noqa: F811
):
    _place(store, "co-a", "co-b")
    pipeline, _ = make_pipeline(store, clock, POLICY)
    both = event("EV-2", resources=("co-a", "co-b"), not_before=T0 + timedelta(minutes=15))
    where = {"callback_url": relay.url}
    ingest_message(envelope("co-a", 1, [both], observed_at=clock.now(), **where), pipeline)
    ingest_message(envelope("co-b", 1, [both], observed_at=clock.now(), **where), pipeline)
    _sweep(pipeline, store, clock, "co-a", "co-b")
    assert relay.starts() == []  # before: approved, two out under a budget of one
    record = store.get_event("EV-2")
    assert record.approval == "pending"
    assert record.waiting_for.startswith("waiting for budget checkout: the event names 2")
    assert _holders(store) == []
    # Nor does it keep anyone else waiting: it is not listed as a waiter.
    slot = BudgetSlots(store.events).get_budget_slot("checkout", GROUP)
    assert slot is None or slot.waiting == []


def test_a_budget_replaces_the_per_set_guard_for_the_vms_it_covers(store, clock, relay):  # noqa: F811
    """Two VMs of one scale set under a budget of 2 (max_concurrent_per_set stays 1): both
    go at once. Before: the per-set guard held the second, whatever the budget said."""
    _place(store, "b-0", "b-1", scale_set="batch")
    two = Budget(name="checkout", group_by=("tag:service",), max_unavailable=2)
    policy = Policy(rules=(Rule(name="all", action="approve"),), budgets=(two,))
    pipeline, _ = make_pipeline(store, clock, policy)
    where = {"callback_url": relay.url, "scale_set": "batch"}
    for name, event_id in (("b-0", "EV-0"), ("b-1", "EV-1")):
        mine = event(event_id, resources=(name,), not_before=T0 + timedelta(minutes=15))
        ingest_message(envelope(name, 1, [mine], observed_at=clock.now(), **where), pipeline)
    assert sorted(relay.starts()) == ["EV-0", "EV-1"]


def test_a_drain_takes_its_budget_slot_before_the_vm_goes_out(store, clock, relay):  # noqa: F811
    """The default policy drains before it approves (issue 45), and a drained VM is out of
    service: the drain workflow's guard takes the budget's slot, as the approval does.
    Before, it took only the set's, so two VMs of one service in two sets were drained at
    once under a budget of one."""
    from functions.pipeline.capacity import take_capacity

    _place(store, "co-a", "co-b")
    drain = Policy(rules=(Rule(name="all", action="drain"),), budgets=(BUDGET,))
    pipeline, _ = make_pipeline(store, clock, drain)
    where = {"callback_url": relay.url}
    for name, event_id in (("co-a", "EV-A"), ("co-b", "EV-B")):
        mine = event(event_id, resources=(name,), not_before=T0 + timedelta(minutes=15))
        ingest_message(envelope(name, 1, [mine], observed_at=clock.now(), **where), pipeline)
    assert take_capacity(store, "EV-A", pipeline.policy, clock.now())
    assert not take_capacity(store, "EV-B", pipeline.policy, clock.now())  # before: True
    assert _holders(store) == ["co-a"]
    slot = BudgetSlots(store.events).get_budget_slot("checkout", GROUP)
    assert [w.vm for w in slot.waiting] == ["co-b"]
