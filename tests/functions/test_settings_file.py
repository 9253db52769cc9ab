"""The policy where the docs keep it is checked offline from the file itself (issue 38):
`settings check --file infra/main.bicepparam` answered `Expecting value: line 1 column 1`
on 2cd3d60, so a typo there deployed and the app failed closed. It now reads what a
deployment from the file writes, secrets from this shell as Bicep reads them, and `policy
check` says where the policy came from."""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
from pathlib import Path

import pytest

from functions.bicepparam import read_parameter_file
from tests.functions.test_settings_check import run_check

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "infra" / "main.bicepparam"
SHELL = {
    "APP_SECRET": "a" * 64,
    "SSH_PUBLIC_KEY": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAI example",
    "ALERT_EMAIL": "oncall@example.com",
    "SEBRIDGE_DRAIN_RELAY_HOOK": "drain",
}


def variant(tmp_path: Path, **params: str) -> Path:
    """main.bicepparam with some `param NAME = VALUE` lines replaced (Bicep text)."""
    text = EXAMPLE.read_text()
    for name, value in params.items():
        lines = text.splitlines()
        start = next(i for i, line in enumerate(lines) if line.startswith(f"param {name} ="))
        end = start + 1
        while end < len(lines) and lines[end].startswith((" ", "]", "}")):
            end += 1  # a value over several lines
        text = "\n".join([*lines[:start], f"param {name} = {value}", *lines[end:]]) + "\n"
    path = tmp_path / "main.bicepparam"
    path.write_text(text)
    return path


def test_the_worked_example_checks_offline():
    done = run_check(SHELL, "--file", str(EXAMPLE), "--strict")
    assert done.returncode == 0, done.stderr
    assert "settings OK" in done.stdout
    assert "Expecting value" not in done.stderr
    # Where each policy setting comes from: the file's parameters.
    assert "POLICY__DRY_RUN from " + str(EXAMPLE) + ": policyDryRun" in done.stderr
    assert f"policyRules is empty or not set in {EXAMPLE}" in done.stderr


def test_a_policy_typo_in_the_parameter_file_is_refused(tmp_path):
    rules = "[\n  { name: 'reboots', match: { event_types: [ 'Reboots' ] }, action: 'approve' }\n]"
    done = run_check(SHELL, "--file", str(variant(tmp_path, policyRules=rules)))
    assert done.returncode == 2
    assert "error: POLICY__RULES[0].match.event_types" in done.stderr
    assert "'Reboot'" in done.stderr
    dry = run_check(SHELL, "--file", str(variant(tmp_path, policyDryRun="'yes please'")))
    assert dry.returncode == 2 and "POLICY__DRY_RUN" in dry.stderr


def test_the_file_decides_not_this_shells_app_settings():
    """A deployment writes the file's settings: a POLICY__* left in the shell is not them."""
    shell = {**SHELL, "POLICY__DRYRUN": "true", "POLICY__RULES": "not json"}
    done = run_check(shell, "--file", str(EXAMPLE), "--strict")
    assert done.returncode == 0, done.stderr


def test_secrets_and_the_ssh_key_are_read_from_this_shell_as_bicep_reads_them(tmp_path):
    bad = run_check(
        {**SHELL, "TEAMS_WEBHOOK_URL": "htps://x.logic.azure.com/w?sig=s"},
        "--file",
        str(EXAMPLE),
        "--strict",
    )
    assert bad.returncode == 2 and "warning: teams: TEAMS_WEBHOOK_URL has htps://" in bad.stderr
    key = run_check({**SHELL, "PAGERDUTY_ROUTING_KEY": "abc"}, "--file", str(EXAMPLE), "--strict")
    assert key.returncode == 2 and "PAGERDUTY_ROUTING_KEY has 3 characters" in key.stderr
    no_secret = run_check(
        {k: v for k, v in SHELL.items() if k != "APP_SECRET"}, "--file", str(EXAMPLE)
    )
    assert no_secret.returncode == 2
    assert "error: appSecret: readEnvironmentVariable('APP_SECRET') has no default" in (
        no_secret.stderr
    )
    no_key = {k: v for k, v in SHELL.items() if k != "SSH_PUBLIC_KEY"}
    done = run_check(no_key, "--file", str(EXAMPLE))
    assert done.returncode == 2
    assert "error: adminSshPublicKey: empty while deployExampleScaleSet is true" in done.stderr
    # Without the example no key is asked for.
    off = variant(tmp_path, deployExampleScaleSet="false")
    assert run_check(no_key, "--file", str(off), "--strict").returncode == 0


