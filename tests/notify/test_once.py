"""Each announcement is posted once per channel, across redeliveries and crashes: the
deliveries table (Azurite) against real local receivers and the stand-in topic."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from datetime import timedelta

import pytest
import requests
from azure.core.exceptions import AzureError, ServiceResponseError

from functions.model.event import Transition
from functions.notify import dispatch
from functions.notify.delivery import RetryableDeliveryError, RetryPolicy, Transport
from functions.notify.settings import ChannelSettings
from functions.store.deliveries import DeliveryLedger
from functions.triggers import later
from tests.conftest import free_port
from tests.functions.conftest import FakeClock
from tests.notify.factory import NOW, decision, event, note
from tests.notify.fakebus import Message, Topic
from tests.notify.receiver import Answer, Receiver, running


class Crash(BaseException):
    """The worker process dies here (not an exception the code under test may catch)."""


@pytest.fixture
def ledger(azurite: str) -> DeliveryLedger:
    return DeliveryLedger.from_connection_string(
        azurite, "o" + uuid.uuid4().hex[:12]
    ).ensure_table()


@pytest.fixture
def receivers() -> Iterator[tuple[Receiver, Receiver]]:
    with running(Answer(202)) as teams, running(Answer(204)) as hook:
        yield teams, hook


def settings_for(teams: Receiver, hook: Receiver) -> ChannelSettings:
    return ChannelSettings(
        teams_webhook_url=f"{teams.url}/wf",
        webhook_url=f"{hook.url}/bridge",
        webhook_secret="webhook-secret-0123456789",
    )


def transport(clock: FakeClock | None = None) -> Transport:
    policy = RetryPolicy(attempts=3, backoff_seconds=0.001, max_wait_seconds=0.01)
    if clock is None:
        return Transport(requests.Session(), policy, sleep=lambda _s: None)
    return Transport(requests.Session(), policy, sleep=clock.sleep, clock=clock.now)


DECIDED = note(Transition.DECIDED, event("EV-1"), decision())


def test_a_crash_before_completing_does_not_post_again(receivers, ledger) -> None:
    teams, hook = receivers
    settings, sender = settings_for(teams, hook), transport()
    topic = Topic({"teams": 5, "webhook": 5})
    topic.send(DECIDED.message_id(), DECIDED.to_json().encode())
    crashed: set[tuple[str, int]] = set()

    for name, subscription in topic.subscriptions.items():

        def handle(message: Message, channel: str = name) -> None:
            dispatch.deliver(
                channel, message.body, settings=settings, transport=sender, ledger=ledger
            )
            if message.delivery_count == 1:  # posted, then the host dies before completing
                crashed.add((channel, message.delivery_count))
                raise RuntimeError("worker lost before completing the message")

        subscription.pump(handle)

    assert crashed == {("teams", 1), ("webhook", 1)}
    for subscription in topic.subscriptions.values():
        assert [m.delivery_count for m in subscription.completed] == [2]
    assert len(teams.requests) == 1 and len(hook.requests) == 1
    assert {c: r.status for c, r in ledger.rows("event:EV-1:decided").items()} == {
        "teams": "posted",
        "webhook": "posted",
    }


def test_a_crash_between_post_and_record_posts_again_only_after_the_lease(receivers, ledger):
    """The at-least-once limit: the receiver accepted, the process died before writing
    `posted`. A redelivery waits out the claim's lease (the poster might still be alive),
    then posts again and counts it."""
    teams, hook = receivers
    settings, clock = settings_for(teams, hook), FakeClock(NOW)
    sender = transport(clock)

    class DiesAfterPosting(DeliveryLedger):
        def replace(self, record):  # the `posted` write never happens
            raise Crash

    dying = DiesAfterPosting(ledger.table)
    with pytest.raises(Crash):
        dispatch.deliver(
            "webhook", DECIDED.to_json(), settings=settings, transport=sender, ledger=dying
        )
    assert len(hook.requests) == 1
    left = ledger.get("event:EV-1:decided", "webhook")
    assert left.status == "claimed"
    lease = (left.lease_until - left.claimed_at).total_seconds()
    assert lease == pytest.approx(sender.policy.longest_seconds() + dispatch.CLAIM_SLACK_SECONDS)

    clock.advance(60)  # Service Bus redelivers once the lock (PT1M) expired
    assert dispatch.deliver(
        "webhook", DECIDED.to_json(), settings=settings, transport=sender, ledger=ledger
    )
    assert clock.now() >= left.lease_until  # it waited for the lease, then took over
    assert len(hook.requests) == 2
    assert (
        hook.requests[0].headers["webhook-id"] == hook.requests[1].headers["webhook-id"]
    )  # so the receiver can drop the repeat
    row = ledger.get("event:EV-1:decided", "webhook")
    assert (row.status, row.claims) == ("posted", 2)


def test_a_retryable_failure_releases_the_claim(receivers, ledger) -> None:
    teams, hook = receivers
    teams.script = [Answer(503), Answer(503), Answer(503)]  # one invocation's attempts
    settings, sender = settings_for(teams, hook), transport()
    with pytest.raises(RetryableDeliveryError):
        dispatch.deliver(
            "teams", DECIDED.to_json(), settings=settings, transport=sender, ledger=ledger
        )
    assert ledger.get("event:EV-1:decided", "teams") is None  # free for the redelivery at once
    assert dispatch.deliver(
        "teams", DECIDED.to_json(), settings=settings, transport=sender, ledger=ledger
    )
    assert len(teams.requests) == 4
    assert ledger.get("event:EV-1:decided", "teams").status == "posted"


def test_table_storage_down_means_no_post_and_a_redelivery(receivers) -> None:
    teams, hook = receivers
    closed = (
        "DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey="
        "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==;"
        f"TableEndpoint=http://127.0.0.1:{free_port()}/devstoreaccount1;"
    )
    down = DeliveryLedger.from_connection_string(closed, "down")
    with pytest.raises(AzureError):
        dispatch.deliver(
            "teams",
            DECIDED.to_json(),
            settings=settings_for(teams, hook),
            transport=transport(),
            ledger=down,
        )
    assert teams.requests == []


def test_two_deliveries_at_once_post_once(receivers, ledger) -> None:
    teams, hook = receivers
    teams.default = Answer(202, delay=0.3)  # the first is still posting when the second comes
    settings = settings_for(teams, hook)
    barrier = threading.Barrier(2)
    results: list[bool] = []

    def one() -> None:
        clock = FakeClock(NOW)
        own = Transport(
            requests.Session(),
            RetryPolicy(attempts=1),
            sleep=lambda s: (threading.Event().wait(0.05), clock.sleep(0))[1],
            clock=clock.now,
        )
        barrier.wait()
        results.append(
            dispatch.deliver(
                "teams", DECIDED.to_json(), settings=settings, transport=own, ledger=ledger
            )
        )

    threads = [threading.Thread(target=one) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(results) == [False, True]
    assert len(teams.requests) == 1
    assert ledger.get("event:EV-1:decided", "teams").claims == 1


def test_nothing_to_send_writes_nothing(receivers, ledger) -> None:
    teams, hook = receivers
    scheduled = note(Transition.SCHEDULED, event("EV-2"), decision())
    assert not dispatch.deliver(
        "teams",
        scheduled.to_json(),
        settings=settings_for(teams, hook),
        transport=transport(),
        ledger=ledger,
    )
    assert ledger.rows("event:EV-2:scheduled") == {} and teams.requests == []


def test_table_requests_per_post_and_per_redelivery(receivers, ledger, mocker) -> None:
    """Two writes per post (claim, posted); a redelivery of a posted announcement costs one
    refused insert and one read, and posts nothing."""
    teams, hook = receivers
    settings, sender = settings_for(teams, hook), transport()
    spies = {
        m: mocker.spy(ledger.table, m)
        for m in ("create_entity", "update_entity", "get_entity", "delete_entity")
    }
    assert dispatch.deliver(
        "teams", DECIDED.to_json(), settings=settings, transport=sender, ledger=ledger
    )
    assert {m: s.call_count for m, s in spies.items()} == {
        "create_entity": 1,
        "update_entity": 1,
        "get_entity": 0,
        "delete_entity": 0,
    }
    for spy in spies.values():
        spy.reset_mock()
    assert not dispatch.deliver(
        "teams", DECIDED.to_json(), settings=settings, transport=sender, ledger=ledger
    )
    assert {m: s.call_count for m, s in spies.items()} == {
        "create_entity": 1,
        "update_entity": 0,
        "get_entity": 1,
        "delete_entity": 0,
    }
    assert len(teams.requests) == 1


class AnswerLost(DeliveryLedger):
    """Table storage wrote the first claim, then the connection was reset before its answer
    came back (the chaos suite's storage outage): the caller sees an outage error."""

    lost = 0

    def insert(self, record):
        written = super().insert(record)
        if not self.lost:
            self.lost += 1
            raise ServiceResponseError("Connection aborted: remote end closed the connection")
        return written


def test_a_claim_whose_answer_was_lost_is_taken_back_by_the_same_delivery(receivers, ledger):
    """The delivery's next try through the outage finds its own claim and posts at once; it
    does not wait out the claim's lease as if another invocation were posting (it waited
    the whole lease, four minutes in Azure, an hour of the demo's time at 60x)."""
    teams, hook = receivers
    settings, clock = settings_for(teams, hook), FakeClock(NOW)
    sender = transport(clock)
    flaky = AnswerLost(ledger.table)
    owner = dispatch.claimant()  # one delivery, as functions.triggers.notify._handle
    assert later.hold_through_outage(
        lambda: dispatch.deliver(
            "teams",
            DECIDED.to_json(),
            settings=settings,
            transport=sender,
            ledger=flaky,
            owner=owner,
        ),
        clock.sleep,
    )
    assert flaky.lost == 1 and len(teams.requests) == 1
    assert clock.now() < NOW + timedelta(seconds=sender.policy.longest_seconds())  # no lease
    row = ledger.get("event:EV-1:decided", "teams")
    assert (row.status, row.claims, row.owner) == ("posted", 1, owner)


def test_another_deliverys_claim_is_still_waited_for(receivers, ledger) -> None:
    """What the owner changes, and only that: a claim of another delivery (it may still
    be posting) is waited for until its lease passed, then taken over."""
    teams, hook = receivers
    settings, clock = settings_for(teams, hook), FakeClock(NOW)
    sender = transport(clock)
    with pytest.raises(ServiceResponseError):
        dispatch.deliver(
            "teams",
            DECIDED.to_json(),
            settings=settings,
            transport=sender,
            ledger=AnswerLost(ledger.table),
            owner="first",
        )
    left = ledger.get("event:EV-1:decided", "teams")
    assert dispatch.deliver(
        "teams",
        DECIDED.to_json(),
        settings=settings,
        transport=sender,
        ledger=ledger,
        owner="second",
    )
    assert clock.now() >= left.lease_until and len(teams.requests) == 1
    row = ledger.get("event:EV-1:decided", "teams")
    assert (row.status, row.claims, row.owner) == ("posted", 2, "second")


def test_a_claims_lease_follows_the_transports_time_scale(receivers, ledger) -> None:
    """The local demo plays at 60x, and holds a delivery through an outage at that scale:
    its claims' leases are in the same time, so a claim an outage left behind is taken
    over once the outage ends (local.orchestration)."""
    teams, hook = receivers
    clock = FakeClock(NOW)
    sender = transport(clock)
    sender.lease_scale = 1 / 60

    class DiesAfterPosting(DeliveryLedger):
        def replace(self, record):
            raise Crash

    with pytest.raises(Crash):
        dispatch.deliver(
            "teams",
            DECIDED.to_json(),
            settings=settings_for(teams, hook),
            transport=sender,
            ledger=DiesAfterPosting(ledger.table),
        )
    left = ledger.get("event:EV-1:decided", "teams")
    lease = (left.lease_until - left.claimed_at).total_seconds()
    full = sender.policy.longest_seconds() + dispatch.CLAIM_SLACK_SECONDS
    assert lease == pytest.approx(full / 60)
