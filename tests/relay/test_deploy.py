"""What ships to VMs: pinned requirements, the systemd unit, cloud-init, the package tarball."""

from __future__ import annotations

import configparser
import subprocess
import sys
import tarfile
from importlib.metadata import version
from pathlib import Path

from tests.relay.conftest import ROOT

DEPLOY = ROOT / "relay" / "deploy"


def pins(path: Path) -> dict[str, str]:
    found = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if "==" in line:
            name, pinned = line.split("==")
            found[name.strip().lower().replace("_", "-")] = pinned.strip()
    return found


def test_relay_requirements_are_pinned_and_agree_with_the_project() -> None:
    relay, project = pins(ROOT / "relay" / "requirements.txt"), pins(ROOT / "requirements.txt")
    assert {"requests", "pydantic", "pydantic-settings", "pydantic-core"} <= relay.keys()
    for name, pinned in relay.items():
        if name in project:
            assert project[name] == pinned, name
        assert version(name) == pinned, f"{name}: the tested version differs from the pin"
    assert not [n for n in relay if n.startswith("azure")]


def test_the_unit_is_hardened_and_restarts() -> None:
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.optionxform = str  # type: ignore[assignment, method-assign]
    unit.read(DEPLOY / "scheduled-events-relay.service")
    service = unit["Service"]
    assert service["ExecStart"].endswith("/venv/bin/python -m relay")
    assert service["Restart"] == "always"
    assert service["StateDirectory"] == "scheduled-events-relay"
    assert service["User"] == "scheduled-events-relay"
    for setting, value in {
        "NoNewPrivileges": "yes",
        "ProtectSystem": "strict",
        "ProtectHome": "yes",
        "PrivateTmp": "yes",
        "CapabilityBoundingSet": "",
        "RestrictSUIDSGID": "yes",
    }.items():
        assert service[setting] == value, setting
    assert unit["Install"]["WantedBy"] == "multi-user.target"


def test_cloud_init_installs_python_venv_and_runs_the_installer() -> None:
    text = (DEPLOY / "cloud-init.yaml").read_text()
    assert text.startswith("#cloud-config\n")
    assert "  - python3-venv\n" in text
    assert 'sh "$work/relay/deploy/install.sh"' in text
    for placeholder in (
        "__RELAY_PACKAGE_URL__",
        "__RELAY_FORWARD__",
        "__RELAY_CALLBACK_PORT__",
        "__RELAY_CALLBACK_KEY__",
        "__RELAY_IDENTITY_CLIENT_ID__",
    ):
        assert placeholder in text
    assert "\t" not in text


def test_shell_scripts_parse() -> None:
    for script in ("install.sh", "package.sh"):
        subprocess.run(["sh", "-n", str(DEPLOY / script)], check=True)


def test_the_package_runs_on_its_own_without_azure_sdks(tmp_path: Path) -> None:
    tarball = tmp_path / "relay.tar.gz"
    subprocess.run([str(DEPLOY / "package.sh"), str(tarball)], check=True, capture_output=True)
    with tarfile.open(tarball) as archive:
        names = archive.getnames()
        archive.extractall(tmp_path / "vm", filter="data")
    assert "./relay/deploy/install.sh" in names and "./relay/requirements.txt" in names
    assert not [n for n in names if "simulator" in n or "__pycache__" in n]
    check = (
        "import sys, relay.__main__, relay.callback, relay.hooks;"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('azure', 'functions', 'tests')];"
        "sys.exit(f'unexpected imports: {bad}' if bad else 0)"
    )
    subprocess.run(
        [sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, '.'); {check}"],
        cwd=tmp_path / "vm",
        check=True,
        timeout=30,
    )
    help_text = subprocess.run(
        [sys.executable, "-m", "relay", "--help"],
        cwd=tmp_path / "vm",
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    ).stdout
    assert "--forward" in help_text and "--servicebus-endpoint" not in help_text
