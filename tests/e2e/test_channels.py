"""Channels pointed at real URLs from the environment, failing for a while: the approval and
the other channels do not wait, and everything arrives once in the end."""

from __future__ import annotations

import pytest

from local.options import DemoOptions
from local.plan import Step, VmSpec
from local.receivers import TeamsReceiver
from tests.e2e.conftest import clean_env, play

pytestmark = [pytest.mark.slow, pytest.mark.timeout(90)]


def test_a_failing_teams_delays_neither_pagerduty_nor_the_approval():
    with TeamsReceiver() as outside_teams:  # "the real Teams", set through the environment
        outside_teams.fail_next(3, status=503, headers={"Retry-After": "1"})
        options = DemoOptions(
            report=None,
            time_limit=60,
            settle=2,
            fleet=(VmSpec(name="app-1"), VmSpec(name="spot-1", spot=True)),
            plan=(
                Step(at=0, scenario="live-migration", target="app-1", story="approved at once"),
                Step(at=0.5, scenario="preempt", target="spot-1", story="paged"),
            ),
            env=clean_env(TEAMS_WEBHOOK_URL=outside_teams.url),
        )

        def pagerduty_throttles_once(demo):
            demo.receivers["pagerduty"].fail_next(1, status=429, headers={"Retry-After": "0"})

        played = play(options, before=pagerduty_throttles_once)
        teams_posts = outside_teams.received

    assert "teams" not in played.demo.receivers, "Teams must post to the URL from the environment"
    # The approval did not wait for Teams, which was failing at the time.
    migration = played.track("live-migration")
    [approval] = played.approvals("live-migration")
    assert (approval.at - migration.first_seen_wall).total_seconds() < 1.5, played.story()
    first_card = next(r for r in teams_posts if r.accepted and migration.event_id.encode() in r.raw)
    assert first_card.at > approval.at.timestamp()
    # Teams got everything in the end, each card once.
    assert [r.status for r in teams_posts[:3]] == [503, 503, 503]
    accepted_ids = [
        r.body["attachments"][0]["content"]["body"][-1] for r in teams_posts if r.accepted
    ]
    assert len(accepted_ids) == len(
        [d for d in played.demo.deliveries if d.channel == "teams" and d.posted]
    )
    # PagerDuty was throttled once and still paged exactly once for the preemption.
    preempt_id = played.event_id("preempt")
    pagerduty = played.demo.receivers["pagerduty"].received
    assert pagerduty[0].status == 429
    triggers = [
        r
        for r in pagerduty
        if r.accepted
        and r.body["event_action"] == "trigger"
        and r.body["dedup_key"] == f"event:{preempt_id}"
    ]
    assert len(triggers) == 1, played.story()
    delivered = next(o for o in played.outcomes if o.name.startswith("every notification"))
    assert delivered.ok, played.story()


def test_a_post_teams_cannot_take_within_its_deliveries_is_kept_and_sent_late():
    """Issue 40: Teams refuses the first card through all 10 deliveries (5 tries each, as
    the app's retry policy makes them). The demo keeps it, as the app does, instead of
    dead-lettering it (2cd3d60's demo gave 3 deliveries, then dead-lettered it), and sends
    it once Teams answers again, saying how late it is."""
    with TeamsReceiver() as outside_teams:
        outside_teams.fail_next(50, status=503)
        options = DemoOptions(
            report=None,
            time_limit=80,
            settle=6,
            fleet=(VmSpec(name="app-1"),),
            plan=(Step(at=0, scenario="user-reboot", target="app-1", story="approved at once"),),
            env=clean_env(TEAMS_WEBHOOK_URL=outside_teams.url),
        )
        played = play(options)
        posts = outside_teams.received
    assert [r.status for r in posts[:50]] == [503] * 50, played.story()
    late = [r for r in posts if r.accepted and "Late: sent" in r.raw.decode("utf-8", "replace")]
    assert len(late) == 1, played.story()
    assert all(not sub.dead_letters for sub in played.demo.subscriptions)
    delivered = next(o for o in played.outcomes if o.name.startswith("every notification"))
    assert delivered.ok, played.story()
