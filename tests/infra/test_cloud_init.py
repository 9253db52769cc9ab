"""The relay bootstrap: every placeholder filled by main.bicep, no secret inside."""

from __future__ import annotations

import re

from tests.infra.bicep import INFRA, load

CLOUD_INIT = INFRA / "relay" / "cloud-init.yaml"
PLACEHOLDER = re.compile(r"\{\{([A-Z_]+)\}\}")
SAMPLE = {
    "SERVICEBUS_NAMESPACE": "sb-x.servicebus.windows.net",
    "DOCUMENTS_QUEUE": "documents",
    "IDENTITY_CLIENT_ID": "00000000-0000-0000-0000-000000000000",
    "CALLBACK_PORT": "8492",
    "RELAY_KEY_SECRET_URI": "https://kv-x.vault.azure.net/secrets/relay-key",
    "RELAY_PACKAGE_URL": "https://example.org/scheduled-events-relay-0.1.0.tar.gz",
}


def _replacements() -> dict[str, str]:
    """Placeholder -> the var/param expression main.bicep puts there, following the chain."""
    main = load("main")
    found = {}
    name = "relayCloudInit"
    while True:
        node = main.variables[name]["function"]
        assert node["type"] == "replace", name
        args = list(node["parameters"].values())
        source, old, new = args[0], args[1], args[2]
        key = PLACEHOLDER.fullmatch(old)
        assert key, f"{name} replaces {old!r}, not a {{{{NAME}}}} placeholder"
        assert key.group(1) not in found
        found[key.group(1)] = new
        if source == "cloudInitTemplate":
            return found
        name = source


def render(values: dict[str, str] = SAMPLE) -> str:
    return PLACEHOLDER.sub(lambda m: values[m.group(1)], CLOUD_INIT.read_text())


def test_every_placeholder_is_filled_by_main_bicep() -> None:
    used = set(PLACEHOLDER.findall(CLOUD_INIT.read_text()))
    assert used == set(_replacements()) == set(SAMPLE)


def test_template_is_loaded_from_the_file() -> None:
    main = load("main")
    node = main.variables["cloudInitTemplate"]["function"]
    assert "relay/cloud-init.yaml" in node["parameters"].values()


def test_is_cloud_config_and_installs_with_the_relay_installer() -> None:
    text = render()
    assert text.startswith("#cloud-config\n")
    assert "\t" not in text
    assert 'sh "$work/relay/deploy/install.sh" --no-start' in text
    assert "systemctl start scheduled-events-relay.service" in text
    assert SAMPLE["RELAY_PACKAGE_URL"] in text
    # The key is fetched before the relay starts, and refreshed by a timer.
    assert text.index("until /usr/local/sbin/scheduled-events-relay-key") < text.index(
        "systemctl start scheduled-events-relay.service"
    )
    assert "systemctl enable --now scheduled-events-relay-key.timer" in text


def test_the_relay_installer_it_relies_on_exists() -> None:
    deploy = INFRA.parent / "relay" / "deploy"
    install = (deploy / "install.sh").read_text()
    assert "--no-start" in install
    unit = (deploy / "scheduled-events-relay.service").read_text()
    assert "EnvironmentFile=/etc/scheduled-events-relay/relay.env" in unit
    assert "User=scheduled-events-relay" in unit


def test_no_secret_in_cloud_init() -> None:
    text = CLOUD_INIT.read_text()
    assert not re.search(r"SharedAccessKey|AccountKey=|password|__RELAY_CALLBACK_KEY__", text, re.I)
    # The key comes from Key Vault with the VM identity, lands 0640, and is never printed.
    assert "https://vault.azure.net" in text
    assert "0o640" in text
    assert "print(key" not in text
    assert "scheduled-events-relay" in text


def _write_file(text: str, path: str) -> str:
    block = text.split(f"path: {path}", 1)[1]
    body = block.split("content: |\n", 1)[1]
    lines = []
    for line in body.splitlines():
        if line and not line.startswith("      "):
            break
        lines.append(line[6:])
    return "\n".join(lines)


def test_the_key_script_compiles_once_rendered() -> None:
    script = _write_file(render(), "/usr/local/sbin/scheduled-events-relay-key")
    assert script.startswith("#!/usr/bin/env python3")
    compile(script, "scheduled-events-relay-key", "exec")
    assert f'SECRET_URI = "{SAMPLE["RELAY_KEY_SECRET_URI"]}"' in script
    assert f'CLIENT_ID = "{SAMPLE["IDENTITY_CLIENT_ID"]}"' in script


def test_relay_env_names_real_relay_settings() -> None:
    from relay.settings import RelaySettings

    env = _write_file(render(), "/etc/scheduled-events-relay/relay.env")
    values = dict(line.split("=", 1) for line in env.splitlines() if line.strip())
    fields = {f"RELAY_{name.upper()}" for name in RelaySettings.model_fields}
    assert set(values) <= fields, set(values) - fields
    assert values["RELAY_FORWARD"] == "servicebus://sb-x.servicebus.windows.net/documents"
    assert values["RELAY_IDENTITY_CLIENT_ID"] == SAMPLE["IDENTITY_CLIENT_ID"]
    assert values["RELAY_CALLBACK_LISTEN"] == "0.0.0.0:8492"
    assert "http://${ip}:8492" in render()
