"""What the operator CLI says about the defaults and the documented paths (issue 33 §1):
a `drain` with no drain step configured, a `scale_sets` rule a plain IMDS document cannot
answer, a document with no events, a settings file that is not settings, the empty policy,
and `scale_sets` globs (an AKS node pool's set is `aks-<pool>-<n>-vmss`)."""

from __future__ import annotations

import json

import pytest

from functions.model.envelope import ScheduledEvent
from functions.model.policy import Match, Rule, default_rules, load_policy
from functions.model.policy_lint import lint_rules
from tests.functions.conftest import envelope, event
from tests.functions.test_entrypoints import run_cli

AKS_RULES = [
    {
        "name": "aks-terminate",
        "match": {"event_types": ["Terminate"], "scale_sets": ["aks-*"]},
        "action": "hold",
    },
    {"name": "terminate-drain", "match": {"event_types": ["Terminate"]}, "action": "drain"},
    {"name": "default-hold", "action": "hold"},
]


def _document(tmp_path, *events: dict) -> str:
    path = tmp_path / "doc.json"
    path.write_text(json.dumps({"DocumentIncarnation": 4, "Events": list(events)}))
    return str(path)


def test_explain_says_which_drain_applies(tmp_path):
    """No drain step of the operator's: the readiness probe drains (issue 38); their hook
    wins where configured; with the probe drain turned off too, the event is held."""
    doc = _document(tmp_path, event("T", "Terminate", source="User"))
    done = run_cli("policy", "explain", doc)
    line = json.loads(done.stdout)
    assert line["action"] == "drain"
    assert line["drain"] == (
        "no drain step of yours configured: each VM's readiness probe 503 where a load "
        "balancer probed its relay in the 30 s before its heartbeat (it takes the VM out), "
        "then 60 s to drain (probe 15 s x 2 (DRAIN__PROBE_INTERVAL_SECONDS, "
        "DRAIN__PROBE_THRESHOLD) + 30 s for established connections "
        "(DRAIN__CONNECTION_SECONDS)), then approve; no drain on this VM where no load "
        "balancer probes the relay: a Platform event or a scale-in is held until NotBefore, "
        "a User Reboot or Redeploy approved at once"
    )
    done = run_cli("policy", "explain", doc, env={"DRAIN__RELAY_HOOK": "drain"})
    assert json.loads(done.stdout)["drain"].startswith(
        "relay hook 'drain' (DRAIN__RELAY_HOOK); on a VM whose relay has no such hook, each "
        "VM's readiness probe 503"
    )
    done = run_cli(
        "policy", "explain", doc, env={"DRAIN__RELAY_HOOK": "drain", "DRAIN__READINESS": "false"}
    )
    assert (
        json.loads(done.stdout)["drain"] == "relay hook 'drain' (DRAIN__RELAY_HOOK), then approve"
    )
    done = run_cli("policy", "explain", doc, env={"DRAIN__READINESS": "false"})
    line = json.loads(done.stdout)
    # No drain on any VM: Microsoft's sample, said (issue 45); a scale-in is held.
    assert line["action"] == "hold" and "no drain on this VM: held" in line["reason"]
    assert line["drain"].startswith("no drain on this VM: DRAIN__HTTP_URL")


def test_explain_default_policy_drains_every_disruptive_event(tmp_path):
    """Issue 45's "done when": no POLICY__* setting gives `drain` for every disruptive
    event, `approve` for a short Freeze; a VM with no drain is held (Platform) or approved
    (User) and explain says so. On 2f59d6a: hold, hold, hold, hold, approve, approve."""
    doc = _document(
        tmp_path,
        event("PR", "Reboot"),
        event("PD", "Redeploy"),
        event("SP", "Preempt"),
        event("F30", "Freeze", duration=30),
        event("UR", "Reboot", source="User"),
        event("UD", "Redeploy", source="User"),
        event("T", "Terminate", source="User"),
        event("F5", "Freeze", duration=5),
    )
    done = run_cli("policy", "explain", doc)
    assert done.returncode == 0, done.stderr
    actions = [json.loads(x)["action"] for x in done.stdout.splitlines()]
    assert actions == ["drain"] * 7 + ["approve"]
    done = run_cli("policy", "explain", doc, "--drain", "none")
    lines = [json.loads(x) for x in done.stdout.splitlines()]
    assert [x["action"] for x in lines] == ["hold"] * 4 + ["approve"] * 2 + ["hold", "approve"]
    assert "no drain on this VM: held" in lines[0]["reason"]
    assert "no drain on this VM" in lines[4]["drain"]