def test_alert_receivers_of_the_file_count_as_someone_told(tmp_path):
    quiet = {k: v for k, v in SHELL.items() if k != "ALERT_EMAIL"}
    done = run_check(quiet, "--file", str(EXAMPLE))
    assert "no channel is on" in done.stderr
    mailed = variant(tmp_path, alertEmail="'oncall@example.com'")
    assert "no channel is on" not in run_check(quiet, "--file", str(mailed)).stderr


def test_bicep_expressions_are_evaluated_as_bicep_does(tmp_path):
    path = tmp_path / "p.bicepparam"
    path.write_text(
        "using 'main.bicep'\n"
        "param policyDryRun = bool(readEnvironmentVariable('DRY', 'false'))\n"
        "param policyMaxConcurrentPerSet = int('3')\n"
        'param policyWindows = json(\'[{"days":["Sat"],"start":"01:00","end":"05:00"}]\')\n'
        "param policyTimezone = 'Europe/Oslo'\n"
        "param drainRelayHook = 'it\\'s'\n"
        "param publicBaseUrl = 'https://${prefix}.example.org'\n"
        "param approvalMarginSeconds = -1\n"
        "param operatorsAppRole = toLower('X')\n"
    )
    parsed = read_parameter_file(str(path), {"DRY": "true"})
    assert parsed.settings["POLICY__DRY_RUN"] == "true"
    assert parsed.settings["POLICY__MAX_CONCURRENT_PER_SET"] == "3"
    assert json.loads(parsed.settings["POLICY__WINDOWS"])[0]["days"] == ["Sat"]
    assert parsed.settings["DRAIN__RELAY_HOOK"] == "it's"
    assert parsed.settings["APPROVAL_MARGIN_SECONDS"] == "-1"
    assert "PUBLIC_BASE_URL" not in parsed.settings and "OPERATORS_APP_ROLE" not in parsed.settings
    assert {n.split(":")[0] for n in parsed.notes} == {"publicBaseUrl", "operatorsAppRole"}


def test_a_file_that_is_not_a_parameter_file_is_named(tmp_path):
    path = tmp_path / "broken.bicepparam"
    path.write_text("using 'main.bicep'\nparam policyRules = [ {\n")
    done = run_check(SHELL, "--file", str(path))
    assert done.returncode == 2 and str(path) in done.stderr and "Traceback" not in done.stderr


def policy_check(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    """`python -m functions policy check ARGS`, in this process, with only `env`."""
    from functions.__main__ import main

    saved = dict(os.environ)
    out, err = io.StringIO(), io.StringIO()
    os.environ.clear()
    os.environ.update({"PATH": saved.get("PATH", "/usr/bin:/bin"), **env})
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(["policy", "check", *args])
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return subprocess.CompletedProcess(args, code, out.getvalue(), err.getvalue())


@pytest.mark.parametrize(
    ("env", "args", "said"),
    [
        (
            {},
            (),
            "the rules are the default policy, drain then approve (no POLICY__RULES in this "
            "environment",
        ),
        (
            {"POLICY__RULES": '[{"name":"hold-all","action":"hold"}]'},
            (),
            "POLICY__RULES from an environment variable",
        ),
        (SHELL, ("--file", str(EXAMPLE)), f"POLICY__WINDOWS from {EXAMPLE}: policyWindows"),
    ],
)
def test_policy_check_says_where_the_policy_came_from(env, args, said):
    done = policy_check(env, *args)
    assert done.returncode == 0, done.stderr
    assert said in done.stderr
    json.loads(done.stdout)  # the policy itself stays clean JSON on stdout


def test_policy_check_of_a_settings_file_and_of_a_parameter_file_with_rules(tmp_path):
    settings = tmp_path / "settings.json"
    rules = [{"name": "hold-all", "action": "hold"}]
    settings.write_text(json.dumps({"Values": {"POLICY__RULES": json.dumps(rules)}}))
    done = policy_check({}, "--file", str(settings))
    assert f"POLICY__RULES from {settings}" in done.stderr
    assert json.loads(done.stdout)["rules"][0]["name"] == "hold-all"
    path = variant(tmp_path, policyRules="[\n  { name: 'hold-all', action: 'hold' }\n]")
    done = policy_check(SHELL, "--file", str(path))
    assert f"POLICY__RULES from {path}: policyRules" in done.stderr
    assert [r["name"] for r in json.loads(done.stdout)["rules"]] == ["hold-all"]
