"""`policy explain` names the disruption budgets a VM falls under and their state (issue 39):
from flags offline, or from what the identity sync and the lifecycle stored (Azurite)."""

from __future__ import annotations

import json
import os
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from azure.data.tables import TableServiceClient

from functions.__main__ import main
from functions.model.budgets import Placement
from functions.store.budget_slots import BudgetHolder, BudgetSlot, BudgetSlots, BudgetWaiter
from functions.store.placements import Placements
from functions.store.state import Store

NOW = "2026-11-21T10:00:00+00:00"
T0 = datetime(2026, 11, 21, 10, 0, tzinfo=UTC)
BUDGETS = [
    {
        "name": "checkout-web",
        "group_by": "tag:service",
        "match": {"tags": {"service": "checkout"}},
        "max_unavailable": 1,
    },
    {"name": "per-zone", "group_by": ["tag:service", "zone"], "max_unavailable": "50%"},
]


def document(kind: str = "Reboot", vm: str = "checkout-a_1", duration: int = -1) -> dict:
    return {
        "DocumentIncarnation": 2,
        "Events": [
            {
                "EventId": "EV-1",
                "EventType": kind,
                "ResourceType": "VirtualMachine",
                "Resources": [vm],
                "EventStatus": "Scheduled",
                "NotBefore": "Sat, 21 Nov 2026 10:15:00 GMT",
                "Description": "",
                "EventSource": "Platform",
                "DurationInSeconds": duration,
            }
        ],
    }


