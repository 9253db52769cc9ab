"""The policy_invalid incident resolves itself: one fleet announcement per breakage, one
`policy_valid` once a host runs a valid policy (store row on Azurite, ETag-guarded), and
each event's fail-closed page resolved when it is re-decided. The announcements go through
the real PagerDuty channel code to a local receiver."""

from __future__ import annotations

import pytest
import requests
from azure.core.exceptions import ResourceNotFoundError

from functions.model.event import Transition
from functions.model.policy import PolicyLoad
from functions.notify import dispatch
from functions.notify.delivery import RetryPolicy, Transport
from functions.notify.settings import ChannelSettings
from functions.pipeline.ingest import ingest_message
from functions.pipeline.policy_state import sync_policy_state
from functions.pipeline.publish import LocalPublisher
from functions.pipeline.watchdog import run_watchdog
from tests.functions.conftest import envelope, event
from tests.functions.test_redecide import INVALID, pipeline_for
from tests.functions.test_resilience import FlakyPublisher
from tests.notify.receiver import Answer, running


def fleet_transitions(publisher: LocalPublisher) -> list[str]:
    return [n.message_id() for n in publisher.published if n.event is None]


def test_invalid_then_valid_opens_and_resolves_each_incident_once(store, clock, relay):
    pub = LocalPublisher()
    with running(Answer(202, {"status": "success"})) as pd:
        settings = ChannelSettings(
            pagerduty_routing_key="R0UT1NGKEY0123456789012345678901",
            pagerduty_events_url=f"{pd.url}/v2/enqueue",
        )
        sender = Transport(requests.Session(), RetryPolicy(attempts=1))
        pub.subscribe(
            "pagerduty",
            lambda note: dispatch.deliver(
                "pagerduty", note.to_json(), settings=settings, transport=sender
            ),
        )
        invalid = pipeline_for(store, clock, pub, INVALID)
        freeze = event("EV-F", "Freeze", duration=5)  # valid policy: approve, no page
        ingest_message(envelope("vm1", 1, [freeze], callback_url=relay.url), invalid)
        assert run_watchdog(invalid).policy == "policy_invalid"
        assert run_watchdog(invalid).policy is None  # once per breakage
        clock.advance(60)
        valid = pipeline_for(store, clock, pub)  # fixed: the host restarted
        report = run_watchdog(valid)
        assert report.policy == "policy_valid" and report.redecided == ["EV-F"]
        assert run_watchdog(valid).policy is None
        # An old instance still on the broken policy (rolling restart) does not flap it.
        assert run_watchdog(invalid).policy is None
        actions = [(b["event_action"], b["dedup_key"]) for b in pd.bodies()]
    assert fleet_transitions(pub) == [
        "fleet:policy_invalid:20261121T100000",
        "fleet:policy_valid:20261121T100000",
    ]
    assert actions == [
        ("trigger", "event:EV-F"),  # the event's fail-closed page
        ("trigger", "policy_invalid:fleet"),
        ("resolve", "policy_invalid:fleet"),
        ("resolve", "event:EV-F"),  # re-decided: approve, which does not page
    ]
    assert pub.transitions("EV-F") == ["scheduled", "policy_invalid", "decided", "approved"]
    row = store.events.get_entity("policy", "state")
    assert row["valid"] is True and "rules.0.action" in row["error"]


def test_a_different_breakage_is_a_new_incident(store, clock):
    pub = LocalPublisher()
    assert sync_policy_state(pipeline_for(store, clock, pub, INVALID), clock.now()) is not None
    clock.advance(60)
    assert sync_policy_state(pipeline_for(store, clock, pub), clock.now()) is not None
    clock.advance(60)
    other = PolicyLoad(policy=None, error="windows.0.days: unknown day 'Funday'")
    assert sync_policy_state(pipeline_for(store, clock, pub, other), clock.now()) == (
        Transition.POLICY_INVALID
    )
    assert fleet_transitions(pub)[-1] == "fleet:policy_invalid:20261121T100200"
    assert "Funday" in pub.published[-1].detail and pub.published[-1].page is True


def test_a_valid_policy_with_no_history_writes_nothing(store, clock):
    pub = LocalPublisher()
    assert sync_policy_state(pipeline_for(store, clock, pub), clock.now()) is None
    assert pub.published == []
    with pytest.raises(ResourceNotFoundError):
        store.events.get_entity("policy", "state")


def test_a_failed_publish_is_retried_by_the_next_run(store, clock):
    flaky = FlakyPublisher(failures=1)
    invalid = pipeline_for(store, clock, flaky, INVALID)
    assert run_watchdog(invalid).policy is None  # the publish failed: the row was restored
    assert run_watchdog(invalid).policy == "policy_invalid"
    assert fleet_transitions(flaky) == ["fleet:policy_invalid:20261121T100000"]
