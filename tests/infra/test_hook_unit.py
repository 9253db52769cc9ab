"""Hooks with the rights they need (issue 38, item 2).

Drain hooks ran as `nobody` inside the relay's sandbox (ProtectSystem=strict, no
capabilities), so a realistic drain (`systemctl`, `nginx -s quit`, the docker socket) failed
until the operator wrote a drop-in, and the demo, running hooks as root, never showed it.
add-relay.sh now installs a hook unit of their own (scheduled-events-relay-hook.socket and
@.service, relay/hooks.py's `run_hook`) and writes who hooks run as, from its 10th argument
HOOK_AS, into one drop-in. The relay runs no script itself any more, so it switches no user
and holds no capability at all.

Checked on what add-relay.sh really writes, installed into a temporary root as
tests/infra/test_enrolment.py does: the unit text (each file as the repository has it,
`systemd-analyze verify` on all of them with their drop-ins), then real hook runs: systemd's
own `systemd-socket-activate` listens where the socket unit says and starts the runner as the
drop-in says (User=, SupplementaryGroups=, capabilities, through `setpriv`), and the relay's
HookRunner runs a hook that reports who it is, and, killed in the middle of a run, learns
how it ended once started again (issue 40).
"""

from __future__ import annotations

import contextlib
import grp
import os
import pwd
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from relay.hooks import HookRunner, _held
from relay.models import ScheduledEvent
from relay.settings import RelaySettings
from tests.infra.test_enrolment import OUTPUTS, _bundle, _can_overlay, _install
from tests.needs import missing
from tests.relay.conftest import build_pyz

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "relay" / "deploy"
SYSTEMD = "etc.up/systemd/system"
SOCKET_PATH = "/run/scheduled-events-relay-hooks.sock"
CAP_KILL = 5


@pytest.fixture(autouse=True)
def _needs_overlay() -> None:
    if not _can_overlay():
        missing("needs root and unshare (a private mount namespace)")


def _installed(tmp_path: Path, hook_as: str | None) -> Path:
    """add-relay.sh (the bundle) installed into a temporary root; that root."""
    work = tmp_path / "repo"
    work.mkdir()
    script = _bundle(work).read_text()
    args = OUTPUTS["relayBootstrapArguments"].split()
    extra = ["none", "", hook_as] if hook_as is not None else []
    root = tmp_path / "root"
    proc, _ = _install(script, [*args, *extra], root)
    assert proc.returncode == 0, proc.stderr
    return root


def _rights(root: Path) -> dict[str, str]:
    text = (root / SYSTEMD / "scheduled-events-relay-hook@.service.d" / "rights.conf").read_text()
    return dict(re.findall(r"^(\w+)=(.*)$", text, re.M))


