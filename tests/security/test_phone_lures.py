"""No number to call in a post's title (issue 46, "phone-number lures stay intact in
PagerDuty titles").

A VM writes "call +1 (800) 555-0199 to approve" into what titles are made of: its
EventType, its scale set's or availability set's name, its own name, a relay's answer. On
2f59d6a the PagerDuty summary (read on a lock screen, in an SMS, aloud on a call), the
Teams card's title and Slack's header and preview carried it intact: one tap from a call.
Each title now breaks such a run into groups too short to dial, still readable; the
bridge's own times stay whole.

The detector here is libphonenumber's candidate rule (PhoneNumberMatcher): digits joined by
its VALID_PUNCTUATION, which includes the brackets and the zero-width space the other
defangings insert.
"""

from __future__ import annotations

import re

import pytest

from functions.model.event import Transition
from functions.notify import describe, pagerduty, slack, teams
from tests.notify.factory import NOW, decision, event, note

# libphonenumber's VALID_PUNCTUATION (PhoneNumberUtil), written out.
PUNCTUATION = (
    "\\-x\u2010-\u2015\u2212\u30fc\uff0d-\uff0f \u00a0\u00ad\u200b\u2060\u3000"
    "()\uff08\uff09\uff3b\uff3d.\\[\\]/~\u2053\u223c\uff5e"
)
CANDIDATE = re.compile(r"\d(?:[" + PUNCTUATION + r"]*\d)+")

LURES = [
    "call +1 (800) 555-0199 to approve",
    "Call 8005550199",
    "+44 20 7946 0958",
    "800.555.0199",
    "800[.]555[.]0199",  # already bracketed: brackets are a number's punctuation too
    "800\u200b555\u200b0199",  # zero-width spaces: one number to a phone
    "800\x00555\x000199",  # control characters: spaces once made one line
    "\uff18\uff10\uff10\uff15\uff15\uff15\uff10\uff11\uff19\uff19",  # full-width digits
]


def callable_numbers(text: str) -> list[str]:
    """The runs a phone would offer to call: seven digits or more."""
    return [m[0] for m in CANDIDATE.finditer(text) if sum(ch.isdecimal() for ch in m[0]) >= 7]


def titles(lure: str) -> dict[str, str]:
    """Every title a VM's words reach: PagerDuty's summary and the fields it shows with it,
    the Teams card's title, Slack's header and its preview text."""
    snap = event(
        "EV-1",
        event_type=lure,
        scale_sets=(lure,),
        resources=(f"{lure}_0",),
        reported_by=(f"{lure}_0",),
    )
    made = [
        note(Transition.DECIDED, snap, decision(reason=lure), detail=lure),
        note(Transition.RELAY_SILENT, None, vm=lure, detail=lure, occurrence="t1"),
        note(
            Transition.RELAY_SILENT,
            None,
            silent_group="g",
            silent_label=lure,
            silent_count=2,
            occurrence="t2",
        ),
    ]
    shown: dict[str, str] = {}
    for index, item in enumerate(made):
        body = pagerduty.build_event(item, "R0UT1NGKEY0123456789012345678901")
        assert body is not None
        for name in ("summary", "source", "component", "group", "class"):
            if name in body["payload"]:
                shown[f"{index} pagerduty {name}"] = body["payload"][name]
        card = teams.build_card(item, NOW)
        shown[f"{index} teams title"] = card["body"][0]["text"]
        message = slack.build_message(item, NOW)
        shown[f"{index} slack header"] = message["blocks"][0]["text"]["text"]
        shown[f"{index} slack preview"] = message["text"]
    return shown


@pytest.mark.parametrize("lure", LURES)
def test_no_title_carries_a_number_to_call(lure: str) -> None:
    for where, text in titles(lure).items():
        assert not callable_numbers(text), (where, text)


def test_the_number_is_still_readable_and_the_bridges_times_whole() -> None:
    assert describe.undialable("call +1 (800) 555-0199") == "call +1·800·555·0199"
    assert describe.undialable("8005550199") == "8005·5501·99"
    # The bridge's own words: times, durations, counts, a decision's UTC time.
    for own in ("at 10:30 UTC", "about 86400 s", "12 VMs", "approve after 2026-11-21 10:30:00 UTC"):
        assert describe.undialable(own) == own
    assert describe.undialable(describe.undialable("800 555 0199")) == "800·555·0199"


def test_the_data_stays_exact() -> None:
    """The EventType in PagerDuty's custom details is data, not a title: kept as sent."""
    lure = LURES[0]
    body = pagerduty.build_event(note(Transition.DECIDED, event(event_type=lure), decision()), "k")
    assert body is not None
    assert body["payload"]["custom_details"]["EventType"] == lure
