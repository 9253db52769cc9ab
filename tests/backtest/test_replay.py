"""The replay's arithmetic (windows, cancellations, overlaps) and the command's refusals."""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from functions.__main__ import main
from functions.backtest.history import Past
from functions.backtest.render import render_text
from functions.backtest.replay import replay
from functions.model.envelope import ScheduledEvent
from functions.model.policy import Policy, Rule, Window

T = datetime(2026, 11, 23, 9, 0, tzinfo=UTC)  # a Monday
GRAPH = Path(__file__).parent / "samples" / "resource-graph-scheduledevents.json"


@pytest.fixture(autouse=True)
def _no_policy_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.upper().startswith(("POLICY_", "DRAIN__")):
            monkeypatch.delenv(name)


def past(event_id: str, event_type: str = "Reboot", **fields: object) -> Past:
    event = ScheduledEvent(
        EventId=event_id,
        EventStatus="Scheduled",
        EventType=event_type,
        Resources=[f"{event_id}-vm"],
        NotBefore=fields.pop("not_before", T + timedelta(minutes=15)),
        EventSource="Platform",
        DurationInSeconds=fields.pop("duration", -1),
    )
    values: dict[str, object] = {"source": "table", "first_seen": T, "scale_sets": ("web",)}
    values.update(fields)
    return Past(event=event, **values)  # type: ignore[arg-type]


def run_policy(policy: Policy, *pasts: Past):
    return replay(
        policy,
        list(pasts),
        source="table",
        policy_source="test",
        since=T - timedelta(days=1),
        now=T,
    )


def test_an_approval_waits_for_the_window_and_so_does_the_impact() -> None:
    policy = Policy(
        rules=(Rule(name="reboots", action="approve"),),
        windows=(Window(days=("Mon",), start="09:10", end="10:00"),),
    )
    (r,) = run_policy(policy, past("A")).events
    assert r.decision is not None and r.decision.approve_after == T + timedelta(minutes=10)
    assert r.impact_start == T + timedelta(minutes=10)


def test_no_window_before_notbefore_holds_to_notbefore() -> None:
    policy = Policy(
        rules=(Rule(name="reboots", action="approve"),),
        windows=(Window(days=("Sat",), start="01:00", end="02:00"),),
    )
    result = run_policy(policy, past("A"))
    (hold,) = result.holds
    assert hold.seconds == 900 and "no maintenance window" in hold.why


def test_an_event_azure_withdrew_first_never_hits_the_vm() -> None:
    """Cancelled at 09:05: approving it at 09:00 would have let it start, holding not."""
    cancelled = {"end": "cancelled", "ended_at": T + timedelta(minutes=5)}
    approve = Policy(rules=(Rule(name="all", action="approve"),))
    hold = Policy(rules=(Rule(name="all", action="hold"),))
    (a,) = run_policy(approve, past("A", **cancelled)).events
    assert a.impact_start == T
    result = run_policy(hold, past("A", **cancelled))
    assert result.events[0].impact_start is None
    assert result.holds == [] and result.peaks == []


def test_overlaps_count_instants_but_not_touching_spans() -> None:
    hold = Policy(rules=(Rule(name="all", action="hold"),))
    lasted = {"started_at": T, "ended_at": T + timedelta(minutes=10)}
    a = past("A", not_before=T + timedelta(minutes=10), **lasted)  # 09:10-09:20
    b = past("B", not_before=T + timedelta(minutes=20), **lasted)  # 09:20-09:30: touches
    c = past("C", not_before=T + timedelta(minutes=40))  # an instant at 09:40
    d = past("D", not_before=T + timedelta(minutes=40))  # the same instant
    freeze = past("F", "Freeze", duration=5, not_before=T + timedelta(minutes=40))
    (peak,) = run_policy(hold, a, b, c, d, freeze).peaks
    assert (peak.peak, peak.at, peak.event_ids) == (2, T + timedelta(minutes=40), ("C", "D"))
    text = render_text(run_policy(hold, a, b, c, d, freeze))
    assert "scale set web" in text and "over by 1" in text


