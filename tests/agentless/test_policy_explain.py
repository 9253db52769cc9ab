"""`python -m functions policy explain` on Event Grid input prints what it prints for IMDS."""

from __future__ import annotations

import json
import os

import pytest

from functions.__main__ import main
from tests.agentless.grid import event, grid_event, owner_id

NOW = "2026-11-21T10:00:00+00:00"
EVENTS = [
    event("EV-F", "Freeze", duration=5),
    event("EV-R", "Reboot"),
    event("EV-U", "Redeploy", source="User"),
    event("EV-T", "Terminate", source="User", resources=("web_3",)),
]


def explain(tmp_path, capsys, data) -> tuple[int, list[dict], str]:
    path = tmp_path / "input.json"
    path.write_text(json.dumps(data))
    code = main(["policy", "explain", str(path), "--now", NOW])
    out, err = capsys.readouterr()
    return code, [json.loads(line) for line in out.splitlines()], err


@pytest.mark.parametrize("schema", ["eventgrid", "cloudevents"])
def test_same_decisions_as_for_the_imds_document(tmp_path, capsys, monkeypatch, schema):
    for name in [k for k in os.environ if k.upper().startswith("POLICY__")]:
        monkeypatch.delenv(name)
    code, imds, _ = explain(tmp_path, capsys, {"DocumentIncarnation": 3, "Events": EVENTS})
    # The default policy (issue 45): every disruptive event drained, a short Freeze approved.
    assert code == 0 and [d["action"] for d in imds] == ["approve", "drain", "drain", "drain"]
    code, grid, _ = explain(tmp_path, capsys, [grid_event(e, schema=schema) for e in EVENTS])
    assert code == 0 and grid == imds
    code, one, _ = explain(tmp_path, capsys, grid_event(EVENTS[1], schema=schema))
    assert code == 0 and one == imds[1:2]


def test_a_scale_set_owner_counts_as_the_events_scale_set(tmp_path, capsys, monkeypatch):
    rules = [
        {"name": "web", "match": {"scale_sets": ["web"]}, "action": "approve"},
        {"name": "rest", "action": "hold"},
    ]
    monkeypatch.setenv("POLICY__RULES", json.dumps(rules))
    item = grid_event(event("EV-S", "Reboot"), owner=owner_id("virtualMachineScaleSets", "web"))
    code, (line,), _ = explain(tmp_path, capsys, item)
    assert code == 0 and line["rule"] == "web"


def test_bad_notifications_are_named_and_exit_2(tmp_path, capsys):
    bad = grid_event(event("EV-B"))
    bad["data"]["resourceInfo"]["properties"]["EventStatus"] = "Exploded"
    code, lines, err = explain(tmp_path, capsys, [bad, grid_event(event("EV-OK"))])
    assert code == 2 and [line["EventId"] for line in lines] == ["EV-OK"]
    assert "EventStatus 'Exploded'" in err
