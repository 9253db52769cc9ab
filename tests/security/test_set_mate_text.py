"""A set-mate's words are not the event's text (issue 46, "the first reporter's words
become the event's text everywhere").

A hostile set-mate reports the victim's Redeploy first, as a 30 s Freeze described as
"Live migration pause 30 s". On 2f59d6a the event row kept the first reporter's type,
duration and description, so the cards, PagerDuty, the fleet page and the event page all
said "Live migration pause 30 s": a person approving by hand started a Redeploy an hour
early, undrained. The text operators read is now Azure's where Event Grid described the
event; otherwise, where reporters' views differ, the conflict, each view attributed.
"""

from __future__ import annotations

import json
import uuid

import pytest

from functions.model.policy import Policy, Rule
from functions.notify import describe, pagerduty
from functions.pipeline.ingest import ingest_message
from functions.pipeline.sources.eventgrid_ingest import ingest_event_grid
from functions.store.state import Store
from tests.agentless.grid import grid_event
from tests.functions.conftest import FakeClock, envelope, event, make_pipeline

pytestmark = pytest.mark.azurite

HOLD_ALL = Policy(rules=(Rule(name="all", action="hold"),))
SET = {"availability_set": "as1"}
BOTH = ("victim", "mate")
LURE = "Live migration pause 30 s"


@pytest.fixture
def store(azurite: str) -> Store:
    return Store.from_connection_string(azurite, "t" + uuid.uuid4().hex[:12]).ensure_tables()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def _forged() -> dict:
    return {**event("EV-T", "Freeze", resources=BOTH, duration=30), "Description": LURE}


def _genuine() -> dict:
    return event("EV-T", "Redeploy", resources=BOTH, duration=3600)


def _attack(store: Store, clock: FakeClock):
    from tests.web.test_pages import PAGES_ON

    pipeline, pub = make_pipeline(store, clock, HOLD_ALL, **PAGES_ON)
    ingest_message(envelope("mate", 1, [_forged()], **SET), pipeline)
    ingest_message(envelope("victim", 1, [_genuine()], **SET), pipeline)
    return pipeline, pub


def test_the_cards_and_pages_show_the_conflict_not_the_first_reporters_words(store, clock):
    from tests.web.server import serve
    from tests.web.test_pages import get, principal

    pipeline, pub = _attack(store, clock)
    snap = store.get_event("EV-T").snapshot()  # what the cards and the pages render
    words = describe.event_words(snap)
    assert words != LURE and "Redeploy (victim)" in words and "Freeze (mate)" in words
    assert "views differ" in (snap.description or "")
    assert f"mate said: {LURE}" in (snap.description or "")
    # The latest `decided` card (announced again once the views differed) says so too.
    decided = [n for n in pub.published if n.event and n.transition.value == "decided"]
    assert "Redeploy (victim)" in describe.event_words(decided[-1].event)
    # PagerDuty's title is built from the same words.
    paged = pagerduty.build_event(decided[-1], "routing-key")
    if paged is not None:
        assert LURE not in paged["payload"]["summary"].split(" — ")[0]
    # The fleet page and the event page (where a person approves by hand).
    with serve(pipeline) as url:
        fleet = get(f"{url}/api/pages/fleet", headers=principal())
        page = get(f"{url}/api/pages/events/EV-T", headers=principal())
    for shown in (fleet, page):
        assert shown.status_code == 200 and "Redeploy (victim)" in shown.text
        assert f"<td>{LURE}</td>" not in shown.text


def test_azures_words_replace_a_vms(store, clock):
    """Where Event Grid described the event, its text is Azure's, whoever reported first."""
    pipeline, _ = make_pipeline(store, clock, HOLD_ALL)
    ingest_message(envelope("mate", 1, [_forged()], **SET), pipeline)
    genuine = {**_genuine(), "Description": "Azure: the VM moves to another host"}
    ingest_event_grid(json.dumps(grid_event(genuine, grid_id="g-1")), pipeline)
    record = store.get_event("EV-T")
    assert record.described_by == "azure"
    snap = record.snapshot()
    assert snap.event_type == "Redeploy" and snap.description == genuine["Description"]
