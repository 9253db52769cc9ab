"""The pure decide step (functions.pipeline.decide) without Azurite: each VM's report of a
shared event is decided on its own view; differing views are recorded and the strictest
decision is the event's."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from functions.model.envelope import ScheduledEvent, VmRef
from functions.model.event import Decision, Transition
from functions.model.policy import Policy, PolicyLoad, sample_rules
from functions.pipeline.decide import (
    VIEW_RESOURCE_CHARS,
    ReportPlan,
    decide_report,
    seen_by,
    view_key,
    view_of,
)
from functions.pipeline.due import due
from functions.pipeline.redecide import redecide
from functions.pipeline.views import (
    TOO_MANY_VIEWS,
    differing_fields,
    own_decision,
    stricter,
    strictest,
)
from functions.store.recent import copy_record
from functions.store.records import MAX_VIEWS, EventRecord

NOW = datetime(2026, 11, 21, 10, 0, tzinfo=UTC)
LATER = NOW + timedelta(hours=1)
# Microsoft's sample (opt-in hold): a short Freeze approved, a long one held.
POLICY = PolicyLoad(policy=Policy(rules=sample_rules()))


def freeze(
    duration: int, resources: tuple[str, ...] = ("victim", "mate"), **extra
) -> ScheduledEvent:
    fields = {
        "EventId": "EV-1",
        "EventStatus": "Scheduled",
        "EventType": "Freeze",
        "ResourceType": "VirtualMachine",
        "Resources": resources,
        "NotBefore": "Sat, 21 Nov 2026 10:15:00 GMT",
        "EventSource": "Platform",
        "DurationInSeconds": duration,
        **extra,
    }
    return ScheduledEvent.model_validate(fields)


def vm(name: str, scale_set: str | None = None) -> VmRef:
    return VmRef(name=name, availability_set="as-1", scale_set=scale_set)


# What the reconcile by key leaves once it announced a first decision.
ANNOUNCED = {"scheduled": "done", "decided": "done"}


def report(
    row: EventRecord | None, event: ScheduledEvent, ref: VmRef, *args, **kwargs
) -> ReportPlan:
    """`decide_report` as ingest calls it: the VM's view worked out first (`seen_by`), and
    whether the event names the VM (ingest decides only those; these tests also others)."""
    own = seen_by(event, ref.name, ref.scale_set)
    return decide_report(row, event, ref, own, *args, **kwargs)


def written(plan: ReportPlan, before: EventRecord | None = None) -> EventRecord:
    """The row as stored after the plan (the plan's row, or the row unchanged)."""
    row = plan.row if plan.row is not None else before
    assert row is not None
    row.etag = "W/etag"  # as a conditional write would return it
    return row


def test_the_first_report_decides_on_its_view_and_claims_nothing():
    """A writer records and decides; only the reconcile by key claims (docs/lifecycle.md)."""
    plan = report(None, freeze(5), vm("victim"), POLICY, NOW)
    assert plan.row is not None and plan.made
    assert plan.decision is not None and plan.decision.action == "approve"
    assert plan.row.decision == plan.decision
    assert [e.first_vm for e in plan.row.views] == ["victim"]
    assert plan.row.views_differ == []
    assert plan.row.announced == {} and plan.row.approval == ""
    assert plan.view == view_of(freeze(5), "victim")


def test_the_pure_step_never_changes_the_row_it_was_given():
    row = written(report(None, freeze(5), vm("victim"), POLICY, NOW))
    before = row.model_dump_json()
    report(row, freeze(30), vm("mate"), POLICY, LATER)
    assert row.model_dump_json() == before


def test_a_set_mate_with_the_same_view_writes_nothing_and_shares_the_decision():
    row = written(report(None, freeze(5), vm("victim"), POLICY, NOW))
    row.announced = dict(ANNOUNCED)
    plan = report(row, freeze(5), vm("mate"), POLICY, LATER)
    assert plan.row is None and not plan.made
    assert plan.decision == row.views[0].decision
    assert own_decision(row, plan.key, None) == plan.decision


def test_a_longer_duration_reported_first_does_not_decide_for_the_victim():
    """The low finding: the attacker reports the shared Freeze first with a duration that
    the policy holds; the victim's genuine report is decided on its own view (approve).
    Views differ in DurationInSeconds, and the event's decision is the stricter (hold)."""
    attacker = written(report(None, freeze(60), vm("mate"), POLICY, NOW))
    assert attacker.decision is not None and attacker.decision.action == "hold"
    attacker.announced = dict(ANNOUNCED)
    plan = report(attacker, freeze(5), vm("victim"), POLICY, LATER)
    assert plan.decision is not None and plan.decision.action == "approve"
    row = written(plan, attacker)
    assert row.views_differ == ["DurationInSeconds"]
    assert row.decision is not None and row.decision.action == "hold"
    assert {e.first_vm: e.decision.action for e in row.views} == {
        "mate": "hold",
        "victim": "approve",
    }
    # The decision stands (hold was already the stricter), but that the views differ is
    # announced: once, as a re-decision saying so.
    assert not plan.made and Transition.DECIDED.value not in row.announced  # due again
    assert "views differ (DurationInSeconds)" in row.decision.reason
    assert row.redecided_at == LATER
    row.announced[Transition.DECIDED.value] = "done"
    again = report(row, freeze(7), vm("other"), POLICY, LATER + timedelta(seconds=1))
    after = written(again, row)
    assert after.announced.get(Transition.DECIDED.value) == "done"  # told once


def test_a_stricter_view_after_an_approval_was_decided_makes_the_event_stricter():
    """The reverse order: the attacker's forged short duration comes first (approve), the
    victim's genuine view holds. The event's decision becomes hold, announced again as a
    re-decision, and a pending approval is withdrawn."""
    first = written(report(None, freeze(5), vm("mate"), POLICY, NOW))
    first.announced = dict(ANNOUNCED)
    first.approval = "pending"
    plan = report(first, freeze(60), vm("victim"), POLICY, LATER)
    row = written(plan, first)
    assert plan.made and plan.decision is not None and plan.decision.action == "hold"
    assert row.decision is not None and row.decision.action == "hold"
    assert "views differ (DurationInSeconds)" in row.decision.reason
    assert Transition.DECIDED.value not in row.announced and row.redecided_at == LATER
    assert row.approval == "" and "views" in row.approval_reason


def test_names_added_to_resources_are_a_difference_of_their_own():
    row = written(report(None, freeze(5, ("victim",)), vm("victim"), POLICY, NOW))
    padded = report(row, freeze(5, ("victim", "mate")), vm("mate"), POLICY, LATER)
    assert written(padded, row).views_differ == ["Resources"]


def test_a_vm_whose_own_view_moves_replaces_its_entry_and_differs_from_no_one():
    row = written(report(None, freeze(5, ("victim",)), vm("victim"), POLICY, NOW))
    moved = freeze(5, ("victim",), NotBefore="Sat, 21 Nov 2026 10:30:00 GMT")
    plan = report(row, moved, vm("victim"), POLICY, LATER)
    after = written(plan, row)
    assert len(after.views) == 1 and after.views_differ == []
    assert after.views[0].view.not_before == datetime(2026, 11, 21, 10, 30, tzinfo=UTC)


def test_views_beyond_the_bound_are_counted_decided_alone_and_make_the_event_strict():
    row = written(report(None, freeze(5), vm("victim"), POLICY, NOW))
    for n in range(MAX_VIEWS + 2):
        plan = report(row, freeze(100 + n), vm(f"forger{n}"), POLICY, LATER)
        row = written(plan, row)
    assert len(row.views) == MAX_VIEWS and row.views_dropped == 3
    assert TOO_MANY_VIEWS in row.views_differ
    assert not plan.kept and plan.decision is not None  # decided for that VM alone
    # The same VM showing the same dropped view again writes nothing more.
    again = report(
        row, freeze(100 + MAX_VIEWS + 1), vm(f"forger{MAX_VIEWS + 1}"), POLICY, LATER, repeated=True
    )
    assert again.row is None and not again.kept


def test_long_resources_are_kept_by_digest_so_the_views_fit_the_row():
    names = tuple(f"{i:04}" + "n" * 124 for i in range(999))
    row = written(report(None, freeze(5, ("victim", *names)), vm("victim"), POLICY, NOW))
    entry = row.views[0]
    assert entry.view.resources == () and entry.resources_count == 1000
    short = report(row, freeze(5, ("victim",)), vm("mate"), POLICY, LATER)
    after = written(short, row)
    assert after.views_differ == ["Resources"]
    assert sum(len(n) for n in after.views[1].view.resources) <= VIEW_RESOURCE_CHARS


def test_the_reporters_scale_set_is_part_of_what_decides():
    """A rule matching a scale set decides each VM on its own set (Azure's fact)."""
    rules = (
        {"name": "ss", "match": {"scale_sets": ["web"]}, "action": "approve"},
        {"name": "rest", "action": "hold"},
    )
    load = PolicyLoad(policy=Policy.model_validate({"rules": rules}))
    row = written(report(None, freeze(60), vm("a", "web"), load, NOW))
    plan = report(row, freeze(60), vm("b", "db"), load, LATER)
    assert view_key(plan.view, "db") != row.views[0].key
    assert plan.decision is not None and plan.decision.action == "hold"
    assert row.views[0].decision.action == "approve"


def test_an_ended_event_decides_nothing():
    row = written(report(None, freeze(5), vm("victim"), POLICY, NOW))
    row.ended = "cancelled"
    plan = report(row, freeze(60), vm("mate"), POLICY, LATER)
    assert plan.row is None and plan.decision is None


def test_a_fail_closed_event_is_decided_again_per_view_once_the_policy_is_valid():
    broken = PolicyLoad(policy=None, error="bad JSON")
    row = written(report(None, freeze(5), vm("victim"), broken, NOW))
    row = written(report(row, freeze(60), vm("mate"), broken, NOW), row)
    assert row.decision is not None and row.decision.policy_error
    row.announced = dict(ANNOUNCED)
    later = NOW + timedelta(minutes=5)
    # The writer records the report; deciding again is the decider's (reconcile by key).
    plan = report(row, freeze(5), vm("victim"), POLICY, later)
    assert plan.row is None and not plan.made
    assert due(row, POLICY, later).redecide
    after = written(ReportPlan(row=copy_record(row)), row)
    redecide(after, POLICY, later)
    assert {e.first_vm: e.decision.action for e in after.views} == {
        "victim": "approve",
        "mate": "hold",
    }
    assert after.decision is not None and after.decision.action == "hold"
    assert after.decision.policy_error is None and "re-decided" in after.decision.reason


def d(action: str, **extra) -> Decision:
    return Decision(action=action, rule="r", **extra)


@pytest.mark.parametrize(
    ("looser", "stricter_one"),
    [
        (d("approve"), d("drain")),
        (d("drain"), d("hold")),
        (d("approve"), d("hold")),
        (d("approve"), d("approve", approve_after=LATER)),
        (d("approve", approve_after=NOW), d("approve", approve_after=LATER)),
        (d("hold"), d("hold", page=True)),
        (d("hold", severity="warning"), d("hold", severity="error")),
        (d("hold", page=True, severity="critical"), d("hold", policy_error="bad")),
    ],
)
def test_stricter_is_hold_then_drain_then_approve_then_the_later_then_paging(looser, stricter_one):
    assert stricter(looser, stricter_one) is stricter_one
    assert stricter(stricter_one, looser) is stricter_one
    assert strictest([looser, stricter_one, looser]) is stricter_one


def test_a_tie_keeps_the_decision_already_made():
    first, second = d("hold", reason="first"), d("hold", reason="second")
    assert stricter(first, second) is first


def test_differing_fields_names_each_field_once_in_order():
    rows = []
    for n, event in enumerate(
        (freeze(5), freeze(6, EventSource="User"), freeze(5, EventType="Reboot"))
    ):
        row = written(
            report(rows[-1] if rows else None, event, vm(f"v{n}"), POLICY, NOW),
            rows[-1] if rows else None,
        )
        rows.append(row)
    assert differing_fields(rows[-1].views) == ["EventType", "EventSource", "DurationInSeconds"]


def test_sample_rules_are_what_these_tests_assume():
    names = [r.name for r in sample_rules()]
    assert names == ["terminate-drain", "user-initiated", "short-freeze", "default-hold"]


# ------------------------------------------------------------------ the VM's own row


def message(sequence: int, events: list[ScheduledEvent] | None, at: datetime = NOW):
    from functions.model.envelope import parse_envelope

    document = None
    if events is not None:
        wire = [e.model_dump(by_alias=True, mode="json") for e in events]
        document = {"DocumentIncarnation": sequence, "Events": wire}
    return parse_envelope(
        {
            "schema": 1,
            "kind": "document",
            "vm": {"name": "victim", "availability_set": "as-1"},
            "relay_version": "test",
            "sequence": sequence,
            "observed_at": at.isoformat(),
            "document": document,
        }
    )


def test_the_vm_row_after_a_document_is_computed_without_changing_the_row_read():
    from functions.pipeline.decide import next_vm_row

    first, mark = next_vm_row(None, message(1, [freeze(5)]), [freeze(5)], NOW, set(), {"ev-1": "k"})
    assert mark is None and first.last_sequence == 1 and first.event_ids == ["EV-1"]
    assert first.event_views == {"ev-1": "k"} and first.window_new_events == 1
    first.etag = "W/1"
    first.silent_announced_for = "2026-11-21T09:00:00+00:00"
    before = first.model_dump_json()
    soon = NOW + timedelta(minutes=10)
    second, mark = next_vm_row(first, message(2, [], soon), [], soon, set(), {})
    assert first.model_dump_json() == before  # pure
    assert mark == "2026-11-21T09:00:00+00:00" and second.recovery_pending == mark
    assert second.event_ids == [] and second.event_views == {} and second.etag == "W/1"
    assert second.window_messages == 2  # within the same hour


def test_a_redelivered_or_older_document_is_stale():
    from functions.pipeline.decide import is_stale, next_vm_row

    row, _ = next_vm_row(None, message(5, []), [], NOW, set(), {})
    assert is_stale(row, message(5, [], NOW))
    assert is_stale(row, message(4, [], NOW - timedelta(seconds=1)))
    assert not is_stale(row, message(1, [], LATER))  # a reinstalled relay: its clock moved on
    assert not is_stale(None, message(1, []))


def test_the_hourly_bounds_count_messages_and_new_event_ids():
    from functions.pipeline.decide import next_vm_row, over_rate
    from functions.settings import Settings

    settings = Settings(max_messages_per_vm_hour=10, max_new_events_per_vm_hour=5)
    row = None
    for sequence in range(1, 10):
        row, _ = next_vm_row(row, message(sequence, []), [], NOW, set(), {})
    assert over_rate(row, [freeze(5)], NOW, settings) == ""
    row, _ = next_vm_row(row, message(10, []), [], NOW, set(), {})
    assert "MAX_MESSAGES_PER_VM_HOUR" in over_rate(row, [], NOW, settings)
    assert over_rate(row, [], NOW + timedelta(hours=1), settings) == ""  # a new hour
    many = [freeze(5, EventId=f"EV-{i}") for i in range(6)]
    assert "MAX_NEW_EVENTS_PER_VM_HOUR" in over_rate(None, many, NOW, settings)


def test_only_the_vm_whose_view_the_row_shows_moves_its_not_before():
    """A set-mate's report cannot move the NotBefore (the approval deadline, the
    watchdog's overdue, the end's "had started") that the row shows for everyone."""
    row = written(report(None, freeze(5), vm("victim"), POLICY, NOW))
    early = freeze(5, NotBefore="Sat, 21 Nov 2026 10:01:00 GMT", DurationInSeconds=3)
    forged = written(report(row, early, vm("mate"), POLICY, LATER), row)
    assert forged.not_before == row.not_before and forged.duration_in_seconds == 5
    assert forged.views_differ == ["DurationInSeconds", "NotBefore"]


def test_a_reschedule_seen_first_by_a_set_mate_leaves_no_difference_behind():
    row = written(report(None, freeze(5), vm("victim"), POLICY, NOW))
    moved = freeze(5, NotBefore="Sat, 21 Nov 2026 10:30:00 GMT")
    row = written(report(row, moved, vm("mate"), POLICY, NOW), row)
    assert row.views_differ == ["NotBefore"]
    row = written(report(row, moved, vm("victim"), POLICY, NOW), row)
    assert row.views_differ == [] and [e.first_vm for e in row.views] == ["mate"]
    assert row.not_before == datetime(2026, 11, 21, 10, 30, tzinfo=UTC)


# ------------------------------------------------------------------ the whole document


def test_one_pure_step_decides_what_a_whole_document_writes():
    from functions.pipeline.decide import decide_document, next_vm_row
    from functions.settings import Settings

    settings = Settings()
    first_doc = [freeze(5), freeze(5, EventId="EV-2")]
    plan = decide_document(None, {}, message(1, first_doc), first_doc, POLICY, settings, NOW)
    assert plan.refused == "" and plan.absent == []
    assert [(s.open_index, s.reporter, s.settled, s.newcomer) for s in plan.steps] == [
        (True, True, False, True),
        (True, True, False, True),
    ]
    keys = {s.event.event_id.casefold(): s.seen.key for s in plan.steps if s.seen}
    assert plan.views == keys
    # The rows as written; EV-2 ended meanwhile; the next document drops EV-1 and
    # lists EV-2 and a new EV-3.
    rows = {
        "ev-1": written(report(None, freeze(5), vm("victim"), POLICY, NOW)),
        "ev-2": written(report(None, freeze(5, EventId="EV-2"), vm("victim"), POLICY, NOW)),
    }
    for row in rows.values():
        row.announced = dict(ANNOUNCED)
    rows["ev-2"].ended = "cancelled"
    vm_row, _ = next_vm_row(None, message(1, first_doc), first_doc, NOW, set(), plan.views)
    vm_row.etag = "W/vm"
    second = [freeze(5, EventId="EV-2"), freeze(5, EventId="EV-3")]
    soon = NOW + timedelta(seconds=30)
    plan = decide_document(vm_row, rows, message(2, second, soon), second, POLICY, settings, soon)
    ev2, ev3 = plan.steps
    assert ev2.ended and not ev2.open_index and ev2.seen is None
    assert ev3.open_index and ev3.reporter and not ev3.ended
    assert plan.absent == ["EV-1"]
    # The same document again is stale; the same view of a settled event writes nothing.
    assert (
        decide_document(
            vm_row, rows, message(1, first_doc), first_doc, POLICY, settings, soon
        ).refused
        == "stale"
    )
    again = decide_document(
        vm_row, rows, message(2, first_doc[:1], soon), first_doc[:1], POLICY, settings, soon
    )
    (ev1,) = again.steps
    assert ev1.repeated and not ev1.reporter and ev1.settled


def test_a_document_over_the_hourly_bound_is_refused_before_anything_is_decided():
    from functions.pipeline.decide import decide_document
    from functions.settings import Settings

    settings = Settings(max_new_events_per_vm_hour=5)
    many = [freeze(5, EventId=f"EV-{i}") for i in range(6)]
    plan = decide_document(None, {}, message(1, many), many, POLICY, settings, NOW)
    assert plan.refused == "rejected" and "MAX_NEW_EVENTS_PER_VM_HOUR" in plan.reason
    assert plan.steps == []


def test_a_started_report_does_not_disagree_with_a_scheduled_one_about_not_before():
    """IMDS blanks NotBefore once the event Started: one VM seeing it start while its
    set-mate's last view was Scheduled is no difference (the demo's held set reboot was
    announced twice for it); two different NotBefores still are."""
    row = written(report(None, freeze(5), vm("victim"), POLICY, NOW))
    started = freeze(5, EventStatus="Started", NotBefore="")
    after = report(row, started, vm("mate"), POLICY, NOW + timedelta(minutes=15))
    assert written(after, row).views_differ == []
    moved = freeze(5, NotBefore="Sat, 21 Nov 2026 10:20:00 GMT")
    other = report(row, moved, vm("mate"), POLICY, NOW)
    assert written(other, row).views_differ == ["NotBefore"]
