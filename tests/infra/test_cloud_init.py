"""The relay bootstrap: cloud-init runs infra/relay/add-relay.sh with six arguments, all
filled by main.bicep; no secret travels in customData; the script refuses bad input."""

from __future__ import annotations

import base64
import re
import subprocess

import pytest

from tests.infra.bicep import INFRA, load
from tests.infra.checkov_gate import SAMPLE as ARGS

CLOUD_INIT = INFRA / "relay" / "cloud-init.yaml"
ADD_RELAY = INFRA / "relay" / "add-relay.sh"
PLACEHOLDER = re.compile(r"\{\{([A-Z0-9_]+)\}\}")
# The order add-relay.sh takes its arguments in.
ARG_ORDER = list(ARGS)


def _replacements() -> dict[str, object]:
    """Placeholder -> what main.bicep puts there, following the chain of replace() vars."""
    main = load("main")
    found: dict[str, object] = {}
    name = "relayCloudInit"
    while name != "cloudInitTemplate":
        node = main.variables[name]["function"]
        assert node["type"] == "replace", name
        source, old, new = list(node["parameters"].values())[:3]
        key = PLACEHOLDER.fullmatch(old)
        assert key, f"{name} replaces {old!r}, not a placeholder"
        assert key.group(1) not in found
        found[key.group(1)] = new
        name = source
    return found


def render() -> str:
    values = dict(ARGS, ADD_RELAY_SCRIPT_B64=base64.b64encode(ADD_RELAY.read_bytes()).decode())
    return PLACEHOLDER.sub(lambda m: values[m.group(1)], CLOUD_INIT.read_text())


def test_every_placeholder_is_filled_by_main_bicep() -> None:
    used = set(PLACEHOLDER.findall(CLOUD_INIT.read_text()))
    assert used == set(_replacements()) == {*ARGS, "ADD_RELAY_SCRIPT_B64"}


def test_the_script_and_template_are_loaded_from_their_files() -> None:
    main = load("main")
    assert main.variables["cloudInitTemplate"]["function"]["parameters"]["file_path"] == (
        "relay/cloud-init.yaml"
    )
    b64 = main.variables["addRelayScriptB64"]["function"]
    assert b64["type"] == "base64"
    inner = b64["parameters"]["input_string"]["function"]
    assert inner["parameters"]["file_path"] == "relay/add-relay.sh"
    assert _replacements()["ADD_RELAY_SCRIPT_B64"] == "addRelayScriptB64"


def test_cloud_init_runs_the_script_with_its_arguments_in_order() -> None:
    text = render()
    assert text.startswith("#cloud-config\n")
    assert "\t" not in text
    runcmd = text.split("runcmd:\n", 1)[1].splitlines()
    assert runcmd[0] == "  - - /usr/local/sbin/add-scheduled-events-relay"
    assert [line.strip().removeprefix("- ").strip('"') for line in runcmd[1:]] == [
        ARGS[k] for k in ARG_ORDER
    ]
    usage = re.search(
        r"^NAMESPACE=\$1 QUEUE=\$2 CLIENT_ID=\$3 PORT=\$4 SECRET_URI=\$5 "
        r"PACKAGE_URL=\$6$",
        ADD_RELAY.read_text(),
        re.M,
    )
    assert usage, "add-relay.sh's argument order changed: update cloud-init.yaml and this test"


def test_bootstrap_arguments_output_matches_the_script_order() -> None:
    value = load("main").outputs["relayBootstrapArguments"]["value"]
    assert value.split() == [
        "${serviceBus.outputs.fullyQualifiedNamespace}",
        "${serviceBus.outputs.queueName}",
        "${relayIdentity.properties.clientId}",
        "${relayCallbackPort}",
        "${keyVault.outputs.relayKeySecretUri}",
        "${relayPackageUrl}",
    ]


def test_no_secret_travels_in_cloud_init_or_the_script() -> None:
    for text in (CLOUD_INIT.read_text(), ADD_RELAY.read_text()):
        assert not re.search(r"SharedAccessKey|AccountKey=|password|CALLBACK_KEY__", text, re.I)
    script = ADD_RELAY.read_text()
    assert "https://vault.azure.net" in script
    assert "0o640" in script
    assert "print(key" not in script


