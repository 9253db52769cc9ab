"""What a VM writes reaches operators only as words (issue 38, item 6).

- Every dedupe key the bridge makes is namespaced by kind: an EventId a VM chooses
  (`relay-silent:victim`, `policy_invalid:fleet`) pages and resolves its own incident,
  never the victim's "relay stopped reporting" or the fleet's "policy invalid" one.
- PagerDuty gets `resolve` only for a key it was paged for, fleet-wide (the deliveries
  table in Azurite, shared by two workers here).
- Link-breaking covers any script (a look-alike `microsoftonlinè.com`, with a precomposed
  or a combining accent, a Cyrillic TLD, the ideographic full stop), PagerDuty's summary
  and every other field it shows included.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator

import pytest
import requests

from functions.model.event import Transition
from functions.notify import describe, dispatch, pagerduty, slack, teams
from functions.notify.delivery import RetryPolicy, Transport
from functions.notify.settings import ChannelSettings
from functions.store.deliveries import DeliveryLedger
from tests.notify.factory import decision, event, note
from tests.notify.receiver import Answer, Receiver, running

KEY = "R0UT1NGKEY0123456789012345678901"


@pytest.fixture
def ledger(azurite: str) -> DeliveryLedger:
    return DeliveryLedger.from_connection_string(
        azurite, "w" + uuid.uuid4().hex[:12]
    ).ensure_table()


@pytest.fixture
def pd() -> Iterator[Receiver]:
    with running(Answer(202)) as receiver:
        yield receiver


def send(pd: Receiver, ledger: DeliveryLedger, *notes) -> None:
    """Each note on PagerDuty, by a worker of its own (a fresh transport: nothing shared
    in memory), through the deliveries table."""
    settings = ChannelSettings(
        pagerduty_routing_key=KEY, pagerduty_events_url=f"{pd.url}/v2/enqueue"
    )
    for item in notes:
        worker = Transport(requests.Session(), RetryPolicy(attempts=1))
        dispatch.deliver(
            "pagerduty", item.to_json(), settings=settings, transport=worker, ledger=ledger
        )


def actions(pd: Receiver) -> list[tuple[str, str]]:
    return [(b["event_action"], b["dedup_key"]) for b in pd.bodies()]


@pytest.mark.parametrize(
    ("victim", "forged_id"),
    [
        (note(Transition.RELAY_SILENT, None, vm="victim", occurrence="t1"), "relay-silent:victim"),
        (note(Transition.POLICY_INVALID, None, decision(policy_error="x")), "policy_invalid:fleet"),
    ],
)
def test_an_event_id_cannot_resolve_another_kinds_incident(pd, ledger, victim, forged_id):
    send(pd, ledger, victim)
    (victim_key,) = [key for _, key in actions(pd)]
    # A VM reports an event whose EventId is the victim's key, has it paged, then drops it.
    forged = event(forged_id, resources=("attacker",), scale_sets=())
    send(
        pd,
        ledger,
        note(Transition.DECIDED, forged, decision(page=True)),
        note(Transition.CANCELLED, forged, decision(page=True)),
    )
    assert actions(pd) == [
        ("trigger", victim_key),
        ("trigger", f"event:{forged_id}"),
        ("resolve", f"event:{forged_id}"),
    ]


def test_every_key_names_its_kind() -> None:
    keys = {
        pagerduty.dedup_key(note(Transition.DECIDED, event("victim"), decision())),
        pagerduty.dedup_key(note(Transition.RELAY_SILENT, None, vm="victim")),
        pagerduty.dedup_key(note(Transition.POLICY_INVALID, None, decision())),
        pagerduty.dedup_key(note(Transition.CONFIG_INVALID, None, vm="victim")),
    }
    assert keys == {
        "event:victim",
        "relay-silent:victim",
        "policy_invalid:fleet",
        "config_invalid:victim",
    }
    ids = {
        note(Transition.APPROVED, event("vm1:relay_recovered"), decision()).message_id(),
        note(Transition.RELAY_RECOVERED, None, vm="vm1").message_id(),
        note(Transition.POLICY_INVALID, None).message_id(),
        note(Transition.APPROVED, event("fleet"), decision()).message_id(),
    }
    assert ids == {
        "event:vm1:relay_recovered:approved",
        "vm:vm1:relay_recovered",
        "fleet:policy_invalid",
        "event:fleet:approved",
    }


def test_a_long_event_id_keeps_one_id_per_transition() -> None:
    """Cut at Service Bus's 128 characters, each transition of a 128-character EventId
    had the same MessageId: every announcement after the first was dropped as a duplicate."""
    long_id = "E" * 128
    made = {
        note(transition, event(long_id), decision()).message_id()
        for transition in (Transition.DECIDED, Transition.APPROVED, Transition.COMPLETED)
    }
    assert len(made) == 3 and all(len(m) <= 128 for m in made), made


def test_pagerduty_resolves_only_what_it_paged_fleet_wide(pd, ledger) -> None:
    paged, quiet = event("EV-P"), event("EV-Q")
    send(
        pd,
        ledger,
        note(Transition.DECIDED, paged, decision(page=True)),
        note(Transition.DECIDED, quiet, decision(page=False)),
        note(Transition.COMPLETED, paged, decision(page=True)),  # another worker resolves
        note(Transition.CANCELLED, quiet, decision(page=False)),
        note(Transition.RELAY_RECOVERED, None, vm="web_9", page=False),  # never silent
        note(Transition.COMPLETED, paged, decision(page=True)),  # a republish: resolved
    )
    assert actions(pd) == [("trigger", "event:EV-P"), ("resolve", "event:EV-P")]
    # Nothing was claimed or recorded for the resolves that were not sent.
    assert ledger.rows(note(Transition.CANCELLED, quiet).message_id()) == {}


LOOK_ALIKES = [
    "microsoftonlin\u00e8.com/approve",  # è precomposed
    "microsoftonline\u0300.com/approve",  # e + a combining grave accent
    "\u0430pple.\u0440\u0444/login",  # a Cyrillic a, a Cyrillic TLD
    "evil\u3002example/x",  # the ideographic full stop, which IDNA reads as "."
    "evil\uff0eexample",  # the full-width full stop
    "x\u00e9@evil.example",  # an e-mail address after a Latin-1 letter
    "https\uff1a//evil.example",  # a full-width colon
]
SEPARATORS = ".\u3002\uff0e\uff61@\uff20:\uff1a"


@pytest.mark.parametrize("hostile", LOOK_ALIKES)
def test_link_breaking_covers_any_script(hostile: str) -> None:
    for shown in (teams.inert(hostile), slack.inert(hostile, 3000)):
        for found in re.finditer(f"[{SEPARATORS}]", shown):
            following = shown[found.end() : found.end() + 1]
            assert following in ("", " ", describe.ZWSP, "/"), (hostile, shown)
        assert describe.ZWSP in shown


@pytest.mark.parametrize("hostile", LOOK_ALIKES)
def test_pagerduty_shows_vm_text_defanged(hostile: str) -> None:
    snap = event(
        hostile,
        event_type=hostile,
        resources=(hostile,),
        scale_sets=(hostile,),
        description=hostile,
    )
    body = pagerduty.build_event(
        note(Transition.DECIDED, snap, decision(reason=hostile), detail=hostile), KEY
    )
    assert body is not None
    payload = body["payload"]
    for name in ("summary", "source", "component", "group", "class"):
        text = payload[name]
        # Each separator a linkifier would read sits in brackets.
        bare = re.sub(r"\[.\]", "", text)
        assert not re.search(f"[{SEPARATORS}](?=\\w)", bare), (name, text)
        assert "[" in text, (name, text)
    # The incident's key and the custom details stay exact: they are data, not words.
    assert body["dedup_key"] == f"event:{hostile}"
    assert payload["custom_details"]["EventType"] == hostile


def test_words_of_the_bridge_stay_readable() -> None:
    """Times, numbers followed by a space, and an ellipsis are not links: left alone."""
    text = "at 10:30 UTC, about 1.5 s… rule 'x': hold"
    assert describe.defanged(text) == "at 10:30 UTC, about 1[.]5 s… rule 'x': hold"
    assert describe.unlinked("wait... then go") == "wait... then go"
