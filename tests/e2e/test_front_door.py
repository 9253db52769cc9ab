"""What a new user trips over first: the example plan, the narration under your own policy,
the comparison with the demo's policy, an invalid policy, a plan that cannot finish."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace

from pydantic import TypeAdapter

from functions.model.event import Decision, EventSnapshot, Notification, Transition
from local.channels import Delivery
from local.options import DemoOptions
from local.orchestration import Demo
from local.outcomes import _announced_once, policy_difference
from local.plan import FLEET, Step, check_plan
from local.watcher import EventTrack

ROOT = Path(__file__).resolve().parents[2]
NOW = datetime.now(UTC)


def _track(event_id: str = "EV-1", not_before: datetime | None = None, **extra) -> EventTrack:
    return EventTrack(
        event_id=event_id,
        event_type="Freeze",
        source="Platform",
        duration=5,
        resources=("web-1",),
        description=None,
        first_seen=0.0,
        first_seen_wall=NOW,
        first_status="Scheduled",
        not_before=not_before or NOW + timedelta(seconds=15),
        **extra,
    )


def test_the_example_plan_ships_and_plays_on_the_fleet():
    path = ROOT / "local" / "plans" / "example.json"
    plan = tuple(TypeAdapter(list[Step]).validate_json(path.read_bytes()))
    assert check_plan(plan, FLEET) is None
    assert "predicted-failure" in {s.scenario for s in plan}
    assert any(not s.story for s in plan)  # narrated from the scenario's own summary
    demo_page = (ROOT / "docs" / "demo.md").read_text()
    assert "--plan local/plans/example.json" in demo_page


def test_steps_are_narrated_and_your_policy_is_not_promised_the_defaults_outcome(tmp_path):
    demo = Demo(DemoOptions(report=None, env={}))
    demo.custom_policy = False
    bare = Step(at=0, scenario="live-migration", target="web-1")
    assert demo._story(bare).startswith("Freeze 5 s, Platform")
    promised = Step(
        at=0, scenario="live-migration", target="web-1", story="Freeze: approved at once"
    )
    assert demo._story(promised) == "Freeze: approved at once"
    demo.custom_policy = True
    assert "approved at once" not in demo._story(promised)
    assert "your policy decides" in demo._story(promised)
    demo.close()


def test_an_event_with_a_notice_beyond_the_time_limit_does_not_hold_the_demo():
    demo = Demo(DemoOptions(report=None, env={}, time_limit=60))
    far = _track("FAR", not_before=NOW + timedelta(hours=2.8))
    near = _track("NEAR")
    demo.watcher = SimpleNamespace(active=lambda: [far, near])
    assert [t.event_id for t in demo._waiting_for()] == ["NEAR"]
    demo.watcher = SimpleNamespace(active=lambda: [far])
    assert demo._waiting_for() == []
    demo.close()


def _note(decision: Decision, transition: Transition = Transition.DECIDED) -> Notification:
    return Notification(
        transition=transition,
        occurred_at=NOW,
        event=EventSnapshot(
            event_id="EV-1",
            event_type="Freeze",
            event_status="Scheduled",
            event_source="Platform",
            resources=("web-1",),
            not_before=NOW + timedelta(minutes=15),
            duration_in_seconds=5,
        ),
        decision=decision,
    )


def test_what_differs_from_the_demos_policy_and_why():
    track = _track()

    def compare(decision, transition=Transition.DECIDED):
        demo = SimpleNamespace(publisher=SimpleNamespace(published=[_note(decision, transition)]))
        return policy_difference(demo, "live-migration on web-1", track)

    held = compare(Decision(action="hold", rule="hold-all", reason="rule 'hold-all': hold"))
    assert held.name.endswith("DIFFERS") and held.skipped and held.ok
    assert "yours: HOLD by rule hold-all" in held.detail
    assert "demo's: APPROVE by rule short-freeze" in held.detail
    dry = compare(Decision(action="approve", rule="short-freeze", dry_run=True))
    assert dry.name.endswith("DIFFERS") and "POLICY__DRY_RUN" in dry.detail
    invalid = compare(
        Decision(action="hold", rule="policy-invalid", policy_error="rules.0.action: bad"),
        Transition.POLICY_INVALID,
    )
    assert invalid.name.endswith("DIFFERS") and "fails closed" in invalid.detail
    same = compare(Decision(action="approve", rule="short-freeze"))
    assert same.name.endswith("same")


def test_an_invalid_policy_still_counts_its_one_card_as_the_decision():
    """Failing closed, the `policy_invalid` card is the decision card: announced once."""
    track = _track(reported_by={"web-1", "web-2"})
    deliveries = [
        Delivery("teams", f"EV-1:{t}", "EV-1", t, True, None) for t in ("policy_invalid", "started")
    ]
    demo = SimpleNamespace(
        recorded_deliveries=lambda: deliveries,
        receivers={},
        external={"teams": "https://teams.example"},
    )
    outcome = _announced_once(demo, "platform-reboot on web-as", track)
    assert outcome.ok, outcome
