"""The impact ledger in the function app (functions/ledger.py): kept per (event, VM) in the
reporter rows ingest writes anyway, derived against the event row, shown and exported."""

from __future__ import annotations

import csv
import io
import json
from datetime import timedelta
from typing import Any

import pytest

from functions.__main__ import main as cli
from functions.ledger import as_csv, ledger_lines, read_ledger, summary, table_rows
from functions.model.envelope import DocumentError, LedgerEntry, parse_envelope
from functions.model.policy import Policy, Rule
from functions.pipeline.ingest import ingest_message
from functions.store.state import Store
from functions.web.views import fleet_status
from tests.functions.conftest import T0, envelope, event, make_pipeline
from tests.tablecount import TableCounter

NB = T0 + timedelta(minutes=15)
APPROVE = Policy(rules=[Rule(name="all", action="approve", ignore_windows=True)])


def at(seconds: float):
    return T0 + timedelta(seconds=seconds)


def clocks(gap: float = 1.0, jump: float = 0.0) -> dict[str, float]:
    """A relay's polling since its previous document, as relay/watcher.py sends it."""
    return {"max_gap_s": gap, "wall_jump_s": jump}


def freeze(event_id: str, vm: str, status: str = "Scheduled") -> dict[str, Any]:
    return event(event_id, "Freeze", status=status, resources=(vm,), duration=5)


def play(pipeline: Any, event_id: str, vm: str, *, measured: bool) -> None:
    """Scheduled, Started (at T0+2 s), gone (at T0+9 s, after a 7 s pause of the guest
    whose clock was set 6 s forward): the three documents of a Freeze, with or without
    the relay's clocks."""
    steps = [
        (1, [freeze(event_id, vm)], clocks(), at(1)),
        (2, [freeze(event_id, vm, "Started")], clocks(1.5, 0.25), at(2)),
        (3, [], clocks(7.0, 6.0), at(9)),
    ]
    for sequence, events, polls, when in steps:
        body = envelope(vm, sequence, events, polls=polls if measured else None, observed_at=when)
        assert ingest_message(body, pipeline).outcome == "processed"


def test_a_freeze_s_ledger_is_kept_derived_and_shown(store, clock, relay) -> None:
    pipeline, _ = make_pipeline(store, clock, APPROVE)
    body = envelope("vm1", 1, [freeze("EV-F", "vm1")], callback_url=relay.url, polls=clocks())
    assert ingest_message(body, pipeline).outcome == "processed"
    assert relay.starts() == ["EV-F"]
    approved_at = store.get_event("EV-F").approval_attempts[-1].at
    assert store.get_reporter("EV-F", "vm1").ledger is None  # nothing to say while Scheduled
    started = [freeze("EV-F", "vm1", "Started")]
    body = envelope("vm1", 2, started, polls=clocks(2.0, 0.25), observed_at=at(4))
    ingest_message(body, pipeline)
    kept = store.get_reporter("EV-F", "vm1").ledger
    assert (kept.started_seen, kept.max_poll_gap_s, kept.left_at) == (at(4), 2.0, None)
    # The leaving document's clocks ride on the reporter row's status write.
    ingest_message(envelope("vm1", 3, [], polls=clocks(6.5, 5.0), observed_at=at(12)), pipeline)
    record, (line,) = read_ledger(store, "EV-F")
    assert record is not None and record.ended == "completed"
    assert line.vm == "vm1" and line.measured and line.duration_s == 5 and line.not_before == NB
    assert line.approved_at == approved_at and line.start_delay_from == "approval"
    assert line.start_delay_s == round((at(4) - approved_at).total_seconds(), 3)
    assert line.started_for_s == 8.0
    # The longest gap of either period; the jumps of both added up.
    assert (line.max_poll_gap_s, line.wall_jump_s) == (6.5, 5.25)
    assert "wall clock jumped +5.25 s" in summary(line)
    # /api/status (with ?all=true for the ended event) carries it.
    (shown,) = fleet_status(pipeline, include_ended=True)["events"]
    assert shown["ledger"][0]["wall_jump_s"] == 5.25 and shown["ledger"][0]["vm"] == "vm1"
    # The CSV export reads back as the same line.
    (row,) = csv.DictReader(io.StringIO(as_csv([line])))
    assert row["vm"] == "vm1" and float(row["max_poll_gap_s"]) == 6.5
    assert row["start_delay_from"] == "approval"


def test_an_event_first_seen_started_takes_no_gap_from_before_it(store, clock) -> None:
    pipeline, _ = make_pipeline(store, clock)
    failing = [freeze("EV-H", "vm1", "Started")]
    ingest_message(envelope("vm1", 1, failing, polls=clocks(30.0, 2.0)), pipeline)
    kept = store.get_reporter("EV-H", "vm1").ledger
    assert kept.started_seen == at(1) and (kept.max_poll_gap_s, kept.wall_jump_s) == (0, 0)


def test_not_approved_counts_from_not_before_and_an_old_relay_has_an_empty_line(store, clock):
    pipeline, _ = make_pipeline(store, clock, Policy(rules=[Rule(name="h", action="hold")]))
    play(pipeline, "EV-A", "vm1", measured=True)
    play(pipeline, "EV-B", "vm2", measured=False)
    record, (line,) = read_ledger(store, "EV-B")
    assert record is not None and not line.measured and line.max_poll_gap_s is None
    assert summary(line) == "vm2: no measurements from its relay"
    assert table_rows([line])[0][0] == "vm2 (no relay measurements)"
    record, (line,) = read_ledger(store, "EV-A")
    assert record is not None and record.approval != "approved"
    assert line.approved_at is None and line.start_delay_from == "NotBefore"
    assert line.start_delay_s == round((at(2) - NB).total_seconds(), 3)
    assert (line.started_for_s, line.max_poll_gap_s, line.wall_jump_s) == (7.0, 7.0, 6.25)


