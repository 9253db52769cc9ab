"""Issue 45: a policy is written once, in `infra/main.bicepparam` form, and every policy
command reads that file (`--file`): on 2f59d6a `policy explain` and `policy backtest`
could not, so the policy was written again as JSON. The file is docs/policy.md's own
example (the issue's policy), so the docs and the commands cannot drift apart."""

from __future__ import annotations

import json
import re
from pathlib import Path

from tests.functions.conftest import event
from tests.functions.test_entrypoints import run_cli

ROOT = Path(__file__).resolve().parents[2]


def issue_policy(tmp_path: Path) -> Path:
    """docs/policy.md's Bicep example of the issue's policy, as a parameter file."""
    text = (ROOT / "docs" / "policy.md").read_text()
    blocks = re.findall(r"^```bicep\n(.*?)^```", text, re.M | re.S)
    (block,) = [b for b in blocks if "hold-freezes" in b]
    path = tmp_path / "main.bicepparam"
    path.write_text(f"using 'main.bicep'\n{block}")
    return path


def test_check_explain_and_backtest_read_one_parameter_file(tmp_path):
    path = issue_policy(tmp_path)
    done = run_cli("policy", "check", "--file", str(path))
    assert done.returncode == 0, done.stderr
    policy = json.loads(done.stdout)
    names = [r["name"] for r in policy["rules"]]
    assert names == ["hold-freezes", "terminate-drain", "web-reboots", "drain-then-approve"]
    assert [b["name"] for b in policy["budgets"]] == ["checkout", "batch"]
    assert f"policy from: POLICY__BUDGETS from {path}: policyBudgets" in done.stderr

    doc = tmp_path / "doc.json"
    events = [
        event("W", "Reboot", resources=("web-1",)),
        event("F", "Freeze", duration=5),
        event("T", "Terminate", source="User"),
    ]
    doc.write_text(json.dumps({"DocumentIncarnation": 1, "Events": events}))
    done = run_cli(
        "policy", "explain", str(doc), "--file", str(path), "--tag", "tier=web", "--vm", "web-1"
    )
    assert done.returncode == 0, done.stderr
    lines = [json.loads(x) for x in done.stdout.splitlines()]
    assert [(x["EventId"], x["action"], x["rule"]) for x in lines] == [
        ("W", "drain", "web-reboots"),  # matched on the VM's tag
        ("F", "hold", "hold-freezes"),
        ("T", "drain", "terminate-drain"),
    ]
    # Without the VM's tags, the tag rule is said not evaluated, and a later rule decides.
    done = run_cli("policy", "explain", str(doc), "--file", str(path), "--scale-set", "")
    first = json.loads(done.stdout.splitlines()[0])
    assert first["rule"] == "drain-then-approve"
    assert first["not_evaluated"] == ["rule 'web-reboots' (tags) not evaluated"]

    # What seven relays recorded during one `make demo`, replayed under the same file.
    demo = ROOT / "tests" / "backtest" / "samples" / "demo-envelopes.jsonl"
    args = ("--documents", str(demo), "--now", "2026-11-28", "--json")
    done = run_cli("policy", "backtest", "--file", str(path), *args)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["policy"] == f"the policy parameters of {path}"
    rules = {e["candidate"]["rule"] for e in result["events"] if e["candidate"]}
    assert {"hold-freezes", "terminate-drain", "drain-then-approve"} <= rules
