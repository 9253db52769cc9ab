"""The demo's upgrade lane's parts (local/demo_upgrade.py; the lane itself runs in `make
demo` and tests/e2e/test_demo.py): the builds it rolls out are real pyz of relay/, one
reporting the new version and one that cannot start, and its stand-in for managed Run
Command does what add-relay.sh does: refuse a relay that does not run, keeping the old
one, and otherwise restart the VM's relay on the new build."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from types import SimpleNamespace

from local.demo_upgrade import BAD, GOOD, LocalRunCommands, build_relays


def test_the_lanes_builds_report_the_new_version_or_cannot_start(tmp_path) -> None:
    good, bad = build_relays(tmp_path, "9.9.9+demo-upgrade")
    assert (
        subprocess.run([sys.executable, "-I", str(good), "--help"], capture_output=True).returncode
        == 0
    )
    assert (
        subprocess.run([sys.executable, "-I", str(bad), "--help"], capture_output=True).returncode
        != 0
    )
    source = zipfile.ZipFile(good).read("relay/__init__.py").decode()
    assert '__version__="9.9.9+demo-upgrade"' in source


def test_a_build_that_does_not_run_is_refused_and_the_old_relay_kept(tmp_path) -> None:
    good, bad = build_relays(tmp_path, "9.9.9")
    restarted: list[tuple[str, object]] = []
    lane = SimpleNamespace(
        packages={GOOD: good, BAD: bad},
        names={"/vm/a": "vm-a"},
        until_quiet=lambda vm: None,
        restart=lambda vm, pyz: restarted.append((vm, pyz)),
    )
    commands = LocalRunCommands(lane)  # type: ignore[arg-type]
    body = {"properties": {"parameters": [{"name": "RELAY_PACKAGE", "value": BAD}]}}
    commands.put("/vm/a", "scheduled-events-relay", body)
    execution = commands.get("/vm/a", "scheduled-events-relay")
    assert (execution.state, execution.exit_code) == ("Failed", 1)
    assert "does not run" in execution.error and restarted == []
    body["properties"]["parameters"][0]["value"] = GOOD
    commands.put("/vm/a", "scheduled-events-relay", body)
    assert commands.get("/vm/a", "scheduled-events-relay").succeeded
    assert restarted == [("vm-a", good)]