def test_a_status_write_without_measurements_keeps_those_the_row_has(store) -> None:
    measured = LedgerEntry(event_id="EV-K", started_seen=at(1), wall_jump_s=7.5)
    store.set_reporter("EV-K", "vm1", "Started", T0, ledger=measured)
    store.set_reporter("EV-K", "vm1", "", T0)  # e.g. silence: the watchdog ends its report
    assert store.get_reporter("EV-K", "vm1").ledger == measured


def test_ledger_lines_name_every_reporter_once_whatever_the_case(store, clock) -> None:
    pipeline, _ = make_pipeline(store, clock)
    play(pipeline, "EV-C", "vm1", measured=True)
    record = store.get_event("EV-C")
    measured = LedgerEntry(event_id="EV-C")
    lines = ledger_lines(record, {"VM1": measured}, ["vm1", "vm2"])
    assert [(x.vm, x.measured) for x in lines] == [("VM1", True), ("vm2", False)]


def test_the_ledger_costs_no_table_request(azurite, clock) -> None:
    """The same three documents, with and without the relay's clocks: the same requests
    on the wire (the measurements ride on reporter row writes that happen anyway)."""
    counts = []
    with TableCounter(azurite) as counter:
        store = Store.from_connection_string(counter.connection_string, "ledgr").ensure_tables()
        pipeline, _ = make_pipeline(store, clock)
        for name, measured in (("vm-a", False), ("vm-b", True)):
            counter.reset()
            play(pipeline, f"EV-{name}", name, measured=measured)
            counts.append(dict(counter.by_kind()))
        _, (line,) = read_ledger(store, "EV-vm-b")
    assert counts[0] == counts[1], counts
    assert line.measured and line.left_at == at(9) and line.wall_jump_s == 6.25


@pytest.mark.parametrize(
    ("polls", "problem"),
    [
        ({"max_gap_s": -1, "wall_jump_s": 0}, "max_gap_s"),
        ({"max_gap_s": 1}, "wall_jump_s"),
        ({"max_gap_s": 1, "wall_jump_s": "far"}, "wall_jump_s"),
        ([1, 2], "polls"),
    ],
)
def test_malformed_clocks_are_refused_with_the_reason(polls, problem) -> None:
    message = json.loads(envelope("vm1", 1, [], polls=polls))
    with pytest.raises(DocumentError, match=problem):
        parse_envelope(message)


def test_fields_a_newer_relay_adds_are_ignored_not_kept() -> None:
    message = json.loads(envelope("vm1", 1, [], polls={**clocks(), "new": "x" * 10_000}))
    assert "new" not in parse_envelope(message).polls.model_dump_json()


def test_the_cli_exports_json_and_csv_and_says_what_is_wrong(
    store, clock, azurite, monkeypatch, capsys
) -> None:
    pipeline, _ = make_pipeline(store, clock)
    play(pipeline, "EV-X", "vm1", measured=True)
    monkeypatch.setenv("StateStorage", azurite)
    monkeypatch.setenv("STATE_TABLE_PREFIX", store.prefix)
    assert cli(["ledger", "EV-X"]) == 0
    exported = json.loads(capsys.readouterr().out)
    assert exported["event_id"] == "EV-X" and exported["vms"][0]["wall_jump_s"] == 6.25
    assert cli(["ledger", "EV-X", "--csv"]) == 0
    (row,) = csv.DictReader(io.StringIO(capsys.readouterr().out))
    assert row["vm"] == "vm1" and row["left_at"]
    assert cli(["ledger", "NOPE"]) == 1
    assert "no event 'NOPE'" in capsys.readouterr().err
    assert cli(["ledger", " "]) == 2
    monkeypatch.delenv("StateStorage")
    monkeypatch.delenv("AzureWebJobsStorage", raising=False)
    assert cli(["ledger", "EV-X"]) == 2
    assert "no state storage" in capsys.readouterr().err


def test_an_approval_through_resource_manager_counts_from_its_time() -> None:
    """ARM's attempt records its answer, not "approved" (found by `make demo`)."""
    from functions.ledger import approval_of
    from functions.store.records import Attempt, EventRecord

    when = at(3)
    record = EventRecord(
        event_id="EV-ARM",
        event_type="Freeze",
        event_status="Scheduled",
        first_seen=T0,
        not_before=NB,
        approval="approved",
        approved_by="arm:virtualMachines/batch-1",
        approval_attempts=[
            Attempt(at=T0 + timedelta(seconds=1), vm="vm1", outcome="error: refused"),
            Attempt(at=when, vm="arm", outcome="200 acknowledged"),
        ],
    )
    measured = LedgerEntry(event_id="EV-ARM", started_seen=at(4))
    (line,) = ledger_lines(record, {"vm1": measured})
    assert approval_of(record) == (when, "arm:virtualMachines/batch-1")
    assert (line.start_delay_s, line.start_delay_from) == (1.0, "approval")