def test_the_script_is_valid_sh() -> None:
    subprocess.run(["sh", "-n", str(ADD_RELAY)], check=True)


@pytest.mark.parametrize(
    ("field", "bad"),
    [
        ("SERVICEBUS_NAMESPACE", "sb-x.example.org"),
        ("DOCUMENTS_QUEUE", "a/b"),
        ("IDENTITY_CLIENT_ID", "not-a-guid!"),
        ("CALLBACK_PORT", "84x2"),
        ("RELAY_KEY_SECRET_URI", "https://evil.example.org/secrets/relay-key"),
        ("RELAY_PACKAGE_URL", ""),
        ("RELAY_PACKAGE_URL", "http://example.org/relay.tar.gz"),
    ],
)
def test_the_script_refuses_bad_arguments_before_doing_anything(field, bad) -> None:
    args = [bad if k == field else ARGS[k] for k in ARG_ORDER]
    proc = subprocess.run(["sh", str(ADD_RELAY), *args], capture_output=True, text=True)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("add-relay.sh:")


def test_the_script_wants_exactly_six_arguments() -> None:
    proc = subprocess.run(["sh", str(ADD_RELAY), "a"], capture_output=True, text=True)
    assert proc.returncode == 2
    assert "usage:" in proc.stderr


def _heredoc(tag: str) -> str:
    text = ADD_RELAY.read_text()
    m = re.search(rf"<<{tag}\n(.*?)\n{tag}\n", text, re.S)
    assert m, tag
    return m.group(1)


def _expand(text: str) -> str:
    """What the shell writes for an unquoted heredoc, with the sample arguments."""
    values = {
        "ETC": "/etc/scheduled-events-relay",
        "IMDS": "http://169.254.169.254/metadata",
        "NAMESPACE": ARGS["SERVICEBUS_NAMESPACE"],
        "QUEUE": ARGS["DOCUMENTS_QUEUE"],
        "CLIENT_ID": ARGS["IDENTITY_CLIENT_ID"],
        "PORT": ARGS["CALLBACK_PORT"],
        "SECRET_URI": ARGS["RELAY_KEY_SECRET_URI"],
        "ip": "10.40.0.4",
    }
    text = re.sub(r"\$(\w+)", lambda m: values[m.group(1)], text)
    return text.replace("\\\\", "\\")


def test_the_key_script_compiles_as_written() -> None:
    script = _expand(_heredoc("PY"))
    assert script.startswith("#!/usr/bin/env python3")
    compile(script, "scheduled-events-relay-key", "exec")
    assert f'SECRET_URI = "{ARGS["RELAY_KEY_SECRET_URI"]}"' in script
    assert 'if not key or "\\n" in key:' in script


def test_relay_env_names_real_relay_settings() -> None:
    from relay.settings import SETTING_NAMES

    env = _expand(_heredoc("ENV"))
    values = dict(line.split("=", 1) for line in env.splitlines() if line.strip())
    fields = {f"RELAY_{name.upper()}" for name in SETTING_NAMES}
    assert set(values) <= fields, set(values) - fields
    assert values["RELAY_FORWARD"] == "servicebus://sb-x.servicebus.windows.net/documents"
    assert values["RELAY_IDENTITY_CLIENT_ID"] == ARGS["IDENTITY_CLIENT_ID"]
    assert values["RELAY_CALLBACK_LISTEN"] == "0.0.0.0:8492"
    assert values["RELAY_CALLBACK_URL"] == "http://10.40.0.4:8492"
    assert values["RELAY_CALLBACK_KEY_FILE"] == "/etc/scheduled-events-relay/callback.key"


def test_the_relay_installer_it_relies_on_exists() -> None:
    deploy = INFRA.parent / "relay" / "deploy"
    assert "--no-start" in (deploy / "install.sh").read_text()
    unit = (deploy / "scheduled-events-relay.service").read_text()
    assert "EnvironmentFile=/etc/scheduled-events-relay/relay.env" in unit
    assert "User=scheduled-events-relay" in unit
    assert 'sh "$work/relay/deploy/install.sh" --no-start' in ADD_RELAY.read_text()
