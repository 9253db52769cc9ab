"""Every post can be kept through a channel's outage (issue 46, "a set-mate can make the
victim's posts too big to keep").

A set-mate adds 998 names to the victim's Resources. On 2f59d6a each of the victim's posts
was then larger than a kept post may be (one Table string property), so on its last
Service Bus delivery during a channel outage it was dead-lettered instead of kept and sent
late. A post is now cut to fit before it is kept: at most 100 names a list (fewer if need
be), the rest counted, and the late post says how many it does not list. For every
channel, on Azurite, with real local receivers.
"""

from __future__ import annotations

import json
import uuid

import pytest
import requests

from functions.model.event import Notification, Transition
from functions.notify import describe, dispatch, kept
from functions.notify.delivery import RetryPolicy, Transport
from functions.notify.settings import ChannelSettings
from functions.store.deliveries import KEPT_BODY_LIMIT, DeliveryLedger
from tests.functions.conftest import FakeClock
from tests.notify.factory import decision, event, note
from tests.notify.receiver import Answer, Receiver, running

CHANNELS = ("teams", "slack", "pagerduty", "webhook")
ADDED = 998


@pytest.fixture
def ledger(azurite: str) -> DeliveryLedger:
    return DeliveryLedger.from_connection_string(
        azurite, "p" + uuid.uuid4().hex[:12]
    ).ensure_table()


def swollen(clock: FakeClock) -> Notification:
    """The victim's event after its set-mate added ADDED long names to its Resources."""
    names = ("victim", *(f"{'m' * 60}-{i:04d}" for i in range(ADDED)))
    snap = event("EV-V", resources=names, reported_by=("victim", "mate"), scale_sets=())
    return note(Transition.DECIDED, snap, decision(page=True), occurred_at=clock.now())


def settings_for(channel: str, receiver: Receiver) -> ChannelSettings:
    return ChannelSettings(
        **{
            "teams": {"teams_webhook_url": f"{receiver.url}/wf"},
            "slack": {"slack_webhook_url": f"{receiver.url}/services/T/B/x"},
            "pagerduty": {
                "pagerduty_routing_key": "0123456789abcdef0123456789abcdef",
                "pagerduty_events_url": f"{receiver.url}/v2/enqueue",
            },
            "webhook": {
                "webhook_url": f"{receiver.url}/hook",
                "webhook_secret": "webhook-secret-0123456789",
            },
        }[channel]
    )


def late_text(channel: str, body: dict) -> str:
    """Where each channel's late post names the VMs, as one string."""
    if channel == "pagerduty":
        return json.dumps(body["payload"])
    return json.dumps(body)


@pytest.mark.parametrize("channel", CHANNELS)
def test_a_post_swollen_by_a_set_mate_is_kept_and_sent_late(
    channel: str, ledger: DeliveryLedger
) -> None:
    clock = FakeClock()
    sender = Transport(
        requests.Session(),
        RetryPolicy(attempts=1, backoff_seconds=0.001, max_wait_seconds=0.01),
        sleep=clock.sleep,
        clock=clock.now,
    )
    decided = swollen(clock)
    assert len(decided.to_json()) > KEPT_BODY_LIMIT  # too large as it stands
    with running(Answer(503)) as receiver:
        settings = settings_for(channel, receiver)
        # The last delivery Service Bus gives it, the channel still down: kept, and the
        # message completed (2f59d6a: "cannot be kept (too large)", dead-lettered).
        dispatch.deliver(
            channel,
            decided.to_json(),
            settings=settings,
            transport=sender,
            ledger=ledger,
            delivery_count=kept.MAX_DELIVERY_COUNT,
        )
        row = ledger.get(decided.message_id(), channel)
        assert row is not None and row.status == "kept", row
        (post,) = ledger.kept(channel)
        assert len(post.body) <= KEPT_BODY_LIMIT
        receiver.default = Answer(202)
        clock.advance(600)
        report = dispatch.resend_kept(channel, settings=settings, transport=sender, ledger=ledger)
    assert report.sent == [decided.message_id()]
    shown = late_text(channel, receiver.requests[-1].json())
    assert "victim" in shown
    assert f"{'m' * 60}-{ADDED - 1:04d}" not in shown  # cut: the last names are counted
    if channel in ("teams", "slack"):
        assert f"{ADDED + 1} VMs" in shown and "more not listed" in shown
    if channel == "pagerduty":
        assert f'"ResourcesNotListed": {ADDED + 1 - kept.KEPT_NAMES}' in shown
    if channel == "webhook":
        assert f'"resources_not_listed": {ADDED + 1 - kept.KEPT_NAMES}' in shown


def test_every_post_fits_whatever_a_vm_makes_its_names_and_texts() -> None:
    """The worst a VM can write: 1,000 names of 128 characters that JSON escapes six-fold,
    in every list, and texts at their longest: the kept body still fits its row."""
    clock = FakeClock()
    worst = "\x01" * 128
    names = tuple(f"{worst}{i:04d}"[-128:] for i in range(1000))
    snap = event(
        "E" * 128,
        event_type=worst,
        resources=names,
        reported_by=names[:100],
        scale_sets=names,
        availability_sets=names,
        description="\x01" * 2000,
    )
    big = note(
        Transition.RELAY_SILENT,
        snap,
        decision(reason="\x01" * 5000),
        detail="\x01" * 5000,
        silent_vms=list(names),
        silent_count=1000,
        occurred_at=clock.now(),
    )
    post = kept.kept_post("teams", big, "HTTP 503", clock.now())
    assert kept.body_units(post.body) <= KEPT_BODY_LIMIT
    back = Notification.from_json(post.body)
    assert back.event is not None and describe.vm_count(back.event) == "1000 VMs"
    assert back.silent_count == 1000
    # A post that fits is kept exactly as it is.
    small = note(Transition.STARTED, event("EV-S"), decision(), occurred_at=clock.now())
    assert kept.kept_post("teams", small, "", clock.now()).body == small.to_json()
