"""`policy backtest` over its three histories: the events table (on Azurite, written by the
app's own Store), an exported Resource Graph result in Microsoft's documented shape, and
relay envelopes around Microsoft's own IMDS documents (tests/backtest/SOURCES.md)."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from functions.__main__ import main
from functions.model.event import Decision
from functions.store.records import Attempt, EventRecord
from functions.store.state import Store

HERE = Path(__file__).parent
GRAPH = HERE / "samples" / "resource-graph-scheduledevents.json"
LEARN = HERE.parent / "conformance" / "samples" / "imds-scheduledevents-learn.json"
T = datetime(2026, 11, 20, 10, 0, tzinfo=UTC)


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, Any, str]:
    code = main(["policy", "backtest", *args, "--json"])
    out, err = capsys.readouterr()
    return code, json.loads(out) if out.strip() else None, err


@pytest.fixture(autouse=True)
def _no_app_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for name in list(os.environ):
        if name.upper().startswith(("POLICY_", "DRAIN__", "STATESTORAGE", "AZUREWEBJOBSSTORAGE")):
            monkeypatch.delenv(name)


def sample_policy(monkeypatch: pytest.MonkeyPatch) -> None:
    """Microsoft's sample (opt-in hold) as POLICY__RULES: the histories below were decided
    under it (the default before issue 45)."""
    from functions.model.policy import sample_rules

    rules = [r.model_dump(mode="json") for r in sample_rules()]
    monkeypatch.setenv("POLICY__RULES", json.dumps(rules))


# --------------------------------------------------------------------------- Resource Graph


def test_a_resource_graph_export(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The default policy (issue 45): every disruptive event drained, a 5 s Freeze approved.
    code, result, err = run(
        capsys, "--graph", str(GRAPH), "--since", "2025-09-01", "--now", "2025-10-01"
    )
    assert code == 0, err
    rules = {e["EventId"][:8]: e["candidate"]["rule"] for e in result["events"]}
    assert rules == {
        "3da1b9aa": "short-freeze",
        "8c2e5b1d": "drain-then-approve",
        "51f0c3e2": "drain-then-approve",
        "0b9d7e6c": "drain-then-approve",
    }
    sample_policy(monkeypatch)
    code, result, err = run(
        capsys, "--graph", str(GRAPH), "--since", "2025-09-01", "--now", "2025-10-01"
    )
    assert code == 0, err
    by_id = {e["EventId"][:8]: e for e in result["events"]}
    assert set(by_id) == {"3da1b9aa", "8c2e5b1d", "51f0c3e2", "0b9d7e6c"}
    freeze = by_id["3da1b9aa"]
    # Microsoft's sample: a 5 s Freeze of two scale-set instances, the owner in the ARM id.
    assert freeze["candidate"]["rule"] == "short-freeze"
    assert freeze["scale_sets"] == ["myvmss"] and freeze["impactful"] is False
    assert freeze["actual"]["text"].startswith("Azure's record: Started")
    assert freeze["decided_at"] == "2025-09-19T18:29:47+00:00"  # no first-seen: its NotBefore
    assert by_id["0b9d7e6c"]["availability_sets"] == ["web-as"]
    assert by_id["0b9d7e6c"]["candidate"]["rule"] == "user-initiated"
    assert by_id["0b9d7e6c"]["actual"]["end"] == "cancelled"
    # The reboot and the redeploy of two instances of myvmss, both at 18:35 under holds.
    (peak,) = [s for s in result["sets"] if s["name"] == "myvmss"]
    assert peak["peak"] == 2 and peak["over"] == 1
    assert sorted(peak["EventIds"]) == sorted(
        [by_id["8c2e5b1d"]["EventId"], by_id["51f0c3e2"]["EventId"]]
    )
    # Decided at NotBefore, a hold has nothing to wait for.
    assert result["holds"] == []
    assert result["summary"]["compared"] == 0  # Resource Graph keeps no decision


def test_a_candidate_that_approves_reboots_at_once(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    policy = tmp_path / "policy.json"
    policy.write_text(
        json.dumps(
            {
                "rules": [
                    {
                        "name": "reboots-now",
                        "match": {"event_types": ["Reboot"]},
                        "action": "approve",
                    },
                    {"name": "rest", "action": "hold"},
                ],
                "max_concurrent_per_set": 2,
            }
        )
    )
    code, result, err = run(
        capsys,
        "--graph",
        str(GRAPH),
        "--policy",
        str(policy),
        "--since",
        "2025-09-01",
        "--now",
        "2025-10-01",
    )
    assert code == 0, err
    rules = {e["EventId"][:8]: e["candidate"]["rule"] for e in result["events"]}
    assert rules["8c2e5b1d"] == "reboots-now" and rules["51f0c3e2"] == "rest"
    assert result["max_concurrent_per_set"] == 2
    assert all(s["over"] == 0 for s in result["sets"])
    assert result["policy"] == str(policy)


def test_a_graph_export_with_other_rows_and_a_broken_one(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    data = json.loads(GRAPH.read_text())
    data["data"].append({"type": "microsoft.maintenance/updates", "id": "/x", "properties": {}})
    data["data"].append(
        {"type": "microsoft.maintenance/scheduledevents", "properties": {"EventId": "x"}}
    )
    path = tmp_path / "export.json"
    path.write_text(json.dumps(data))
    code, result, err = run(
        capsys, "--graph", str(path), "--since", "2025-09-01", "--now", "2025-10-01"
    )
    assert code == 2  # a row it could not replay: said, and the exit code says so
    assert len(result["events"]) == 4
    reasons = [s["reason"] for s in result["skipped"]]
    assert any("1 row(s) of another type" in r for r in reasons)
    assert any(
        "row 5" in s["where"] and "not a scheduled event row" in s["reason"]
        for s in result["skipped"]
    )
    assert "not replayed" in err and "row 5" in err


# --------------------------------------------------------------------------- relay envelopes


def envelope(
    vm: str, sequence: int, at: datetime, document: dict[str, Any], scale_set: str
) -> dict[str, Any]:
    return {
        "schema": 1,
        "kind": "document",
        "vm": {"name": vm, "scale_set": scale_set},
        "sequence": sequence,
        "observed_at": at.isoformat(),
        "document": document,
    }


def test_the_relays_recorded_documents(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """Microsoft's four documents of one live migration, as WestNO_0's relay recorded them."""
    documents = json.loads(LEARN.read_text())
    not_before = datetime(2026, 4, 11, 22, 26, 58, tzinfo=UTC)
    times = [
        not_before - timedelta(minutes=20),
        not_before - timedelta(minutes=14),
        not_before - timedelta(minutes=9),
        not_before - timedelta(minutes=8),
    ]
    folder = tmp_path / "processed"
    folder.mkdir()
    for sequence, (at, document) in enumerate(zip(times, documents, strict=True)):
        body = envelope("WestNO_0", sequence, at, document, "WestNO")
        (folder / f"{sequence:04d}.json").write_text(json.dumps(body))
    heartbeat = envelope("WestNO_0", 9, times[-1], documents[0], "WestNO") | {
        "kind": "heartbeat",
        "document": None,
    }
    (folder / "hb.json").write_text(json.dumps(heartbeat))
    code, result, err = run(
        capsys, "--documents", str(folder), "--since", "2026-04-01", "--now", "2026-04-12"
    )
    assert code == 0, err
    (event,) = result["events"]
    assert event["EventId"] == "C7061BAC-AFDC-4513-B24B-AA5F13A16123"
    assert event["first_seen"] == times[1].isoformat()
    assert event["candidate"]["rule"] == "short-freeze"
    assert event["scale_sets"] == ["WestNO"]
    assert event["actual"]["started_at"] == times[2].isoformat()
    assert event["actual"]["ended_at"] == times[3].isoformat()
    assert event["actual"]["end"] == "completed"
    assert event["actual"]["text"] == "started 9 min before NotBefore: approved, over 60 s later"


def test_a_bare_imds_document_is_refused_with_the_reason(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "doc.json"
    path.write_text(json.dumps(json.loads(LEARN.read_text())[1]))
    code, result, _ = run(capsys, "--documents", str(path))
    assert code == 2
    assert result["events"] == []
    assert "no time and no VM" in result["skipped"][0]["reason"]


# --------------------------------------------------------------------------- the events table


def record(event_id: str, **fields: Any) -> EventRecord:
    values: dict[str, Any] = {
        "event_id": event_id,
        "event_type": "Reboot",
        "event_status": "Scheduled",
        "event_source": "Platform",
        "resources": ["web_0"],
        "scale_sets": ["web"],
        "first_seen": T,
        "not_before": T + timedelta(minutes=15),
        "duration_in_seconds": -1,
    }
    values.update(fields)
    return EventRecord(**values)


@pytest.fixture
def table(azurite: str, monkeypatch: pytest.MonkeyPatch) -> Store:
    prefix = "bt" + uuid.uuid4().hex[:10]
    store = Store.from_connection_string(azurite, prefix).ensure_tables()
    monkeypatch.setenv("StateStorage", azurite)
    monkeypatch.setenv("STATE_TABLE_PREFIX", prefix)
    rows = [
        record(
            "E1-REBOOT",
            decision=Decision(
                action="hold", rule="default-hold", reason="rule 'default-hold': hold"
            ),
            decided_at=T,
            started=True,
            ended="completed",
            ended_at=T + timedelta(minutes=20),
        ),
        record(
            "E2-FREEZE",
            event_type="Freeze",
            duration_in_seconds=5,
            resources=["web_1"],
            decision=Decision(action="approve", rule="short-freeze"),
            decided_at=T + timedelta(minutes=1),
            first_seen=T + timedelta(minutes=1),
            approval="approved",
            approved_by="policy",
            # Acknowledged through Resource Manager: the attempt's outcome is ARM's answer.
            approval_attempts=[
                Attempt(at=T + timedelta(minutes=1), vm="web_1", outcome="refused 409: busy"),
                Attempt(at=T + timedelta(minutes=1), vm="arm", outcome="Successfully Approved"),
            ],
            ended="completed",
            ended_at=T + timedelta(minutes=2),
        ),
        record(
            "E3-TERMINATE",
            event_type="Terminate",
            event_source="User",
            resources=["web_2"],
            not_before=T + timedelta(minutes=10),
            decision=Decision(action="drain", rule="terminate-drain"),
            decided_at=T + timedelta(minutes=2),
            first_seen=T + timedelta(minutes=2),
            approval="approved",
            approved_by="policy",
            approval_attempts=[
                Attempt(at=T + timedelta(minutes=3), vm="web_2", outcome="approved")
            ],
            ended="completed",
            ended_at=T + timedelta(minutes=4),
        ),
        record(
            "E5-REDEPLOY",
            event_type="Redeploy",
            resources=["web_3"],
            not_before=T + timedelta(minutes=25),
            decision=Decision(
                action="hold", rule="default-hold", reason="rule 'default-hold': hold"
            ),
            decided_at=T + timedelta(minutes=1),
            first_seen=T + timedelta(minutes=1),
            started=True,
            ended="completed",
            ended_at=T + timedelta(minutes=30),
        ),
        record(  # a host failure: first seen Started, no NotBefore ever
            "E6-FAILURE",
            resources=["web_4"],
            not_before=None,
            decision=Decision(action="hold", rule="default-hold"),
            decided_at=T + timedelta(minutes=3),
            first_seen=T + timedelta(minutes=3),
            started=True,
            ended="completed",
            ended_at=T + timedelta(minutes=8),
        ),
        record("E4-OLD", first_seen=T - timedelta(days=40), decided_at=T - timedelta(days=40)),
    ]
    for row in rows:
        store.mutate_event(row.event_id, lambda _current, row=row: row)
    return store


def test_the_events_table_under_the_policy_in_effect(
    table: Store, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DRAIN__HTTP_URL", "https://drain.example/hook")
    sample_policy(monkeypatch)
    code, result, err = run(capsys, "--now", (T + timedelta(days=1)).isoformat())
    assert code == 0, err
    ids = [e["EventId"] for e in result["events"]]
    assert ids == ["E1-REBOOT", "E2-FREEZE", "E5-REDEPLOY", "E3-TERMINATE", "E6-FAILURE"]
    assert result["source"] == "table" and result["summary"] == {  # E4: before --since
        "events": 5,
        "changed": 0,  # Microsoft's sample decided them: the replay agrees with each
        "compared": 4,
        "holds": 2,
        "sets_over_limit": 0,
    }
    assert [(h["EventId"], h["seconds"]) for h in result["holds"]] == [
        ("E1-REBOOT", 900.0),
        ("E5-REDEPLOY", 1440.0),
    ]
    # Reboot 10:15-10:20 (at NotBefore, as long as it really was), Redeploy 10:25-10:30,
    # the drained Terminate 10:02-10:03, the failure 10:03-10:08, the Freeze not
    # impactful: one at a time.
    (web,) = result["sets"]
    assert (web["name"], web["peak"], web["over"]) == ("web", 1, 0)
    text = [e["actual"]["text"] for e in result["events"]]
    assert (
        text[1] == "approve (short-freeze), approved by policy, 14 min before NotBefore, completed"
    )
    failure = result["events"][4]
    assert failure["candidate"] is None and failure["changed"] is None
    assert failure["actual"]["text"] == (
        "first seen Started: no notice, recorded hold (default-hold), completed"
    )


def test_the_events_table_under_a_candidate(
    table: Store,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Approving reboots at once puts the reboot on top of the drained Terminate in set
    web: two at once against max_concurrent_per_set 1. With no drain step (no DRAIN__*
    hook, the readiness drain turned off) the drain holds."""
    monkeypatch.setenv("DRAIN__READINESS", "false")
    policy = tmp_path / "candidate.json"
    policy.write_text(
        json.dumps(
            [
                {
                    "name": "terminate-drain",
                    "match": {"event_types": ["Terminate"]},
                    "action": "drain",
                },
                {"name": "all-now", "action": "approve"},
            ]
        )
    )
    code, result, err = run(
        capsys,
        "--policy",
        str(policy),
        "--now",
        (T + timedelta(days=1)).isoformat(),
        "--since",
        "2d",
    )
    assert code == 0, err
    changed = {e["EventId"]: e["changed"] for e in result["events"]}
    assert changed == {
        "E1-REBOOT": True,
        "E2-FREEZE": True,
        "E5-REDEPLOY": True,
        "E3-TERMINATE": False,
        "E6-FAILURE": None,
    }
    terminate = result["events"][3]
    assert terminate["effective"] == "hold" and "no drain step" in terminate["note"]
    (hold,) = result["holds"]
    assert (hold["EventId"], hold["seconds"]) == ("E3-TERMINATE", 480.0)
    # Approved at once, the reboot 10:00-10:05 and the redeploy 10:01-10:06 overlap the
    # host failure 10:03-10:08 (no notice: it happened whatever the policy).
    (web,) = result["sets"]
    assert (web["peak"], web["over"], web["at"]) == (3, 2, (T + timedelta(minutes=3)).isoformat())
    assert web["EventIds"] == ["E1-REBOOT", "E5-REDEPLOY", "E6-FAILURE"]