def test_explain_names_the_scale_set_rules_a_plain_document_cannot_answer(tmp_path):
    rules = {"POLICY__RULES": json.dumps(AKS_RULES)}
    doc = _document(tmp_path, event("T", "Terminate", resources=("aks-np-1_3",)))
    done = run_cli("policy", "explain", doc, env=rules)
    assert done.returncode == 0, done.stderr
    line = json.loads(done.stdout)
    assert line["rule"] == "terminate-drain"
    assert line["not_evaluated"] == ["rule 'aks-terminate' (scale_sets) not evaluated"]
    assert "--scale-set" in done.stderr
    # Named, the set decides; no warning.
    done = run_cli("policy", "explain", doc, "--scale-set", "aks-np-12345-vmss", env=rules)
    line = json.loads(done.stdout)
    assert (line["rule"], line["action"]) == ("aks-terminate", "hold")
    assert "not_evaluated" not in line and "warning" not in done.stderr
    # "In no scale set" is an answer too.
    done = run_cli("policy", "explain", doc, "--scale-set", "", env=rules)
    assert "not_evaluated" not in json.loads(done.stdout)
    # An envelope names the VM's set (or that it has none): nothing to warn about.
    env_file = tmp_path / "env.json"
    env_file.write_text(envelope("vm1", 1, [event("E", "Terminate")], scale_set="aks-a-1-vmss"))
    done = run_cli("policy", "explain", str(env_file), env=rules)
    assert json.loads(done.stdout)["rule"] == "aks-terminate"
    assert "warning" not in done.stderr


def test_explain_says_when_a_document_has_no_events(tmp_path):
    done = run_cli("policy", "explain", _document(tmp_path))
    assert done.returncode == 0
    assert done.stdout == ""
    assert "no events" in done.stderr and "nothing to decide" in done.stderr


def test_settings_check_refuses_a_file_that_is_not_settings(tmp_path):
    imds = tmp_path / "imds.json"
    imds.write_text(json.dumps({"DocumentIncarnation": 1, "Events": []}))
    done = run_cli("settings", "check", "--local", "--file", str(imds))
    assert done.returncode == 2 and "settings OK" not in done.stdout
    assert "not app settings" in done.stderr and "Events" in done.stderr
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"colour": "blue", "size": "3"}))
    done = run_cli("settings", "check", "--local", "--file", str(other))
    assert done.returncode == 2 and "no name in it" in done.stderr
    empty = tmp_path / "empty.json"
    empty.write_text("[]")
    assert run_cli("settings", "check", "--local", "--file", str(empty)).returncode == 2
    good = tmp_path / "good.json"
    good.write_text(json.dumps([{"name": "POLICY__DRY_RUN", "value": "true"}]))
    done = run_cli("settings", "check", "--local", "--file", str(good))
    assert done.returncode == 0, done.stderr


def test_an_empty_rule_list_is_the_reference_policy_as_in_the_bicep(monkeypatch):
    """infra/main.bicep: an empty `policyRules` (the default) leaves POLICY__RULES out, the
    default policy; the same list set by hand means the same, said in a warning."""
    monkeypatch.setenv("POLICY__RULES", "[]")
    load = load_policy()
    assert load.policy is not None, load.error
    assert [r.name for r in load.policy.rules] == [r.name for r in default_rules()]
    assert any("empty list" in w for w in load.warnings)
    done = run_cli("settings", "check", "--local", env={"POLICY__RULES": "[]"})
    assert done.returncode == 0, done.stderr


def _ev(event_type: str = "Terminate") -> ScheduledEvent:
    return ScheduledEvent.model_validate(event("X", event_type))


@pytest.mark.parametrize(
    ("pattern", "sets", "hit"),
    [
        ("aks-*", ("aks-nodepool1-12345678-vmss",), True),
        ("AKS-*", ("aks-np-1-vmss",), True),
        ("aks-*", ("web",), False),
        ("web", ("WEB",), True),
        ("web", ("web-2",), False),
    ],
)
def test_scale_sets_are_globs_like_resources(pattern, sets, hit):
    assert Match(scale_sets=(pattern,)).matches(_ev(), sets) is hit


def test_a_scale_set_carve_out_above_a_drain_passes_the_lint():
    rules = [Rule.model_validate(r) for r in AKS_RULES]
    errors, warnings = lint_rules(rules)
    assert errors == [] and warnings == []
    # Without the event type, the carve-out takes every Terminate of those sets from
    # the drain rule and also Reboots: still refused, the operator is told how to narrow.
    broad = [Rule.model_validate({**AKS_RULES[0], "match": {"scale_sets": ["aks-*"]}})]
    errors, _ = lint_rules([*broad, *rules[1:]])
    assert errors and "narrow" in errors[0]


def test_a_short_app_secret_is_one_clear_line_in_policy_check():
    """Issue 45: with the shell's APP_SECRET under 32 characters, 2f59d6a's `policy check`
    printed the policy and then a traceback (exit 1)."""
    done = run_cli("policy", "check", env={"APP_SECRET": "short"})
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    said = [x for x in done.stderr.splitlines() if "APP_SECRET" in x]
    assert said == [
        "warning: APP_SECRET: 5 characters; at least 32 needed: the app would not start with "
        "this environment (`settings check` lists every setting)"
    ]
    assert json.loads(done.stdout)["rules"]
