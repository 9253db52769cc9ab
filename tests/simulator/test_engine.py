"""The simulator's state machine, driven in-process with a hand-moved clock."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from functions.model.envelope import API_VERSIONS, format_not_before, parse_document
from simulator import EventSpec, NotFound, Simulator, SimulatorError

START = 1_800_000_000.0


class Clock:
    def __init__(self) -> None:
        self.now = START

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock() -> Clock:
    return Clock()


def make(clock: Clock, *vms: str, **kwargs: object) -> Simulator:
    sim = Simulator(clock=clock, **kwargs)  # type: ignore[arg-type]
    for vm in vms:
        sim.add_vm(vm)
    return sim


def events(sim: Simulator, vm: str, version: str = "2020-07-01") -> list[dict]:
    return sim.document(vm, api_version=version)["Events"]


def test_empty_document_starts_at_incarnation_1(clock: Clock) -> None:
    sim = make(clock, "vm0")
    assert sim.document("vm0") == {"DocumentIncarnation": 1, "Events": []}


def test_myvm_exists_implicitly_until_another_vm_is_added(clock: Clock) -> None:
    sim = Simulator(clock=clock)
    assert sim.root_vm() == "myVM"
    assert sim.document("myVM")["DocumentIncarnation"] == 1
    other = Simulator(clock=clock)
    other.add_vm("vm0")
    assert other.root_vm() == "vm0"
    with pytest.raises(NotFound):
        other.document("myVM")


def test_live_migration_replays_the_seed_four_documents(clock: Clock) -> None:
    """SPEC/seed: incarnation 1 empty, 2 Scheduled, 3 Started (NotBefore ""), 4 empty."""
    sim = Simulator(clock=clock)
    sim.add_availability_set("westno", ["WestNO_0", "WestNO_1"])
    (eid,) = sim.play("live-migration", target="westno")
    clock.advance(900)
    sim.tick()
    clock.advance(300)
    sim.tick()
    history = sim.history("WestNO_0")
    assert [d["DocumentIncarnation"] for d in history] == [1, 2, 3, 4]
    docs = [parse_document(d) for d in history]
    assert docs[0].events == () and docs[3].events == ()
    scheduled, started = docs[1].events[0], docs[2].events[0]
    assert scheduled.event_id == started.event_id == eid
    assert (scheduled.event_status, started.event_status) == ("Scheduled", "Started")
    assert scheduled.event_type == "Freeze" and scheduled.duration_in_seconds == 5
    assert scheduled.resources == ("WestNO_0", "WestNO_1")
    assert scheduled.event_source == "Platform"
    assert "Live Migration" in (scheduled.description or "")
    assert history[2]["Events"][0]["NotBefore"] == ""
    assert scheduled.not_before == datetime.fromtimestamp(START + 900, UTC)
    assert sim.history("WestNO_1") == history


def test_wire_field_order_and_notbefore_format(clock: Clock) -> None:
    sim = make(clock, "vm0")
    sim.add_event("Reboot", ["vm0"], notice=600)
    (event,) = events(sim, "vm0")
    assert list(event) == [
        "EventId",
        "EventStatus",
        "EventType",
        "ResourceType",
        "Resources",
        "NotBefore",
        "Description",
        "EventSource",
        "DurationInSeconds",
    ]
    assert event["NotBefore"] == format_not_before(datetime.fromtimestamp(START + 600, UTC))
    assert event["NotBefore"].endswith(" GMT")
    assert event["EventId"] == event["EventId"].upper() and len(event["EventId"]) == 36


def test_incarnation_changes_only_when_content_changes(clock: Clock) -> None:
    sim = make(clock, "vm0", "vm1")
    first = sim.document("vm0")
    clock.advance(10)
    assert sim.document("vm0") == first
    eid = sim.add_event("Freeze", ["vm0"], duration=5)
    second = sim.document("vm0")
    assert second["DocumentIncarnation"] == 2
    clock.advance(60)
    assert sim.document("vm0") == second  # time passing alone changes nothing
    assert sim.document("vm1")["DocumentIncarnation"] == 1  # not its event
    sim.approve("vm0", [eid])
    assert sim.document("vm0")["DocumentIncarnation"] == 3
    sim.approve("vm0", [eid])  # approving again: same content, same incarnation
    assert sim.document("vm0")["DocumentIncarnation"] == 3


def test_time_scale_divides_notice_and_impact(clock: Clock) -> None:
    sim = make(clock, "vm0", time_scale=60)
    (eid,) = sim.play("user-reboot", target="vm0")
    (event,) = events(sim, "vm0")
    assert event["NotBefore"] == format_not_before(datetime.fromtimestamp(START + 15, UTC))
    assert event["EventSource"] == "User" and event["EventType"] == "Reboot"
    clock.advance(14.9)
    assert events(sim, "vm0")[0]["EventStatus"] == "Scheduled"
    clock.advance(0.1)
    assert events(sim, "vm0")[0]["EventStatus"] == "Started"
    clock.advance(9.9)
    assert events(sim, "vm0")[0]["EventId"] == eid
    clock.advance(0.1)
    assert events(sim, "vm0") == []
    assert sim.event(eid).end_reason == "completed"


def test_platform_redeploy_gives_ten_minutes_of_notice(clock: Clock) -> None:
    sim = make(clock, "vm0", time_scale=60)
    (eid,) = sim.play("platform-redeploy", target="vm0")
    (event,) = events(sim, "vm0")
    assert (event["EventType"], event["EventSource"]) == ("Redeploy", "Platform")
    assert event["NotBefore"] == format_not_before(datetime.fromtimestamp(START + 10, UTC))
    clock.advance(10)
    assert events(sim, "vm0")[0]["EventStatus"] == "Started"
    clock.advance(10)
    assert events(sim, "vm0") == [] and sim.event(eid).end_reason == "completed"


def test_a_type_scale_plays_that_type_slower(clock: Clock) -> None:
    """At 60x a Spot eviction's 30 s notice would be 0.5 s; Preempt at 6x gets 5 s (and
    its 60 s impact 10 s) while a Reboot still plays at 60x."""
    sim = make(clock, time_scale=60, type_scales={"preempt": 6})
    sim.add_vm("spot", spot=True)
    sim.add_vm("vm0")
    (evicted,) = sim.play("preempt", target="spot")
    (rebooted,) = sim.play("user-reboot", target="vm0")
    assert sim.event(evicted).not_before == START + 5
    assert sim.event(rebooted).not_before == START + 15
    assert sim.scale_of("Preempt") == 6 and sim.scale_of("Reboot") == 60
    clock.advance(5)
    assert events(sim, "spot")[0]["EventStatus"] == "Started"
    clock.advance(9.9)
    assert events(sim, "spot") != []
    clock.advance(0.1)
    assert events(sim, "spot") == []
    assert sim.state()["type_scales"] == {"preempt": 6.0}
    with pytest.raises(SimulatorError, match="greater than 0"):
        Simulator(type_scales={"Preempt": 0})


@pytest.mark.parametrize(
    ("version", "missing"),
    [
        ("2017-03-01", {"Description", "EventSource", "DurationInSeconds"}),
        ("2017-11-01", {"Description", "EventSource", "DurationInSeconds"}),
        ("2019-01-01", {"Description", "EventSource", "DurationInSeconds"}),
        ("2019-04-01", {"EventSource", "DurationInSeconds"}),
        ("2019-08-01", {"DurationInSeconds"}),
        ("2020-07-01", set()),
    ],
)
def test_older_versions_omit_newer_fields(clock: Clock, version: str, missing: set[str]) -> None:
    sim = make(clock, "vm0")
    sim.add_event("Freeze", ["vm0"], duration=5)
    (event,) = events(sim, "vm0", version)
    all_optional = {"Description", "EventSource", "DurationInSeconds"}
    assert all_optional - set(event) == missing


def test_older_versions_omit_event_types_they_did_not_know(clock: Clock) -> None:
    sim = Simulator(clock=clock)
    sim.add_vm("spot0", spot=True)
    sim.add_scale_set("web", 1)
    sim.play("preempt")
    sim.play("terminate")
    assert events(sim, "spot0", "2017-08-01") == []
    assert [e["EventType"] for e in events(sim, "spot0", "2017-11-01")] == ["Preempt"]
    assert events(sim, "web_0", "2017-11-01") == []
    assert [e["EventType"] for e in events(sim, "web_0", "2019-01-01")] == ["Terminate"]


def test_unknown_api_version_is_refused(clock: Clock) -> None:
    sim = make(clock, "vm0")
    with pytest.raises(SimulatorError, match="api-version"):
        sim.document("vm0", api_version="2021-01-01")
    assert set(API_VERSIONS) >= {"2020-07-01", "2017-08-01"}


def test_any_mode_one_named_approval_starts_for_all_resources(clock: Clock) -> None:
    sim = Simulator(clock=clock)
    sim.add_availability_set("as1", ["a", "b", "c"])
    eid = sim.add_event("Freeze", ["a", "b"], duration=5)
    sim.approve("b", [eid])
    for vm in ("a", "b", "c"):
        (event,) = events(sim, vm)
        assert event["EventStatus"] == "Started" and event["NotBefore"] == ""
        assert event["EventId"] == eid
    (approval,) = sim.approvals
    assert (approval.vm, approval.event_id, approval.counted) == ("b", eid, True)
    assert approval.at == datetime.fromtimestamp(START, UTC)


def test_an_unnamed_set_mate_sees_but_cannot_start_an_event(clock: Clock) -> None:
    sim = Simulator(clock=clock)
    sim.add_availability_set("as1", ["a", "b", "c"])
    eid = sim.add_event("Reboot", ["a"])
    sim.approve("c", [eid])  # IMDS answers 200 and records it
    assert events(sim, "a")[0]["EventStatus"] == "Scheduled"
    assert [(a.vm, a.counted) for a in sim.approvals] == [("c", False)]


def test_all_mode_waits_for_every_resource(clock: Clock) -> None:
    sim = make(clock, approval_mode="all")
    sim.add_availability_set("as1", ["a", "b"])
    eid = sim.add_event("Reboot", ["a", "b"])
    sim.approve("a", [eid])
    sim.approve("a", [eid])
    assert events(sim, "a")[0]["EventStatus"] == "Scheduled"
    sim.approve("b", [eid.lower()])  # EventIds compare case-insensitively
    assert events(sim, "a")[0]["EventStatus"] == "Started"
    assert [a.vm for a in sim.approvals] == ["a", "a", "b"]


def test_approval_of_an_id_not_in_the_document_records_nothing(clock: Clock) -> None:
    sim = make(clock, "vm0", "vm1")
    mine = sim.add_event("Freeze", ["vm0"])
    other = sim.add_event("Freeze", ["vm1"])
    with pytest.raises(NotFound, match=other):
        sim.approve("vm0", [mine, other])
    assert sim.approvals == []
    assert events(sim, "vm0")[0]["EventStatus"] == "Scheduled"


def test_approving_a_started_event_is_recorded_and_harmless(clock: Clock) -> None:
    sim = make(clock, "vm0")
    (eid,) = sim.play("hardware-failure", target="vm0")
    sim.approve("vm0", [eid])
    assert len(sim.approvals) == 1
    assert events(sim, "vm0")[0]["EventStatus"] == "Started"


def test_hardware_failure_appears_directly_as_started(clock: Clock) -> None:
    sim = make(clock, "vm0")
    (eid,) = sim.play("hardware-failure")
    history = sim.history("vm0")
    assert len(history) == 2
    (event,) = history[1]["Events"]
    assert (event["EventType"], event["EventStatus"], event["NotBefore"]) == (
        "Reboot",
        "Started",
        "",
    )
    clock.advance(600)
    assert events(sim, "vm0") == []
    assert sim.event(eid).end_reason == "completed"


def test_cancelled_scenario_is_withdrawn_while_scheduled(clock: Clock) -> None:
    sim = make(clock, "vm0")
    (eid,) = sim.play("cancelled")
    clock.advance(479)
    assert events(sim, "vm0")[0]["EventStatus"] == "Scheduled"
    clock.advance(1)
    assert events(sim, "vm0") == []
    assert sim.event(eid).end_reason == "cancelled"
    assert all(e["EventStatus"] == "Scheduled" for d in sim.history("vm0") for e in d["Events"])


def test_cancel_and_remove(clock: Clock) -> None:
    sim = make(clock, "vm0")
    first = sim.add_event("Reboot", ["vm0"])
    sim.cancel_event(first)
    assert events(sim, "vm0") == []
    second = sim.add_event("Reboot", ["vm0"])
    sim.start_event(second)
    with pytest.raises(SimulatorError, match="only a Scheduled event"):
        sim.cancel_event(second)
    sim.remove_event(second)  # impact shorter than announced
    assert events(sim, "vm0") == []
    with pytest.raises(NotFound):
        sim.remove_event(second)
    with pytest.raises(NotFound):
        sim.start_event("00000000-0000-0000-0000-000000000000")


def test_start_event_keeps_the_event_id(clock: Clock) -> None:
    sim = make(clock, "vm0")
    eid = sim.add_event("Redeploy", ["vm0"], source="User")
    sim.start_event(eid)
    (event,) = events(sim, "vm0")
    assert event["EventId"] == eid and event["EventStatus"] == "Started"
    assert sim.approvals == []


def test_scale_set_terminate_names_only_its_instance_but_all_see_it(clock: Clock) -> None:
    sim = Simulator(clock=clock)
    sim.add_scale_set("web", 3, terminate_timeout=600)
    (eid,) = sim.play("terminate", target="web_1")
    for vm in ("web_0", "web_1", "web_2"):
        (event,) = events(sim, vm)
        assert event["Resources"] == ["web_1"] and event["EventType"] == "Terminate"
        assert event["EventSource"] == "User"
        assert event["NotBefore"] == format_not_before(datetime.fromtimestamp(START + 600, UTC))
    # the default target is the highest instance (scale-in), the default timeout PT5M
    other = Simulator(clock=clock)
    other.add_scale_set("api", 2)
    (eid2,) = other.play("terminate")
    assert other.event(eid2).resources == ["api_1"]
    assert other.event(eid2).not_before == START + 300
    assert eid != eid2


def test_standalone_vms_do_not_see_each_others_events(clock: Clock) -> None:
    sim = make(clock, "a", "b")
    sim.add_event("Freeze", ["a"])
    assert len(events(sim, "a")) == 1
    assert events(sim, "b") == []


def test_preempt_needs_a_spot_vm(clock: Clock) -> None:
    sim = make(clock, "vm0")
    with pytest.raises(SimulatorError, match="Spot"):
        sim.play("preempt")
    with pytest.raises(SimulatorError, match="Spot"):
        sim.play("preempt", target="vm0")
    sim.add_vm("cheap", spot=True)
    (eid,) = sim.play("preempt")
    (event,) = events(sim, "cheap")
    assert event["EventType"] == "Preempt"
    assert sim.event(eid).not_before == START + 30


def test_terminate_needs_a_scale_set(clock: Clock) -> None:
    sim = make(clock, "vm0")
    with pytest.raises(SimulatorError, match="scale set"):
        sim.play("terminate")
    sim.add_availability_set("as1", ["x"])
    with pytest.raises(SimulatorError, match="availability set"):
        sim.play("terminate", target="as1")


@pytest.mark.parametrize(
    ("name", "event_type", "source", "duration", "notice", "impact"),
    [
        ("live-migration", "Freeze", "Platform", 5, 900, 300),
        ("host-maintenance", "Freeze", "Platform", 9, 900, 300),
        ("user-reboot", "Reboot", "User", -1, 900, 600),
        ("user-redeploy", "Redeploy", "User", -1, 600, 600),
        ("platform-reboot", "Reboot", "Platform", -1, 900, 600),
    ],
)
def test_scenario_timings(
    clock: Clock,
    name: str,
    event_type: str,
    source: str,
    duration: int,
    notice: int,
    impact: int,
) -> None:
    sim = make(clock, "vm0")
    (eid,) = sim.play(name)
    (event,) = events(sim, "vm0")
    assert (event["EventType"], event["EventSource"], event["DurationInSeconds"]) == (
        event_type,
        source,
        duration,
    )
    assert sim.event(eid).not_before == START + notice
    clock.advance(notice)
    assert events(sim, "vm0")[0]["EventStatus"] == "Started"
    clock.advance(impact)
    assert events(sim, "vm0") == []


def test_unknown_scenario_and_target(clock: Clock) -> None:
    sim = make(clock, "vm0")
    with pytest.raises(SimulatorError, match="unknown scenario"):
        sim.play("meteor")
    with pytest.raises(NotFound, match="nowhere"):
        sim.play("live-migration", target="nowhere")


def test_add_event_rejects_bad_input(clock: Clock) -> None:
    sim = make(clock, "vm0")
    with pytest.raises(NotFound):
        sim.add_event("Freeze", ["ghost"])
    with pytest.raises(SimulatorError):
        sim.add_event("Freeze", [])
    with pytest.raises(SimulatorError):
        sim.add_event("Freeze", ["vm0"], status="Completed")
    with pytest.raises(SimulatorError):
        sim.add_event("Freeze", ["vm0"], notice=-1)
    with pytest.raises(SimulatorError):
        sim.add_event("Freeze", ["vm0"], duration=-2)
    eid = sim.add_event("Freeze", ["vm0"], event_id="C7061BAC-AFDC-4513-B24B-AA5F13A16123")
    with pytest.raises(SimulatorError, match="already exists"):
        sim.add_event("Freeze", ["vm0"], event_id=eid.lower())
    with pytest.raises(SimulatorError):
        sim.add_vm("vm0")
    with pytest.raises(SimulatorError):
        sim.add_vm("bad/name")
    with pytest.raises(SimulatorError):
        Simulator(time_scale=0)
    with pytest.raises(SimulatorError):
        Simulator(approval_mode="some")  # type: ignore[arg-type]
    with pytest.raises(SimulatorError):
        sim.add_scale_set("web", 2, terminate_timeout=60)


def test_unknown_event_types_pass_through(clock: Clock) -> None:
    """Azure adds types over time; the simulator must be able to send one."""
    sim = make(clock, "vm0")
    sim.add_event("Hibernate", ["vm0"], notice=60, impact=60)
    (event,) = events(sim, "vm0")
    assert event["EventType"] == "Hibernate"
    assert parse_document(sim.document("vm0")).events[0].event_type == "Hibernate"


def test_several_events_at_once_keep_their_order(clock: Clock) -> None:
    sim = make(clock, "vm0")
    first = sim.add_event("Freeze", ["vm0"], notice=60, impact=30)
    second = sim.add_event("Reboot", ["vm0"], notice=120, impact=30)
    assert [e["EventId"] for e in events(sim, "vm0")] == [first, second]
    clock.advance(60)
    assert [e["EventStatus"] for e in events(sim, "vm0")] == ["Started", "Scheduled"]
    clock.advance(30)
    assert [e["EventId"] for e in events(sim, "vm0")] == [second]


def test_scheduled_specs_play_at_their_offset(clock: Clock) -> None:
    sim = make(clock, "vm0", time_scale=10)
    sim.schedule(EventSpec(scenario="live-migration", at=100))
    sim.schedule(EventSpec.model_validate({"EventType": "Reboot", "Resources": ["vm0"], "at": 50}))
    assert sim.pending == 2 and not sim.idle
    clock.advance(5)
    assert [e["EventType"] for e in events(sim, "vm0")] == ["Reboot"]
    clock.advance(5)
    assert [e["EventType"] for e in events(sim, "vm0")] == ["Reboot", "Freeze"]
    assert sim.pending == 0
    clock.advance(200)
    assert sim.idle


def test_schedule_checks_the_target_at_once(clock: Clock) -> None:
    sim = make(clock, "vm0")
    with pytest.raises(NotFound):
        sim.schedule(EventSpec(scenario="live-migration", target="ghost", at=10))
    with pytest.raises(NotFound):
        sim.schedule(EventSpec.model_validate({"EventType": "Freeze", "Resources": ["ghost"]}))
    assert sim.pending == 0


def test_listener_sees_every_change(clock: Clock) -> None:
    sim = make(clock, "vm0")
    seen: list[tuple[str, int, int]] = []
    sim.subscribe(lambda vm, inc, doc: seen.append((vm, inc, len(doc["Events"]))))
    (eid,) = sim.play("live-migration")
    sim.approve("vm0", [eid])
    clock.advance(300)
    sim.tick()
    assert seen == [("vm0", 2, 1), ("vm0", 3, 1), ("vm0", 4, 0)]


def test_state_describes_everything(clock: Clock) -> None:
    sim = make(clock, "vm0")
    (eid,) = sim.play("live-migration")
    sim.approve("vm0", [eid])
    sim.inject_fault("status", count=None)
    state = sim.state()
    assert state["vms"]["vm0"]["incarnation"] == 3
    (event,) = state["events"]
    assert event["EventId"] == eid and event["approved_by"] == ["vm0"]
    assert event["scenario"] == "live-migration" and event["seen_by"] == ["vm0"]
    assert state["faults"][0]["kind"] == "status"
    assert state["approvals"][0]["event_id"] == eid


def test_comma_separated_targets(clock: Clock) -> None:
    sim = make(clock, "a", "b")
    sim.add_availability_set("as1", ["c", "d"])
    (eid,) = sim.play("platform-reboot", target="a, as1,c")
    assert sim.event(eid).resources == ["a", "c", "d"]
    with pytest.raises(SimulatorError, match="names no VM"):
        sim.play("platform-reboot", target=" , ")


def test_approved_terminate_waits_for_the_pending_one_of_its_scale_set(clock: Clock) -> None:
    """Seed 004: VM_2's approved deletion waits until VM_1's is approved or times out."""
    sim = Simulator(clock=clock)
    sim.add_scale_set("web", 3)
    (first,) = sim.play("terminate", target="web_1")
    clock.advance(60)
    (second,) = sim.play("terminate", target="web_2")
    sim.approve("web_2", [second])
    assert sim.event(second).status == "Scheduled"
    sim.approve("web_1", [first])
    assert (sim.event(first).status, sim.event(second).status) == ("Started", "Started")


def test_a_timed_out_terminate_releases_the_approved_ones(clock: Clock) -> None:
    sim = Simulator(clock=clock)
    sim.add_scale_set("web", 2)
    (first,) = sim.play("terminate", target="web_0")
    clock.advance(60)
    (second,) = sim.play("terminate", target="web_1")
    sim.approve("web_1", [second])
    clock.advance(239)
    assert sim.event(second).status == "Scheduled"
    clock.advance(1)  # web_0's NotBefore passes: it goes, and web_1's approved one with it
    assert (sim.event(first).status, sim.event(second).status) == ("Started", "Started")


def test_simultaneous_terminates_all_need_approval(clock: Clock) -> None:
    sim = Simulator(clock=clock)
    sim.add_scale_set("web", 3)
    ids = sim.play("terminate", target="web_0,web_1")
    assert len(ids) == 2
    nbs = {e["NotBefore"] for e in events(sim, "web_2")}
    assert len(nbs) == 1  # same NotBefore
    sim.approve("web_0", [ids[0]])
    assert [sim.event(i).status for i in ids] == ["Scheduled", "Scheduled"]
    sim.approve("web_1", [ids[1]])
    assert [sim.event(i).status for i in ids] == ["Started", "Started"]


def test_terminates_of_other_scale_sets_do_not_hold_each_other(clock: Clock) -> None:
    sim = Simulator(clock=clock)
    sim.add_scale_set("web", 1)
    sim.add_scale_set("api", 1)
    sim.play("terminate", target="web")
    (api,) = sim.play("terminate", target="api")
    sim.approve("api_0", [api])
    assert sim.event(api).status == "Started"


def test_rolling_maintenance_moves_one_vm_at_a_time(clock: Clock) -> None:
    sim = make(clock, "solo")
    sim.add_availability_set("as1", ["a", "b", "c"])
    (first,) = sim.play("rolling-maintenance")  # default target: the first set
    assert sim.event(first).resources == ["a"]
    seen_by_c = [e["Resources"] for e in events(sim, "c")]
    assert seen_by_c == [["a"]]
    sim.approve("a", [first])
    clock.advance(600)  # a's reboot ends; b gets its event
    (second,) = events(sim, "c")
    assert second["Resources"] == ["b"] and second["EventStatus"] == "Scheduled"
    assert second["NotBefore"] == format_not_before(datetime.fromtimestamp(START + 600 + 900, UTC))
    clock.advance(900 + 600)
    assert [e["Resources"] for e in events(sim, "a")] == [["c"]]
    clock.advance(900 + 600)
    assert events(sim, "a") == [] and sim.idle
    assert events(sim, "solo") == []


def test_predicted_failure_is_days_ahead(clock: Clock) -> None:
    sim = make(clock, "vm0")
    (eid,) = sim.play("predicted-failure")
    assert sim.event(eid).not_before == START + 7 * 24 * 3600
    assert events(sim, "vm0")[0]["EventType"] == "Redeploy"
