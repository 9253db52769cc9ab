"""What the rollout runs on a VM, run for real into a temporary root (tests/infra/
test_enrolment.py's pattern: /etc, /opt and /var overlaid in a private mount namespace,
`systemctl` a recorder): the upgrade keeps how the VM was installed (hooks, readiness port,
HOOK_AS) and changes only the relay, including on a VM whose relay came from customData
(cloud-init); removal leaves no unit, socket, file, state or user behind.

How Run Command runs it (managed Run Command, Learn "Run scripts in your Linux VM by using
managed Run Commands", MicrosoftDocs/azure-docs articles/virtual-machines/linux/
run-command-managed.md @ a77b8478: named parameters are environment variables) and the
script as a file run by bash ($0 is the file; Azure/run-command-extension-linux, as
test_enrolment.py cites it)."""

from __future__ import annotations

import os
import shlex
import subprocess
import zipfile
from pathlib import Path

import pytest

from functions.rollout import cli
from tests.infra.test_enrolment import OVERLAY, SYSTEMCTL, _bundle, _can_overlay
from tests.needs import missing


@pytest.fixture(autouse=True)
def _needs_overlay() -> None:
    if not _can_overlay():
        missing("needs root and `unshare -m` (a private mount namespace)")


TABLE = "https://stsebridgeabc.table.core.windows.net/sebridgeliveness"
# cloud-init's ten arguments (infra/relay/cloud-init.yaml's runcmd), hooks and HOOK_AS set.
CLOUD_INIT_ARGS = [
    "sb-x.servicebus.windows.net",
    "documents",
    "00000000-0000-0000-0000-000000000000",
    "8492",
    "none",
    "embedded",
    TABLE,
    "drain=/bin/true",
    "8493",
    "root+CAP_KILL",
]


def _run(
    script: str, root: Path, env: dict[str, str] | None = None, args=()
) -> subprocess.CompletedProcess:
    run_dir = root / "download"
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / "script.sh"
    path.unlink(missing_ok=True)
    path.write_text(script)
    path.chmod(0o500)
    shims = root / "shims"
    shims.mkdir(exist_ok=True)
    (shims / "systemctl").write_text(SYSTEMCTL)
    (shims / "systemctl").chmod(0o755)
    command = " ".join(shlex.quote(x) for x in ["/bin/bash", "-c", shlex.join([str(path), *args])])
    return subprocess.run(
        ["unshare", "-m", "--propagation", "private", "sh", "-c", OVERLAY, "sh", command],
        cwd=run_dir,
        env={
            "PATH": f"{shims}:{os.environ['PATH']}",
            "FAKE_ROOT": str(root),
            "SYSTEMCTL_RECORD": str(root / "systemctl.log"),
            **(env or {}),
        },
        capture_output=True,
        text=True,
        timeout=120,
    )


def _installed(root: Path) -> dict[str, str]:
    etc = root / "etc.up"
    return {
        "relay.env": (etc / "scheduled-events-relay" / "relay.env").read_text(),
        "rights": (
            etc / "systemd" / "system" / "scheduled-events-relay-hook@.service.d" / "rights.conf"
        ).read_text(),
        "pyz": (
            root / "opt.up" / "scheduled-events-relay" / "scheduled-events-relay.pyz"
        ).read_bytes(),
    }


@pytest.fixture
def bundles(tmp_path) -> tuple[str, str]:
    """The bundled form (make relay) of this relay, and of a 'newer' one (the same zipapp
    with one more file, so its bytes differ)."""
    work = tmp_path / "repo"
    work.mkdir()
    old = _bundle(work).read_text()
    head, b64 = old.split("__RELAY_PYZ_BASE64__\n", 1)
    import base64

    pyz = tmp_path / "newer.pyz"
    pyz.write_bytes(base64.b64decode(b64))
    with zipfile.ZipFile(pyz, "a") as archive:
        archive.writestr("NEWER", "0.2.0")
    new = head + "__RELAY_PYZ_BASE64__\n" + base64.encodebytes(pyz.read_bytes()).decode()
    return old, new


def test_a_customdata_relay_is_upgraded_in_place_keeping_how_it_was_installed(
    tmp_path, bundles
) -> None:
    old, new = bundles
    root = tmp_path / "root"
    first = _run(old, root, args=CLOUD_INIT_ARGS)  # as cloud-init ran it at first boot
    assert first.returncode == 0, first.stderr
    before = _installed(root)
    assert 'RELAY_HOOKS=\'{"drain":"/bin/true"}\'' in before["relay.env"]
    prologue = cli.PROLOGUE.read_text()
    upgrade = _run(prologue + new, root, env={"RELAY_PACKAGE": "embedded", "ROLLOUT_ID": "r1"})
    assert upgrade.returncode == 0, upgrade.stderr
    assert (
        "rollout: add-relay.sh " + " ".join([*CLOUD_INIT_ARGS[:9], "root+CAP_KILL"])
        in upgrade.stdout
    )
    after = _installed(root)
    assert after["relay.env"] == before["relay.env"]
    assert after["rights"] == before["rights"]
    assert after["pyz"] != before["pyz"]
    with zipfile.ZipFile(
        root / "opt.up" / "scheduled-events-relay" / "scheduled-events-relay.pyz"
    ) as z:
        assert z.read("NEWER") == b"0.2.0"
    assert "restart scheduled-events-relay.service" in (root / "systemctl.log").read_text()


def test_a_vm_without_a_relay_gets_one_from_the_install_arguments(tmp_path, bundles) -> None:
    old, _ = bundles
    root = tmp_path / "root"
    alone = _run(cli.PROLOGUE.read_text() + old, root, env={"RELAY_PACKAGE": "embedded"})
    assert alone.returncode == 3
    assert "no relay on this VM" in alone.stderr
    env = {"RELAY_PACKAGE": "embedded", "RELAY_INSTALL_ARGS": " ".join(CLOUD_INIT_ARGS[:7])}
    installed = _run(cli.PROLOGUE.read_text() + old, root, env=env)
    assert installed.returncode == 0, installed.stderr
    assert f"RELAY_HEARTBEAT_TABLE={TABLE}" in _installed(root)["relay.env"]


def test_removal_leaves_no_unit_socket_file_state_or_user(tmp_path, bundles) -> None:
    old, _ = bundles
    root = tmp_path / "root"
    assert _run(old, root, args=CLOUD_INIT_ARGS).returncode == 0
    state = root / "var.up" / "lib" / "scheduled-events-relay"
    state.mkdir(parents=True, exist_ok=True)
    (state / "callback-key.json").write_text("{}")  # what a running relay keeps
    (root / "systemctl.log").unlink()
    gone = _run(cli.REMOVE.read_text(), root)
    assert gone.returncode == 0, gone.stderr
    assert "remove-relay.sh: removed" in gone.stdout
    log = (root / "systemctl.log").read_text().splitlines()
    assert "disable --now scheduled-events-relay.service" in log
    assert "disable --now scheduled-events-relay-hook.socket" in log
    assert log[-1] == "daemon-reload"
    units = root / "etc.up" / "systemd" / "system"
    assert not [p.name for p in units.iterdir() if p.name.startswith("scheduled-events-relay")]
    assert not (root / "etc.up" / "scheduled-events-relay").exists()
    assert not (root / "opt.up" / "scheduled-events-relay").exists()
    assert not state.exists()
    passwd = root / "etc.up" / "passwd"
    assert "scheduled-events-relay:" not in (passwd.read_text() if passwd.exists() else "")
    again = _run(cli.REMOVE.read_text(), root)  # idempotent
    assert again.returncode == 0 and "removed nothing" in again.stdout