@pytest.mark.parametrize(
    ("hook_as", "rights"),
    [
        (None, {}),  # the template's DynamicUser=yes: a user per run, no capabilities
        ("root", {"DynamicUser": "no", "User": "root", "SupplementaryGroups": ""}),
        (
            "nobody:adm",
            {
                "DynamicUser": "no",
                "User": "nobody",
                "SupplementaryGroups": "adm",
                "CapabilityBoundingSet": "",
            },
        ),
        (
            "root:adm,daemon+CAP_KILL,CAP_NET_ADMIN",
            {
                "DynamicUser": "no",
                "User": "root",
                "SupplementaryGroups": "adm daemon",
                "AmbientCapabilities": "CAP_KILL CAP_NET_ADMIN",
                "CapabilityBoundingSet": "CAP_KILL CAP_NET_ADMIN",
            },
        ),
    ],
)
def test_hook_as_is_stated_in_one_drop_in(
    tmp_path: Path, hook_as: str | None, rights: dict
) -> None:
    root = _installed(tmp_path, hook_as)
    assert _rights(root) == rights
    systemd = root / SYSTEMD
    # The units as the repository has them (the runner's Python put in, as for the relay).
    assert (systemd / "scheduled-events-relay-hook.socket").read_text() == (
        DEPLOY / "scheduled-events-relay-hook.socket"
    ).read_text()
    unit = (systemd / "scheduled-events-relay-hook@.service").read_text()
    template = (DEPLOY / "scheduled-events-relay-hook@.service").read_text()
    assert re.sub(r"^ExecStart=\S+ ", "ExecStart=/usr/bin/python3 ", unit, flags=re.M) == template
    # The relay keeps its sandbox, with no capability at all, and asks the hook unit where
    # it listens (the relay's default --hook-socket: nothing in relay.env).
    relay_unit = (systemd / "scheduled-events-relay.service").read_text().splitlines()
    for line in ("ProtectSystem=strict", "NoNewPrivileges=yes", "CapabilityBoundingSet="):
        assert line in relay_unit
    assert not any(line.startswith("AmbientCapabilities") for line in relay_unit)
    assert not (systemd / "scheduled-events-relay.service.d").exists()
    env = (root / "etc.up" / "scheduled-events-relay" / "relay.env").read_text()
    assert "RELAY_HOOK_SOCKET" not in env
    assert RelaySettings(forward="file:/x").hook_socket == SOCKET_PATH
    socket_unit = (systemd / "scheduled-events-relay-hook.socket").read_text()
    assert f"ListenStream={SOCKET_PATH}\n" in socket_unit
    _verify(systemd)


