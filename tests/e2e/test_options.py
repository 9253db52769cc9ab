"""Which channels the demo serves itself and which it sends to the endpoints in the environment."""

from __future__ import annotations

from local.options import DemoOptions
from local.orchestration import Demo
from local.plan import FLEET, PLAN, Step, check_plan
from local.report import Timeline
from tests.e2e.conftest import clean_env


def test_settings_in_the_environment_replace_the_local_receivers():
    env = clean_env(
        PAGERDUTY_ROUTING_KEY="k" * 32,
        WEBHOOK_URL="https://example.org/hook",
        SLACK_WEBHOOK_URL="https://hooks.slack.com/services/T0/B0/x",
    )
    demo = Demo(DemoOptions(report=None, env=env), Timeline(stream=None))
    try:
        demo._start_receivers()
        assert set(demo.receivers) == {"teams", "drain"}
        assert demo.external == {
            "pagerduty": "https://events.pagerduty.com/v2/enqueue",
            "webhook": "https://example.org/hook",
            "slack": "https://hooks.slack.com/services/T0/B0/x",
        }
    finally:
        demo.close()
    assert not demo.workdir.exists()


def test_the_built_in_plan_fits_the_fleet_and_bad_plans_are_named():
    assert check_plan(PLAN, FLEET) is None
    wrong = (Step(at=0, scenario="preempt", target="nowhere"),)
    assert "unknown target 'nowhere'" in (check_plan(wrong, FLEET) or "")
