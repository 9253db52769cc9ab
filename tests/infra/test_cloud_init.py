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
    "RELAY_SOURCE_URL": "https://example.org/bridge.tar.gz",
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


def test_is_cloud_config_and_starts_the_relay() -> None:
    text = render()
    assert text.startswith("#cloud-config\n")
    assert "\t" not in text
    assert "systemctl enable --now scheduled-events-relay.service" in text
    assert "servicebus://sb-x.servicebus.windows.net/documents" in text
    assert '"identity_client_id": "00000000-0000-0000-0000-000000000000"' in text
    assert '"callback_listen": "0.0.0.0:8492"' in text
    # The key file path is the relay's --callback-key-file, delivered by systemd credentials.
    assert "--callback-key-file ${CREDENTIALS_DIRECTORY}/relay.key" in text


def test_no_secret_in_cloud_init() -> None:
    text = CLOUD_INIT.read_text()
    assert not re.search(r"SharedAccessKey|AccountKey=|password", text, re.I)
    # The key is fetched at boot with the VM identity, written 0600 and never echoed.
    assert "https://vault.azure.net" in text
    assert "0o600" in text
    assert "print(key" not in text


def _embedded_script(text: str) -> str:
    block = text.split("path: /usr/local/sbin/scheduled-events-relay-setup", 1)[1]
    body = block.split("content: |\n", 1)[1]
    lines = []
    for line in body.splitlines():
        if line and not line.startswith("      "):
            break
        lines.append(line[6:])
    return "\n".join(lines)


def test_the_setup_script_compiles_once_rendered() -> None:
    script = _embedded_script(render())
    assert script.startswith("#!/usr/bin/env python3")
    compile(script, "scheduled-events-relay-setup", "exec")
    assert f'SECRET_URI = "{SAMPLE["RELAY_KEY_SECRET_URI"]}"' in script
    assert "http://{ip}:8492" in script


def test_relay_config_keys_are_relay_settings() -> None:
    from relay.settings import RelaySettings

    text = render()
    block = text.split("path: /etc/scheduled-events-relay/relay.json", 1)[1]
    body = block.split("content: |\n", 1)[1].split("\n  - path:", 1)[0]
    import json

    config = json.loads("\n".join(line[6:] for line in body.splitlines()))
    assert set(config) <= set(RelaySettings.model_fields)
    assert config["forward"].startswith("servicebus://")
