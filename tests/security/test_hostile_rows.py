"""Bad input never breaks a page (issue 38, item 5).

Every number a relay sends is bounded at the envelope: 1.7e308 twice is inf, which the
ledger could not hold, and reading the event then failed for every operator. A row that
cannot be read anyway (written before the bounds, or by hand) is skipped, shown as such and
counted by `/api/status`, the fleet page, the event page and the ledger export, which go
on with every other row. The hostile rows are real rows in Azurite.
"""

from __future__ import annotations

import csv
import io
import json
import uuid
from datetime import timedelta

import pytest
from azure.data.tables import UpdateMode

from functions.__main__ import main as cli
from functions.ledger import as_csv, read_ledger, summary
from functions.model.envelope import DocumentError, parse_envelope
from functions.pipeline.ingest import ingest_message
from functions.store.events import EVENT_ROW, LEDGER, LEDGER_LEFT, OPEN_EVENTS, REPORTER
from functions.store.keys import row_key
from functions.store.state import Store
from functions.web.views import fleet_status
from tests.functions.conftest import T0, FakeClock, envelope, event, make_pipeline
from tests.web.server import serve
from tests.web.test_pages import PAGES_ON, get, principal

HUGE = 1.7e308


@pytest.fixture
def store(azurite: str) -> Store:
    return Store.from_connection_string(azurite, "h" + uuid.uuid4().hex[:12]).ensure_tables()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def freeze(status: str = "Scheduled") -> dict:
    return event("EV-SH", "Freeze", status=status, resources=("vm1", "vm2"), duration=5)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("polls", {"max_gap_s": 1.0, "wall_jump_s": HUGE}),
        ("polls", {"max_gap_s": HUGE, "wall_jump_s": 0}),
        ("polls", {"max_gap_s": 1.0, "wall_jump_s": -HUGE}),
        ("sequence", 10**30),
        ("unforwardable", {"incarnation": 10**30, "bytes": 5}),
        ("unforwardable", {"incarnation": 1, "bytes": 10**30}),
    ],
)
def test_every_number_a_relay_sends_is_bounded_at_the_envelope(field, value) -> None:
    message = json.loads(envelope("vm1", 1, [], polls={"max_gap_s": 1, "wall_jump_s": 0}))
    message[field] = value
    if field == "unforwardable":
        message["kind"] = "unforwardable"
    with pytest.raises(DocumentError, match=f"{field}.*less than or equal|{field}.*greater"):
        parse_envelope(message)


@pytest.mark.parametrize(
    ("name", "value"),
    [("DurationInSeconds", 10**20), ("DurationInSeconds", -2), ("DocumentIncarnation", 10**30)],
)
def test_a_document_s_numbers_are_bounded_too(name, value) -> None:
    message = json.loads(envelope("vm1", 1, [freeze()]))
    if name == "DocumentIncarnation":
        message["document"][name] = value
    else:
        message["document"]["Events"][0][name] = value
    with pytest.raises(DocumentError, match=name):
        parse_envelope(message)


def test_a_huge_clock_is_refused_with_its_reason_and_costs_no_one_else(store, clock) -> None:
    pipeline, _ = make_pipeline(store, clock)
    assert ingest_message(envelope("vm1", 1, [freeze()]), pipeline).outcome == "processed"
    assert ingest_message(envelope("vm2", 1, [freeze()]), pipeline).outcome == "processed"
    hostile = {"max_gap_s": 1.0, "wall_jump_s": HUGE}
    for sequence, events in ((2, [freeze("Started")]), (3, [])):
        result = ingest_message(envelope("vm2", sequence, events, polls=hostile), pipeline)
        assert result.outcome == "rejected" and "polls.wall_jump_s" in result.reason, result
    shown = fleet_status(pipeline, include_ended=True)
    assert [e["EventId"] for e in shown["events"]] == ["EV-SH"]
    assert shown["unreadable_rows"] is None


def plant_hostile_rows(pipeline) -> None:
    """vm1 and vm2 share an open Freeze; vm2's row then holds measurements out of every
    bound (as one written before the bounds would), a third reporter row names no VM, and
    a second open event's row is not JSON."""
    ok = {"max_gap_s": 2.0, "wall_jump_s": 0.5}
    for vm in ("vm1", "vm2"):
        ingest_message(envelope(vm, 1, [freeze()]), pipeline)
        ingest_message(envelope(vm, 2, [freeze("Started")], polls=ok), pipeline)
    table = pipeline.store.events
    pk = row_key("EV-SH")
    part = {
        "event_id": "EV-SH",
        "started_seen": (T0 + timedelta(seconds=2)).isoformat(),
        "wall_jump_s": HUGE,
    }
    left = {**part, "started_seen": None, "left_at": (T0 + timedelta(seconds=9)).isoformat()}
    table.upsert_entity(
        {
            "PartitionKey": pk,
            "RowKey": REPORTER + row_key("vm2"),
            LEDGER: json.dumps(part),
            LEDGER_LEFT: json.dumps(left),
        },
        mode=UpdateMode.MERGE,
    )
    table.upsert_entity({"PartitionKey": pk, "RowKey": REPORTER + "zz", "vm": 7})
    table.upsert_entity({"PartitionKey": row_key("EV-BAD"), "RowKey": EVENT_ROW, "data": "{no"})
    table.upsert_entity(
        {"PartitionKey": OPEN_EVENTS, "RowKey": row_key("EV-BAD"), "EventId": "EV-BAD", "at": T0}
    )