def _verify(systemd: Path) -> None:
    """`systemd-analyze verify` on the installed units and their drop-ins (systemd's own
    parser: an unknown directive, a bad value or a missing binary is an error)."""
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        missing("systemd-analyze is not installed (Debian: the systemd package)")
    units = Path(tempfile.mkdtemp(prefix="units-"))
    for item in systemd.iterdir():
        target = units / item.name
        if item.is_dir():
            shutil.copytree(item, target)
        else:
            text = item.read_text()
            # ExecStart's Python must exist here; the pyz path is the VM's (not checked).
            text = re.sub(r"^ExecStart=\S+", f"ExecStart={sys.executable}", text, flags=re.M)
            target.write_text(text)
    names = [
        "scheduled-events-relay.service",
        "scheduled-events-relay-hook.socket",
        # Issue 44 and 46: the ports systemd holds, and the readiness responder.
        "scheduled-events-relay-callback.socket",
        "scheduled-events-relay-ready.socket",
        "scheduled-events-relay-ready.service",
    ]
    proc = subprocess.run(
        [analyze, "verify", *names],
        env={**os.environ, "SYSTEMD_UNIT_PATH": f"{units}:"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    problems = [
        line
        for line in proc.stderr.splitlines()
        if "scheduled-events" in line and "not safe" not in line
    ]
    assert proc.returncode == 0 and not problems, proc.stderr
    shutil.rmtree(units)


@contextlib.contextmanager
def _activated(tmp_path: Path, hook_as: str, script: str) -> Iterator[tuple[Path, Path, dict]]:
    """The hook unit as add-relay.sh installs it for `hook_as`, short of systemd as PID 1:
    systemd-socket-activate listening, one runner per connection started with exactly the
    drop-in's user, groups and capabilities. Yields (socket, the `drain` script, rights)."""
    if shutil.which("systemd-socket-activate") is None or shutil.which("setpriv") is None:
        missing("needs systemd-socket-activate and setpriv (Debian: systemd, util-linux)")
    root = _installed(tmp_path, hook_as)
    rights = _rights(root)
    # World-readable: the runner and the hook run as the drop-in's user.
    shared = Path(tempfile.mkdtemp(prefix="hook-unit-"))
    shared.chmod(0o755)
    pyz = build_pyz(shared / "scheduled-events-relay.pyz")
    pyz.chmod(0o644)
    hook = shared / "drain.sh"
    hook.write_text(script)
    hook.chmod(hook.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    sock = shared / "hooks.sock"
    user = pwd.getpwnam(rights["User"])
    groups = ",".join(str(grp.getgrnam(g).gr_gid) for g in rights["SupplementaryGroups"].split())
    caps = ",".join(
        "+" + c.lower().removeprefix("cap_") for c in rights.get("AmbientCapabilities", "").split()
    )
    setpriv = [
        "setpriv",
        f"--reuid={user.pw_uid}",
        f"--regid={user.pw_gid}",
        f"--groups={groups}" if groups else "--clear-groups",
        *([f"--inh-caps={caps}", f"--ambient-caps={caps}"] if caps else []),
        f"--bounding-set={','.join(['-all', *filter(None, caps.split(','))])}",
    ]
    activate = subprocess.Popen(
        [
            "systemd-socket-activate",
            "--accept",
            "--inetd",
            f"--listen={sock}",
            f'--setenv=RELAY_HOOKS={{"drain": "{hook}"}}',
            "--setenv=RELAY_HOOK_TIMEOUT=30",
            "--setenv=PATH=/usr/bin:/bin",
            *setpriv,
            sys.executable,
            "-I",
            str(pyz),
            "run-hook",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 10
        while not sock.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert sock.exists(), "systemd-socket-activate did not listen"
        yield sock, hook, rights
    finally:
        activate.terminate()
        activate.wait(timeout=10)
        shutil.rmtree(shared, ignore_errors=True)


def test_a_hook_runs_as_the_configured_user_with_its_groups_and_capabilities(
    tmp_path: Path,
) -> None:
    """The real thing, short of systemd as PID 1: the relay's own HookRunner sends the run
    to the socket; the runner, as the drop-in's user, writes the script's output and end
    into the relay's own files (root's, in a directory only root may enter) through the
    descriptors the relay passed it."""
    script = (
        "#!/bin/sh\n"
        'echo "user=$(id -un) groups=$(id -Gn)"\n'
        "grep -E '^Cap(Eff|Amb):' /proc/self/status\n"
        'echo "event=$SCHEDULED_EVENT_ID vm=$SCHEDULED_EVENT_VM_NAME"\n'
    )
    with _activated(tmp_path, "nobody:adm+CAP_KILL", script) as (sock, hook, rights):
        state = tmp_path / "state"
        state.mkdir(mode=0o700)
        runner = HookRunner({"drain": hook}, state, 30, "vm0", socket=str(sock))
        event = ScheduledEvent("EV-HOOK-1", "Scheduled", "Terminate", ("vm0",), {"NotBefore": ""})
        record = runner.run_once("drain", event, wait=20)
        assert record["status"] == "succeeded", record
        tail = record["output_tail"]
        assert f"user={rights['User']} " in tail
        assert "adm" in tail.split("groups=", 1)[1].splitlines()[0]
        amb = int(re.search(r"CapAmb:\s*([0-9a-f]+)", tail).group(1), 16)
        eff = int(re.search(r"CapEff:\s*([0-9a-f]+)", tail).group(1), 16)
        assert amb == eff == 1 << CAP_KILL  # exactly the capability HOOK_AS named
        assert "event=EV-HOOK-1 vm=vm0" in tail
        # A hook the runner's own RELAY_HOOKS does not name is refused there, whatever the
        # relay asks for: the relay only ever names hooks.
        other = HookRunner({"other": hook}, tmp_path / "state2", 30, "vm0", socket=str(sock))
        refused = other.run_once("other", event, wait=20)
        assert refused["status"] == "failed"
        assert "not a hook this VM's relay configuration names" in refused["output_tail"]


RELAY = """
import sys
from pathlib import Path
from relay.hooks import HookRunner, _held
from relay.models import ScheduledEvent
state, sock = Path(sys.argv[1]), sys.argv[2]
runner = HookRunner({"drain": Path("/bin/true")}, state, 30, "vm0", socket=sock)
event = ScheduledEvent("EV-HOOK-2", "Scheduled", "Terminate", ("vm0",), {"NotBefore": ""})
print(runner.run_once("drain", event, wait=60)["status"], flush=True)
"""


def test_a_relay_killed_in_a_hook_run_learns_how_it_ended_through_the_real_unit(
    tmp_path: Path,
) -> None:
    """Issue 40 with the hook unit: the relay (a process of its own here) is killed with
    SIGKILL while the unit runs its drain; the unit, holding the run's lock through the
    descriptor the relay passed it, runs the script to its end; the relay started again
    finds the lock held, waits, and records the real end, not "failed"."""
    script = '#!/bin/sh\nsleep 2\necho "drained $SCHEDULED_EVENT_ID as $(id -un)"\n'
    with _activated(tmp_path, "nobody", script) as (sock, hook, _):
        state = tmp_path / "state"
        relay = subprocess.Popen(
            [sys.executable, "-c", RELAY, str(state), str(sock)],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            text=True,
        )
        rc_files = lambda: list((state / "hooks").glob("*.rc"))  # noqa: E731

        def unit_has_the_run() -> bool:
            """The unit runs the script: a process runs `hook` and the `.rc` file's lock is
            held. The file and its lock alone are the relay's (it creates and locks the
            file before handing the run over), so killing the relay then proves nothing."""
            if not any(str(hook) in cmdline for cmdline in _cmdlines()):
                return False
            for rc in rc_files():
                held = _held(rc)
                if held is not None:
                    held.close()
                    return True
            return False

        deadline = time.monotonic() + 60
        while not unit_has_the_run() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert unit_has_the_run(), "the hook unit never took the run"
        relay.kill()
        relay.wait(10)
        assert relay.stdout is not None and relay.stdout.read() == ""  # died before the end
        restarted = HookRunner({"drain": hook}, state, 30, "vm0", socket=str(sock))
        first = restarted.result("drain", "EV-HOOK-2")
        assert first is not None and first["status"] == "running"  # taken over
        deadline = time.monotonic() + 20
        while (record := restarted.result("drain", "EV-HOOK-2"))["status"] == "running":
            assert time.monotonic() < deadline, record
            time.sleep(0.1)
        assert (record["status"], record["exit_code"]) == ("succeeded", 0), record
        assert record["output_tail"] == "drained EV-HOOK-2 as nobody\n"
        assert not rc_files()


def test_add_relay_refuses_a_hook_user_that_could_read_the_relay_s_key() -> None:
    """The relay's key (0600 in its 0700 state directory) is safe from its hooks only if
    they never run as the relay's user: add-relay.sh refuses HOOK_AS naming it, before
    installing anything, as it refuses a bad capability."""
    args = OUTPUTS["relayBootstrapArguments"].split()
    for hook_as, reason in (
        ("scheduled-events-relay", "not the relay's own user"),
        ("root+KILL", "bad capability KILL"),
        ("no-such-user-here", "no user no-such-user-here"),
    ):
        proc = subprocess.run(
            ["sh", str(ROOT / "infra" / "relay" / "add-relay.sh"), *args, "none", "", hook_as],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert proc.returncode == 2 and proc.stdout == "", proc.stderr
        assert proc.stderr.startswith(f"add-relay.sh: HOOK_AS {hook_as}: {reason}"), proc.stderr


def test_the_template_passes_hook_as_to_cloud_init() -> None:
    """The Bicep can give the hooks their rights too: relayHookAs is cloud-init's 10th
    argument ('' : add-relay.sh's default, a user of its own per run, no capabilities)."""
    from tests.infra.bicep import load
    from tests.infra.relay_bootstrap import replacements

    assert replacements()["HOOK_AS"] == "relayHookAs"
    assert load("main").param_default("relayHookAs") == ""


def _cmdlines() -> list[str]:
    """Every process's command line (Linux /proc), arguments joined by spaces."""
    lines = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                lines.append((proc / "cmdline").read_bytes().replace(b"\0", b" ").decode())
            except OSError:
                continue
    return lines