def test_a_first_seen_started_event_is_not_decided_but_counts() -> None:
    policy = Policy()
    gone = {"no_notice": True, "started_at": T, "ended_at": T + timedelta(minutes=3)}
    (r,) = run_policy(policy, past("A", **gone)).events
    assert r.decision is None and r.changed is None
    assert (r.impact_start, r.impact_end) == (T, T + timedelta(minutes=3))


# --------------------------------------------------------------------------- the command


def backtest(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["policy", "backtest", "--graph", str(GRAPH), "--since", "2025-09-01", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_each_policy_file_form(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    check = tmp_path / "check.json"
    assert main(["policy", "check"]) == 0
    check.write_text(capsys.readouterr().out)  # what `policy check` prints
    rules = tmp_path / "rules.json"
    rules.write_text(json.dumps([{"name": "all", "action": "hold"}]))
    local = tmp_path / "local.settings.json"
    local.write_text(
        json.dumps({"Values": {"POLICY__RULES": json.dumps([{"name": "x", "action": "hold"}])}})
    )
    for path, source in (
        (check, str(check)),
        (rules, str(rules)),
        (local, f"the POLICY__* settings in {local}"),
    ):
        code, out, err = backtest(capsys, "--policy", str(path), "--json")
        assert code == 0, err
        assert json.loads(out)["policy"] == source
    assert "POLICY__RULES" not in os.environ  # the settings file's policy did not leak


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{", "not JSON"),
        ('"hold"', "not a policy"),
        (
            '{"rules": [{"name": "a", "action": "hold", "match": {"event_types": ["Reboots"]}}]}',
            "did you mean 'Reboot'",
        ),
        ('{"rules": [{"name": "a", "action": "hold"}], "dry_rum": true}', "dry_rum"),
        (
            '[{"name": "all", "action": "approve"}, '
            '{"name": "t", "match": {"event_types": ["Terminate"]}, "action": "drain"}]',
            "drain",
        ),
        ('{"Values": {"POLICY__DRYRUN": "true"}}', "POLICY__DRYRUN"),
    ],
)
def test_a_bad_policy_file_is_refused_with_why(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, content: str, message: str
) -> None:
    path = tmp_path / "policy.json"
    path.write_text(content)
    code, out, err = backtest(capsys, "--policy", str(path))
    assert code == 2 and out == ""
    assert err.startswith("backtest: ") and message in err, err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("", "not JSON"),
        ('{"count": 1}', "not a Resource Graph result"),
        ('{"data": {"columns": [], "rows": 3}}', "rows"),
    ],
)
def test_a_bad_graph_export_is_refused(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, content: str, message: str
) -> None:
    path = tmp_path / "export.json"
    path.write_text(content)
    code = main(["policy", "backtest", "--graph", str(path)])
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and message in err


def test_the_table_format_of_the_rest_api(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    rows = json.loads(GRAPH.read_text())["data"]
    columns = list(rows[0])
    table = {
        "data": {
            "columns": [{"name": c, "type": "object"} for c in columns],
            "rows": [[r.get(c) for c in columns] for r in rows],
        }
    }
    path = tmp_path / "table.json"
    path.write_text(json.dumps(table))
    code = main(["policy", "backtest", "--graph", str(path), "--since", "2025-09-01", "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert len(json.loads(out)["events"]) == 4


def test_an_empty_directory_of_documents(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code = main(["policy", "backtest", "--documents", str(tmp_path)])
    _, err = capsys.readouterr()
    assert code == 2 and "no *.json files" in err


def test_a_key_vault_reference_for_the_table_is_named(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """What `az functionapp config appsettings list` exports for StateStorage in Azure."""
    reference = "@Microsoft.KeyVault(SecretUri=https://kv.vault.azure.net/secrets/state/)"
    monkeypatch.setenv("StateStorage", reference)
    code = main(["policy", "backtest"])
    _, err = capsys.readouterr()
    assert code == 2 and "StateStorage is an unresolved Key Vault reference" in err
