"""Issue 45: a redeploy from `infra/main.bicepparam` could undo the first deploy. The
documented first deploy passed the existing VNet, `vmScopes` and the operators' sign-in on
the command line; every later documented deploy passed only the file, which, taken
literally, made a new VNet, turned the pages off and shrank `vmScopes`, and nothing said so.
Now `settings check --file main.bicepparam --deployed FILE` names every value a redeploy
from the file would change, against the last deployment's parameters (`az deployment group
show ... --query properties.parameters`: each name maps to its `type` and `value`; a secure
parameter has no value there) or the app's settings (`az functionapp config appsettings
list`). On 2f59d6a there was no such option (argparse exits 2: unrecognized arguments)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.functions.test_entrypoints import run_cli

ROOT = Path(__file__).resolve().parents[2]
SECRET = {"APP_SECRET": "a" * 64}


def first_deploy(tmp_path: Path) -> str:
    """What the first deploy into an existing VNet, with the pages on, left behind."""
    parameters = {
        "prefix": {"type": "String", "value": "sebridge"},
        "createVirtualNetwork": {"type": "Bool", "value": False},
        "existingVirtualNetworkName": {"type": "String", "value": "vnet-prod"},
        "vmScopes": {
            "type": "Array",
            "value": [
                "/subscriptions/0000/resourceGroups/rg-web",
                "/subscriptions/0000/resourceGroups/rg-api",
            ],
        },
        "operatorsClientId": {"type": "String", "value": "11111111-2222-3333-4444-555555555555"},
        "relayCallbackPort": {"type": "Int", "value": 8492},
        "appSecret": {"type": "SecureString"},
    }
    path = tmp_path / "deployed.json"
    path.write_text(json.dumps(parameters))
    return str(path)


def test_a_redeploy_from_the_worked_example_names_what_it_would_undo(tmp_path):
    deployed = first_deploy(tmp_path)
    args = ("settings", "check", "--file", "infra/main.bicepparam", "--deployed", deployed)
    done = run_cli(*args, env=SECRET)
    said = [x for x in done.stderr.splitlines() if "a redeploy from" in x]
    assert said == [
        "warning: a redeploy from infra/main.bicepparam changes createVirtualNetwork: deployed "
        "false, the file true",
        "warning: a redeploy from infra/main.bicepparam changes existingVirtualNetworkName: "
        "deployed 'vnet-prod'; the file does not set it, so a redeploy writes the template's "
        "default",
        "warning: a redeploy from infra/main.bicepparam changes operatorsClientId: deployed "
        "'11111111-2222-3333-4444-555555555555'; the file does not set it, so a redeploy "
        "writes the template's default",
        "warning: a redeploy from infra/main.bicepparam changes vmScopes: deployed "
        '["/subscriptions/0000/resourceGroups/rg-web","/subscriptions/0000/resourceGroups/'
        "rg-api\"]; the file does not set it, so a redeploy writes the template's default",
    ], done.stderr
    # --strict: a redeploy that would change what runs is not clean.
    strict = run_cli(*args, "--strict", env=SECRET)
    assert strict.returncode == 2


def test_one_file_with_every_value_changes_nothing(tmp_path):
    deployed = first_deploy(tmp_path)
    text = (ROOT / "infra" / "main.bicepparam").read_text()
    text = text.replace("using 'main.bicep'", f"using '{ROOT / 'infra' / 'main.bicep'}'")
    text = text.replace("param createVirtualNetwork = true", "param createVirtualNetwork = false")
    text += (
        "\nparam existingVirtualNetworkName = 'vnet-prod'\n"
        "param vmScopes = [\n  '/subscriptions/0000/resourceGroups/rg-web'\n"
        "  '/subscriptions/0000/resourceGroups/rg-api'\n]\n"
        "param operatorsClientId = '11111111-2222-3333-4444-555555555555'\n"
    )
    path = tmp_path / "main.bicepparam"
    path.write_text(text)
    done = run_cli("settings", "check", "--file", str(path), "--deployed", deployed, env=SECRET)
    assert f"note: a redeploy from {path} changes nothing deployed" in done.stderr, done.stderr


def test_against_the_apps_settings(tmp_path):
    """The app's settings: a policy set by hand (a dry run) that the file does not keep."""
    settings = [
        {"name": "POLICY__DRY_RUN", "value": "true", "slotSetting": False},
        {"name": "POLICY__TIMEZONE", "value": "UTC", "slotSetting": False},
        {"name": "APP_SECRET", "value": "@Microsoft.KeyVault(SecretUri=https://kv/secrets/x)"},
    ]
    deployed = tmp_path / "appsettings.json"
    deployed.write_text(json.dumps(settings))
    args = ("settings", "check", "--file", "infra/main.bicepparam", "--deployed", str(deployed))
    done = run_cli(*args, env=SECRET)
    said = [x for x in done.stderr.splitlines() if "a redeploy from" in x]
    assert (
        "warning: a redeploy from infra/main.bicepparam changes POLICY__DRY_RUN (policyDryRun): "
        "deployed 'true', the file 'false'"
    ) in said, said
    assert not [x for x in said if "POLICY__TIMEZONE" in x or "APP_SECRET" in x]