def test_rows_that_cannot_be_read_are_skipped_shown_and_counted(store, clock, azurite) -> None:
    pipeline, _ = make_pipeline(store, clock, **PAGES_ON)
    plant_hostile_rows(pipeline)

    status = fleet_status(pipeline, include_ended=False)
    (shown,) = status["events"]
    lines = {line["vm"]: line for line in shown["ledger"]}
    assert lines["vm1"]["measured"] and lines["vm1"]["max_poll_gap_s"] == 2.0
    assert not lines["vm2"]["measured"] and "wall_jump_s" in lines["vm2"]["unreadable"]
    unreadable = status["unreadable_rows"]
    assert unreadable["count"] == 3, unreadable
    named = "\n".join(unreadable["rows"])
    assert "r|vm2: measurements unreadable" in named and "r|zz: no VM name" in named
    assert f"{row_key('EV-BAD')}/event" in named
    json.dumps(status, allow_nan=False)  # strict JSON: nothing infinite left in it

    with serve(pipeline) as url:
        fleet = get(f"{url}/api/pages/fleet", headers=principal())
        page = get(f"{url}/api/pages/events/EV-SH", headers=principal())
        bad = get(f"{url}/api/pages/events/EV-BAD", headers=principal())
    assert fleet.status_code == 200 and "3 stored row(s) cannot be read" in fleet.text
    assert "EV-SH"[:8] in fleet.text
    assert page.status_code == 200, page.text
    assert "2 stored row(s) cannot be read" in page.text
    assert "vm2 (measurements unreadable: skipped)" in page.text
    assert "<td>2 s</td><td>+0.5 s</td>" in page.text  # vm1's line as ever
    assert bad.status_code == 200 and "1 stored row(s) cannot be read" in bad.text
    assert "ValidationError" in bad.text

    _, ledger = read_ledger(store, "EV-SH")
    assert "cannot be read" in summary(next(x for x in ledger if x.vm == "vm2"))


def test_the_ledger_exports_go_on_past_an_unreadable_row(
    store, clock, azurite, monkeypatch, capsys
) -> None:
    from functions.triggers.core import ledger_export

    pipeline, _ = make_pipeline(store, clock)
    plant_hostile_rows(pipeline)
    exported = json.loads(ledger_export(pipeline, "EV-SH", "json").get_body())
    assert [v["vm"] for v in exported["vms"]] == ["vm1", "vm2"]
    assert exported["vms"][1]["unreadable"] and len(exported["unreadable_rows"]) == 2
    rows = list(
        csv.DictReader(io.StringIO(ledger_export(pipeline, "EV-SH", "csv").get_body().decode()))
    )
    assert rows[0]["max_poll_gap_s"] == "2.0" and "wall_jump_s" in rows[1]["unreadable"]
    bad = ledger_export(pipeline, "EV-BAD", "json")
    assert bad.status_code == 500 and "cannot be read" in json.loads(bad.get_body())["error"]

    monkeypatch.setenv("StateStorage", azurite)
    monkeypatch.setenv("STATE_TABLE_PREFIX", store.prefix)
    assert cli(["ledger", "EV-SH"]) == 0
    out = capsys.readouterr()
    assert json.loads(out.out)["vms"][0]["vm"] == "vm1"
    assert out.err.count("skipped a row that cannot be read") == 2
    assert cli(["ledger", "EV-BAD"]) == 1
    assert "the event's row cannot be read" in capsys.readouterr().err


def test_the_ledger_csv_opens_as_text_in_a_spreadsheet(store, clock) -> None:
    """A VM chooses its name and its events' types; as CSV cells they would be formulas
    (OWASP CSV injection). Numbers stay numbers: a negative jump is not a formula."""
    from functions.ledger import spreadsheet_safe

    pipeline, _ = make_pipeline(store, clock)
    hostile = '=HYPERLINK("https://evil.example","approve")'
    scheduled = event("EV-CSV", hostile, resources=("@vm1",), duration=5)
    ingest_message(envelope("@vm1", 1, [scheduled]), pipeline)
    started = {**scheduled, "EventStatus": "Started", "NotBefore": ""}
    polls = {"max_gap_s": 2.0, "wall_jump_s": -3.5}
    ingest_message(envelope("@vm1", 2, [started], polls=polls), pipeline)
    _, lines = read_ledger(store, "EV-CSV")
    (row,) = csv.DictReader(io.StringIO(as_csv(lines)))
    assert row["event_type"] == "'" + hostile and row["vm"] == "'@vm1"
    assert row["wall_jump_s"] == "-3.5"
    for cell in row.values():
        assert not cell.startswith(("=", "+", "@", "\t", "\r")), row
    for text in ("+1", "-1+A1", "\tx", "\r=1", "@SUM(A1)"):
        assert spreadsheet_safe(text) == "'" + text
    assert spreadsheet_safe(-3.5) == -3.5 and spreadsheet_safe("vm1") == "vm1"


def test_approving_an_unreadable_event_is_refused_with_the_reason(store, clock) -> None:
    from functions.web.approval import Refused, approve_by_hand

    pipeline, _ = make_pipeline(store, clock)
    plant_hostile_rows(pipeline)
    with pytest.raises(Refused) as refused:
        approve_by_hand(pipeline, "EV-BAD", "function-key")
    assert refused.value.status == 409 and "row cannot be read" in str(refused.value)
