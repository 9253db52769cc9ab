"""`policy backtest` replays disruption budgets (issue 39): each group's peak concurrent
impact, and which approvals would have waited, for how long, and for whom."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest

from functions.__main__ import main
from functions.backtest.budgets import read_placements, replay_budgets, sizes_of
from functions.backtest.render import render_text, to_json
from functions.model.budgets import Budget, Placement
from functions.model.policy import Policy, Rule
from tests.backtest.test_replay import T, past, run_policy

CHECKOUT = Budget(
    name="checkout-web",
    group_by=("tag:service",),
    match={"tags": {"service": "checkout"}},
    max_unavailable=1,
)
APPROVE = Policy(rules=(Rule(name="reboots", action="approve"),), budgets=(CHECKOUT,))
ZONES = {"c1": "1", "c2": "1", "c3": "2", "c4": "2"}


def placed(vm: str) -> list[Placement]:
    service = "search" if vm.startswith("s") else "checkout"
    zone = ZONES.get(vm.removesuffix("-vm"), "3")
    return [Placement(name=vm, zone=zone, tags={"service": service})]


def wave(*extra):
    """Four checkout VMs (two zones, each its own event) approved at T, ten minutes out
    each, NotBefore 15 to 45 minutes ahead; a search VM beside them."""
    pasts = [
        past(name, not_before=T + timedelta(minutes=minutes), duration=600)
        for name, minutes in (("c1", 15), ("c2", 16), ("c3", 30), ("c4", 45), ("s1", 20))
    ]
    return run_policy(APPROVE, *pasts, *extra)


def test_a_wave_peaks_over_the_budget_and_the_budget_serves_it_one_at_a_time():
    result = wave()
    replayed = replay_budgets(APPROVE.budgets, 1, result.events, placed, {})
    peak = next(p for p in replayed.peaks if p.budget == "checkout-web")
    assert (peak.group, peak.peak, peak.at, peak.limit) == ("tag:service=checkout", 4, T, 1)
    assert peak.vms == ("c1-vm", "c2-vm", "c3-vm", "c4-vm") and peak.over == 3
    assert peak.peak_enforced == 1
    waits = [(w.event_id, w.seconds / 60, w.holders, w.at_not_before) for w in replayed.waits]
    assert waits == [
        ("c2", 10, ("c1-vm",), False),
        ("c3", 20, ("c1-vm",), False),
        ("c4", 30, ("c1-vm",), False),
    ]
    assert all(w.budget == "checkout-web" for w in replayed.waits)
    # The search VM is in no checkout group, and each VM's set (per-set) is its own.
    assert not [p for p in replayed.peaks if "search" in p.group]


def test_an_event_still_waiting_at_notbefore_starts_then_over_budget():
    urgent = past("c5", not_before=T + timedelta(minutes=5), duration=600)
    result = wave(urgent)
    replayed = replay_budgets(APPROVE.budgets, 1, result.events, placed, {})
    (forced,) = [w for w in replayed.waits if w.event_id == "c5"]
    assert forced.at_not_before and forced.over and forced.seconds == 300
    peak = next(p for p in replayed.peaks if p.budget == "checkout-web")
    assert peak.peak_enforced == 2  # c1 and c5 from 09:05: shown over budget, not hidden
    # The oldest NotBefore is served first: c5 went before c2, which now waits 15 minutes.
    assert {w.event_id: w.seconds / 60 for w in replayed.waits} == {
        "c2": 15,
        "c3": 25,
        "c4": 35,
        "c5": 5,
    }


def test_held_and_no_notice_events_count_but_never_wait():
    hold = Policy(rules=(Rule(name="all", action="hold"),), budgets=(CHECKOUT,))
    pasts = [past(n, not_before=T + timedelta(minutes=15), duration=600) for n in ("c1", "c2")]
    replayed = replay_budgets(hold.budgets, 1, run_policy(hold, *pasts).events, placed, {})
    assert replayed.waits == []
    (peak,) = [p for p in replayed.peaks if p.budget == "checkout-web"]
    assert peak.peak == peak.peak_enforced == 2 and peak.at == T + timedelta(minutes=15)


def test_a_percentage_uses_the_groups_size_from_the_export():
    tier = Budget(name="tier", group_by=("tag:service",), max_unavailable="50%")
    policy = Policy(rules=(Rule(name="all", action="approve"),), budgets=(tier,))
    result = wave()
    everyone = [p for vm in ("c1-vm", "c2-vm", "c3-vm", "c4-vm") for p in placed(vm)]
    sizes = sizes_of(policy.budgets, everyone)
    assert sizes == {("tier", "tag:service=checkout"): 4}
    replayed = replay_budgets(policy.budgets, 1, result.events, placed, sizes)
    peak = next(p for p in replayed.peaks if p.budget == "tier" and "checkout" in p.group)
    assert peak.limit == 2 and peak.peak_enforced == 2
    assert [w.event_id for w in replayed.waits] == ["c3", "c4"]


def test_vms_without_a_placement_count_in_their_events_set_only():
    result = wave()
    replayed = replay_budgets(APPROVE.budgets, 1, result.events, lambda vm: None, {})
    assert replayed.unplaced == ["c1-vm", "c2-vm", "c3-vm", "c4-vm", "s1-vm"]
    assert {p.budget for p in replayed.peaks} == {"per-set"}  # every past is in set "web"
    (peak,) = replayed.peaks
    assert peak.group == "set=ss:web" and peak.peak == 5


def test_the_report_and_json_name_peaks_and_waits():
    result = wave()
    result.budgets = replay_budgets(APPROVE.budgets, 1, result.events, placed, {})
    text = render_text(result)
    assert "Disruption budgets: the worst concurrent impact per group" in text
    assert "checkout-web  tag:service=checkout  4" in text
    assert "Approvals that would have waited for a budget (3)" in text
    data = to_json(result)
    assert data["summary"]["budget_waits"] == 3
    assert data["budgets"]["waits"][0] == {
        "EventId": "c2",
        "Resources": ["c2-vm"],
        "budget": "checkout-web",
        "group": "tag:service=checkout",
        "held_by": ["c1-vm"],
        "from": T.isoformat(),
        "until": (T + timedelta(minutes=10)).isoformat(),
        "seconds": 600.0,
        "at_not_before": False,
        "over": False,
    }


def test_the_command_reads_placements_from_a_resource_graph_export(tmp_path, capsys):
    sub = "aaaaaaaa-0000-4000-8000-000000000000"
    base = f"/subscriptions/{sub}/resourceGroups/rg/providers/Microsoft.Compute"
    export = {
        "count": 3,
        "data": [
            {"id": f"{base}/virtualMachines/a-vm", "tags": {"service": "checkout"}, "zones": ["1"]},
            {"id": f"{base}/virtualMachines/b-vm", "tags": {"service": "checkout"}, "zones": ["2"]},
            {
                "id": f"{base}/virtualMachineScaleSets/web/virtualMachines/3",
                "tags": {"service": "checkout"},
                "zones": ["2"],
            },
            {"id": f"{base}/disks/not-a-vm"},
        ],
    }
    (tmp_path / "vms.json").write_text(json.dumps(export))
    found = read_placements(str(tmp_path / "vms.json"))
    assert found["web_3"][0].scale_set == "web" and found["web_3"][0].zone == "2"
    assert set(found) == {"a-vm", "b-vm", "web_3"}
    policy = {
        "rules": [{"name": "all", "action": "approve"}],
        "budgets": [CHECKOUT.model_dump(mode="json")],
    }
    (tmp_path / "policy.json").write_text(json.dumps(policy))
    docs = tmp_path / "docs"
    docs.mkdir()
    for i, vm in enumerate(("a-vm", "b-vm")):
        document = {
            "DocumentIncarnation": 1,
            "Events": [
                {
                    "EventId": f"E-{vm}",
                    "EventType": "Reboot",
                    "ResourceType": "VirtualMachine",
                    "Resources": [vm],
                    "EventStatus": "Scheduled",
                    "NotBefore": (T + timedelta(minutes=15)).strftime("%a, %d %b %Y %H:%M:%S GMT"),
                    "EventSource": "Platform",
                    "DurationInSeconds": 600,  # out 10 minutes each: they overlap
                }
            ],
        }
        envelope = {
            "schema": 1,
            "kind": "document",
            "vm": {"name": vm},
            "sequence": 1,
            "observed_at": (T + timedelta(seconds=i)).isoformat(),
            "document": document,
        }
        (docs / f"{vm}.json").write_text(json.dumps(envelope))
    code = main(
        [
            "policy",
            "backtest",
            "--policy",
            str(tmp_path / "policy.json"),
            "--documents",
            str(docs),
            "--placements",
            str(tmp_path / "vms.json"),
            "--since",
            (T - timedelta(days=1)).isoformat(),
            "--now",
            (T + timedelta(hours=2)).isoformat(),
            "--json",
        ]
    )
    out, err = capsys.readouterr()
    assert code == 0, err
    budgets = json.loads(out)["budgets"]
    (peak,) = [p for p in budgets["peaks"] if p["budget"] == "checkout-web"]
    assert peak["peak"] == 2 and peak["over"] == 1
    assert [w["EventId"] for w in budgets["waits"]] == ["E-b-vm"]


def test_a_candidate_with_a_misspelt_budget_is_refused(tmp_path, capsys):
    (tmp_path / "policy.json").write_text(
        json.dumps({"budgets": [{"name": "x", "group_by": "zones", "max_unavailable": 1}]})
    )
    code = main(["policy", "backtest", "--policy", str(tmp_path / "policy.json"), "--graph", "-"])
    assert code == 2
    assert "did you mean 'zone'" in capsys.readouterr().err


@pytest.mark.parametrize("budgets", [[], None])
def test_without_budgets_the_report_is_as_before(budgets):
    result = wave()
    assert result.budgets is None
    assert "Disruption budgets" not in render_text(result)