@pytest.fixture
def env(monkeypatch):
    for name in list(os.environ):
        if name.upper().startswith(("POLICY__", "STATESTORAGE", "AZUREWEBJOBSSTORAGE")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("POLICY__BUDGETS", json.dumps(BUDGETS))
    return monkeypatch


def explain(tmp_path, capsys, data, *flags) -> tuple[int, dict, str]:
    path = tmp_path / "doc.json"
    path.write_text(json.dumps(data))
    code = main(["policy", "explain", str(path), "--now", NOW, *flags])
    out, err = capsys.readouterr()
    lines = [json.loads(line) for line in out.splitlines()]
    return code, lines[0] if lines else {}, err


def test_offline_the_flags_are_the_vms_facts(env, tmp_path, capsys):
    flags = ("--tag", "service=checkout", "--zone", "1", "--scale-set", "checkout-a")
    code, line, err = explain(tmp_path, capsys, document(), *flags)
    assert code == 0, err
    # Budgets cover the VM: they replace max_concurrent_per_set for it (issue 45), and say so.
    assert [(b["budget"], b["group"], b["limit"]) for b in line["budgets"]] == [
        ("checkout-web", "tag:service=checkout", 1),
        ("per-zone", "tag:service=checkout|zone=1", 1),
    ]
    assert all(b["state"].startswith("unknown (") for b in line["budgets"])
    assert line["budgets"][1]["limit_note"].startswith("the group's size is not known")
    assert line["budgets_not_covering"] == []
    assert line["budgets_note"].startswith("max_concurrent_per_set (1) does not apply")


def test_a_budget_allowing_more_than_the_per_set_guard_is_warned_about(env, tmp_path, capsys):
    """Issue 45: a 20 % budget was silently cut to one VM per set. `policy check` (and so
    `settings check`, from the same load) and `policy explain` say what applies."""
    twenty = [{"name": "batch", "group_by": "tag:tier", "max_unavailable": "20%"}]
    env.setenv("POLICY__BUDGETS", json.dumps(twenty))
    assert main(["policy", "check"]) == 0
    err = capsys.readouterr().err
    assert "budget 'batch' (max_unavailable 20%) replaces max_concurrent_per_set (1)" in err
    flags = ("--tag", "tier=batch", "--scale-set", "batch-a")
    code, line, _ = explain(tmp_path, capsys, document(vm="batch-a_0"), *flags)
    assert code == 0 and [b["budget"] for b in line["budgets"]] == ["batch"]
    assert "does not apply" in line["budgets_note"]
    # A VM no budget covers keeps the per-set guard.
    code, line, _ = explain(tmp_path, capsys, document(vm="web_0"), "--scale-set", "web")
    assert [b["budget"] for b in line["budgets"]] == ["per-set"]


def test_a_budget_that_leaves_the_vm_out_says_why(env, tmp_path, capsys):
    code, line, _ = explain(tmp_path, capsys, document(), "--tag", "service=search")
    assert code == 0
    assert [b["budget"] for b in line["budgets"]] == []
    assert {b["budget"]: b["why"] for b in line["budgets_not_covering"]} == {
        "checkout-web": "its match leaves out this VM",
        "per-zone": "Azure places it in no availability zone",
        "per-set": "it is in no scale set or availability set",
    }


def test_without_facts_or_storage_it_says_what_to_give(env, tmp_path, capsys):
    code, line, err = explain(tmp_path, capsys, document())
    assert code == 0
    assert "--zone, --tag" in line["budgets_not_evaluated"]
    assert "warning: EV-1: Azure's facts about checkout-a_1 are not known here" in err


def test_an_event_budgets_do_not_count(env, tmp_path, capsys):
    code, line, _ = explain(tmp_path, capsys, document("Freeze", duration=5), "--zone", "1")
    assert code == 0 and line["budgets"] == [] and "not disruptive" in line["budgets_note"]


def test_a_policy_without_budgets_prints_as_before(env, tmp_path, capsys):
    env.delenv("POLICY__BUDGETS")
    code, line, _ = explain(tmp_path, capsys, document())
    assert code == 0 and not [k for k in line if k.startswith("budgets")]


def test_a_bad_tag_flag_exits_2(env, tmp_path, capsys):
    code, _, err = explain(tmp_path, capsys, document(), "--tag", "service")
    assert code == 2 and "--tag 'service': use NAME=VALUE" in err


@pytest.mark.azurite
def test_with_storage_the_synced_facts_and_the_slots_state(env, tmp_path, capsys, azurite):
    prefix = "x" + uuid.uuid4().hex[:10]
    store = Store.from_connection_string(azurite, prefix).ensure_tables()
    identities = TableServiceClient.from_connection_string(azurite).get_table_client(
        f"{prefix}identities"
    )
    placements = Placements(identities)
    placed = Placement(
        name="checkout-a_1",
        vm_id=str(uuid.uuid4()),
        zone="1",
        scale_set="checkout-a",
        tags={"service": "checkout"},
        fetched_at=T0,
    )
    placements.put([placed])
    placements.write_sizes({"per-zone": {"tag:service=checkout|zone=1": 6}}, T0)
    slots = BudgetSlots(store.events)

    def held(row):
        return BudgetSlot(
            budget="checkout-web",
            group="tag:service=checkout",
            limit=1,
            holders=[BudgetHolder(vm="checkout-b_0", event_id="EV-0", since=T0)],
            waiting=[
                BudgetWaiter(
                    vm="checkout-a_1",
                    event_id="EV-1",
                    not_before=T0 + timedelta(minutes=15),
                    since=T0,
                )
            ],
        )

    slots.mutate_budget_slot("checkout-web", "tag:service=checkout", held)
    env.setenv("StateStorage", azurite)
    env.setenv("STATE_TABLE_PREFIX", prefix)
    code, line, err = explain(tmp_path, capsys, document())
    assert code == 0, err
    by_budget = {b["budget"]: b for b in line["budgets"]}
    assert by_budget["checkout-web"]["state"] == "full: 1 of 1 out (checkout-b_0)"
    assert by_budget["checkout-web"]["waiting"] == 1
    assert by_budget["per-zone"]["size"] == 6 and by_budget["per-zone"]["limit"] == 3
    assert by_budget["per-zone"]["state"] == "free: 0 of 3 out"
    assert "per-set" not in by_budget  # the budgets replace it for this VM
    # A VM the sync has not placed: said, not guessed.
    code, line, err = explain(tmp_path, capsys, document(vm="new-vm"))
    assert "Azure's facts about new-vm are not known here" in line["budgets_not_evaluated"]


def test_no_azure_sign_in_explains_the_policy_and_says_why_in_one_line(env, tmp_path, capsys):
    """Issue 45: budgets set, `StateStorage__accountName` an account this shell cannot sign
    in to. 2f59d6a printed DefaultAzureCredential's list of every credential it tried and a
    traceback, exit 1, nothing explained. Now: the decision, and one line saying why the
    budgets were not evaluated and what to do."""
    env.setenv("StateStorage__accountName", "sebridgenosignin")
    # Only the Azure CLI credential, with no `az` on PATH: unavailable at once, offline.
    env.setenv("AZURE_TOKEN_CREDENTIALS", "AzureCliCredential")
    env.setenv("PATH", str(tmp_path))
    code, line, err = explain(tmp_path, capsys, document())
    assert code == 0
    assert line["action"] == "drain"
    assert (
        "no Azure sign-in: run `az login`, or pass `--tag`/`--zone`"
        in (line["budgets_not_evaluated"])
    )
    assert "Traceback" not in err and "Attempted credentials" not in err
    assert len(err.strip().splitlines()) == 1, err