def test_a_wrong_table_prefix_is_named(
    azurite: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("StateStorage", azurite)
    monkeypatch.setenv("STATE_TABLE_PREFIX", "nosuch" + uuid.uuid4().hex[:8])
    code, result, err = run(capsys)
    assert code == 2 and result is None
    assert "no table nosuch" in err and "STATE_TABLE_PREFIX" in err


def test_the_table_named_by_a_settings_file(
    table: Store,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """`--settings` takes what `az functionapp config appsettings list` writes: the
    connection, the prefix and the POLICY__* deployed (here: a dry run)."""
    import os

    connection = os.environ["StateStorage"]  # noqa: SIM112 - the app's own setting name
    values = {"StateStorage": connection, "STATE_TABLE_PREFIX": table.prefix}
    monkeypatch.delenv("StateStorage")
    monkeypatch.delenv("STATE_TABLE_PREFIX")
    # --settings writes the file's settings into this process: registered here so that
    # they are undone after (delenv of an absent name registers nothing).
    monkeypatch.setenv("POLICY__DRY_RUN", "false")
    settings = [{"name": k, "value": v, "slotSetting": False} for k, v in values.items()]
    settings.append({"name": "POLICY__DRY_RUN", "value": "true", "slotSetting": False})
    path = tmp_path / "appsettings.json"
    path.write_text(json.dumps(settings))
    code, result, err = run(
        capsys, "--settings", str(path), "--now", (T + timedelta(days=1)).isoformat()
    )
    assert code == 0, err
    assert result["policy"] == "the POLICY__* settings"
    assert all(e["effective"] == "hold" for e in result["events"] if e["candidate"])
    notes = [e["note"] for e in result["events"] if e["candidate"]]
    assert notes == ["dry run: nothing is approved"] * 4


DEMO = HERE / "samples" / "demo-envelopes.jsonl"


def test_what_the_demos_relays_recorded(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """35 envelopes seven real relays sent during one `make demo` (JSON Lines; callback keys
    and attestations removed), replayed under Microsoft's sample with drains configured."""
    monkeypatch.setenv("DRAIN__RELAY_HOOK", "drain")
    sample_policy(monkeypatch)
    code, result, err = run(capsys, "--documents", str(DEMO), "--now", "2026-11-28")
    assert code == 0, err
    events = {e["EventId"][:8]: e for e in result["events"]}
    assert len(events) == 9
    reboot = events["A40F117D"]  # the platform reboot of web-as: both VMs reported it
    assert reboot["Resources"] == ["web-1", "web-2"]
    assert reboot["availability_sets"] == ["web-as"]
    assert reboot["candidate"]["rule"] == "default-hold"
    assert reboot["actual"]["text"].startswith("started at NotBefore: not approved")
    terminate = events["6D6C3437"]
    assert (terminate["candidate"]["action"], terminate["effective"]) == ("drain", "drain")
    assert terminate["scale_sets"] == ["workers"]
    assert events["BE589826"]["actual"]["end"] == "cancelled"
    failure = events["2C35E1BE"]  # the host failure: first seen Started
    assert failure["candidate"] is None and failure["actual"]["started_at"] == failure["first_seen"]
    assert [h["EventId"][:8] for h in result["holds"]] == ["A40F117D", "F5C9D7DE", "5C75F00E"]


def test_each_view_of_an_event_is_decided_as_the_bridge_did(
    azurite: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """Two reporters of one EventId whose IMDS disagree (one claims a 5 s Freeze): the
    bridge decided each view and held (the strictest). A candidate that approves reboots
    and holds freezes still holds it: the replay decides each view, not the row's fields."""
    from functions.model.view import VmView
    from functions.store.records import ViewDecision

    prefix = "bv" + uuid.uuid4().hex[:10]
    store = Store.from_connection_string(azurite, prefix).ensure_tables()
    monkeypatch.setenv("StateStorage", azurite)
    monkeypatch.setenv("STATE_TABLE_PREFIX", prefix)
    hold = Decision(action="hold", rule="default-hold")
    approve = Decision(action="approve", rule="short-freeze")
    views = [
        ViewDecision(
            key=f"k{i}",
            view=VmView(
                vm=vm,
                event_type=kind,
                event_source="Platform",
                duration_s=seconds,
                not_before=T + timedelta(minutes=15),
                resources=("web_0", "web_1"),
            ),
            scale_set="web",
            decision=choice,
            decided_at=T,
            first_vm=vm,
        )
        for i, (vm, kind, seconds, choice) in enumerate(
            [("web_0", "Reboot", -1, hold), ("web_1", "Freeze", 5, approve)]
        )
    ]
    row = record(
        "E7-VIEWS",
        resources=["web_0", "web_1"],
        decision=hold,
        decided_at=T,
        views=views,
        views_differ=["EventType", "DurationInSeconds"],
    )
    store.mutate_event(row.event_id, lambda _current: row)
    policy = tmp_path / "candidate.json"
    policy.write_text(
        json.dumps(
            [
                {"name": "reboots-now", "match": {"event_types": ["Reboot"]}, "action": "approve"},
                {"name": "rest", "action": "hold"},
            ]
        )
    )
    code, result, err = run(
        capsys, "--policy", str(policy), "--now", (T + timedelta(days=1)).isoformat()
    )
    assert code == 0, err
    (event,) = result["events"]
    assert (event["candidate"]["action"], event["candidate"]["rule"]) == ("hold", "rest")
    assert event["note"] == "2 distinct views decided, the strictest acts"
    assert "views differ in EventType, DurationInSeconds" in event["actual"]["text"]
    # Under the policy that decided it, the replay gives the bridge's decision back.
    sample_policy(monkeypatch)
    code, result, err = run(capsys, "--now", (T + timedelta(days=1)).isoformat())
    assert code == 0, err
    assert result["events"][0]["changed"] is False


def test_the_demos_check_and_its_report_section(table: Store, azurite: str) -> None:
    """local/demo_backtest.py on a table: met when every decision comes back, printed as
    the command prints it, a report section; skipped on a table with no decision."""
    import io
    from types import SimpleNamespace

    from functions.model.policy import Policy, PolicyLoad, sample_rules
    from local.demo_backtest import run_backtest
    from local.report import Timeline
    from local.report_backtest import backtest_section

    stream = io.StringIO()
    demo = SimpleNamespace(
        store=table,
        settings=SimpleNamespace(policy=PolicyLoad(policy=Policy(rules=sample_rules()))),
        policy_source="Microsoft's sample",
        timeline=Timeline(stream=stream, colour=False),
    )
    (outcome,) = run_backtest(demo)  # type: ignore[arg-type]
    assert outcome.ok and not outcome.skipped, outcome
    # All of the table (E4 too, undecided, so not compared): the demo's Azurite is its own.
    assert "4 decision(s) replayed, 0 differ" in outcome.detail
    assert "Holds that would run to NotBefore (3)" in stream.getvalue()
    section = backtest_section(demo.backtest)
    assert section.count("<td>=</td>") == 4 and "E1-REBOO" in section
    empty = Store.from_connection_string(azurite, "be" + uuid.uuid4().hex[:10]).ensure_tables()
    demo.store = empty
    (outcome,) = run_backtest(demo)  # type: ignore[arg-type]
    assert outcome.skipped and "no decided event" in outcome.detail


def test_no_setting_leaks_out_of_these_tests() -> None:
    """Runs last in this module: a POLICY__* left behind would change every later test."""
    import os

    assert not [k for k in os.environ if k.upper().startswith(("POLICY_", "DRAIN__"))]
