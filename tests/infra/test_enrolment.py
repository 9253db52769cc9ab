"""Adding the relay to existing machines, as infra/README.md tells an operator to: its
commands run exactly as written, with `az` replaced by a recorder on PATH (argv, and the
file an `@path` argument names, as the Azure CLI reads it), and what they send is installed
the way Azure would run it, into a temporary root, where the installed relay then works.

How Azure runs what the commands send (Azure/run-command-extension-linux main/cmds.go and
main/exec.go at 0904bc011db761c736d23900726d1f0435303832 / 32da8cd2185bb483315d8b413c96be7774e9b9e2;
Azure/custom-script-extension-linux main/cmds.go at 00e37b6a294a968307b6760f03c0b9107616b84f,
MIT): a script of at most 256 KiB (base64, optionally gzipped) is written to
`<dir>/script.sh` (mode 0500) and run with `/bin/bash -c <command>`, so `$0` is that file.
Run Command passes `--parameters` as the script's positional arguments (the `az vm
run-command invoke` reference: `--scripts 'echo $1 $2' --parameters hello world`).

The temporary root: /etc, /opt and /var are overlaid in a private mount namespace
(`unshare -m`), so the script's writes (the user, the unit, relay.env, the pyz) land in the
test's directories; `systemctl` is a recorder (no systemd here).
"""

from __future__ import annotations

import base64
import gzip
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import requests

from tests.conftest import free_port
from tests.infra.relay_bootstrap import ADD_RELAY, ARG_ORDER, ARGS
from tests.needs import missing
from tests.relay.conftest import build_pyz, json_files, relay_env

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "infra" / "README.md"
MAX_SCRIPT = 256 * 1024  # both extensions' maxScriptSize
OUTPUTS = {
    "relayIdentityId": "/subscriptions/00000000-0000-0000-0000-000000000000/resourceGroups/"
    "rg-sebridge/providers/Microsoft.ManagedIdentity/userAssignedIdentities/id-sebridge-relay",
    # main.bicep's output: the seven arguments, PACKAGE_URL written `embedded`
    "relayBootstrapArguments": " ".join(
        "embedded" if k == "RELAY_PACKAGE_URL" else ARGS[k]
        for k in ARG_ORDER[: ARG_ORDER.index("HEARTBEAT_TABLE_URL") + 1]
    ),
    "functionSubnetId": "/subscriptions/00000000-0000-0000-0000-000000000000/resourceGroups/"
    "rg-sebridge/providers/Microsoft.Network/virtualNetworks/vnet-sebridge/subnets/snet-functions",
}

AZ = f"""#!{sys.executable}
import json, os, sys
argv = sys.argv[1:]
files = {{a: open(a[1:], encoding="utf-8").read() for a in argv if a.startswith("@")}}
with open(os.environ["AZ_RECORD"], "a", encoding="utf-8") as out:
    out.write(json.dumps({{"argv": argv, "files": files}}) + "\\n")
outputs = json.loads(os.environ["AZ_OUTPUTS"])
if argv[:3] == ["deployment", "group", "show"]:
    print(outputs[argv[argv.index("--query") + 1].split(".")[2]])
elif argv[:4] == ["network", "vnet", "subnet", "show"]:
    print("10.40.1.0/24")
elif argv[:3] == ["vmss", "extension", "list"]:
    print(os.environ.get("AZ_CUSTOM_SCRIPT", ""))  # the set's own Custom Script, if any
elif argv[:3] == ["network", "vnet", "show"]:
    print("/subscriptions/00000000-0000-0000-0000-000000000000/resourceGroups/rg-web/"
          "providers/Microsoft.Network/virtualNetworks/vnet-web")
else:
    print("{{}}")
"""
SYSTEMCTL = """#!/bin/sh
echo "$*" >> "$SYSTEMCTL_RECORD"
"""
# /etc, /opt and /var of this machine, with every write going to ROOT/<dir>.up.
OVERLAY = """set -e
for d in etc opt var; do
    mkdir -p "$FAKE_ROOT/$d.up" "$FAKE_ROOT/$d.work"
    up="$FAKE_ROOT/$d.up" work="$FAKE_ROOT/$d.work"
    mount -t overlay overlay -o "lowerdir=/$d,upperdir=$up,workdir=$work" "/$d"
done
exec /bin/bash -c "$1"
"""


def _blocks(marker: str) -> str:
    """The one bash block of infra/README.md holding `marker`, dedented (list items indent)."""
    found = [
        textwrap.dedent(body)
        for body in re.findall(r"^( *)```bash\n(.*?)^\1```", README.read_text(), re.M | re.S)
        for body in [body[1]]
        if marker in body
    ]
    assert len(found) == 1, f"infra/README.md: {len(found)} bash blocks hold {marker!r}"
    return found[0]


def _can_overlay() -> bool:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    probe = subprocess.run(
        ["unshare", "-m", "--propagation", "private", "true"], capture_output=True
    )
    return probe.returncode == 0


def _run_recorded(block: str, work: Path, fails: bool = False, **env: str) -> list[dict]:
    bin_dir = work / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "az").write_text(AZ)
    (bin_dir / "az").chmod(0o755)
    record = work / "az.jsonl"
    proc = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", block],
        cwd=work,
        env={
            "PATH": f"{bin_dir}:{os.environ['PATH']}",
            "AZ_RECORD": str(record),
            "AZ_OUTPUTS": json.dumps(OUTPUTS),
            "HOME": str(work),
            **env,
        },
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (proc.returncode != 0) == fails, proc.stderr
    return [json.loads(line) for line in record.read_text().splitlines()]


def _bundle(work: Path) -> Path:
    """dist/add-relay-bundled.sh as `make relay` writes it (the Makefile's recipe)."""
    recipe = re.search(
        r"^\t(\{ cat infra/relay/add-relay.sh;.*\}) > dist/add-relay-bundled\.sh$",
        (ROOT / "Makefile").read_text(),
        re.M,
    )
    assert recipe, "the Makefile's relay target no longer builds dist/add-relay-bundled.sh"
    pyz = build_pyz(work / "relay.pyz")
    (work / "dist").mkdir()
    command = recipe.group(1).replace("infra/relay/add-relay.sh", shlex.quote(str(ADD_RELAY)))
    command = command.replace("$(RELAY_PYZ)", shlex.quote(str(pyz)))
    with open(work / "dist" / "add-relay-bundled.sh", "wb") as out:
        subprocess.run(["sh", "-c", command], stdout=out, check=True)
    return work / "dist" / "add-relay-bundled.sh"


def _option(argv: list[str], name: str) -> list[str]:
    """The values after `name`, up to the next option."""
    start = argv.index(name) + 1
    end = next((i for i in range(start, len(argv)) if argv[i].startswith("--")), len(argv))
    return argv[start:end]


def _install(script: str, args: list[str], root: Path) -> tuple[subprocess.CompletedProcess, Path]:
    """Run `script` as the extension does (script.sh, bash -c) inside the temporary root."""
    assert len(script.encode()) < MAX_SCRIPT * 3 // 4  # still under 256 KiB once base64
    run_dir = root / "download"
    run_dir.mkdir(parents=True, exist_ok=True)  # a second run into the same root: an upgrade
    path = run_dir / "script.sh"
    path.unlink(missing_ok=True)
    path.write_text(script)
    path.chmod(0o500)
    shims = root / "shims"
    shims.mkdir(exist_ok=True)
    (shims / "systemctl").write_text(SYSTEMCTL)
    (shims / "systemctl").chmod(0o755)
    command = " ".join(shlex.quote(x) for x in [str(path), *args])
    proc = subprocess.run(
        ["unshare", "-m", "--propagation", "private", "sh", "-c", OVERLAY, "sh", command],
        cwd=run_dir,
        env={
            "PATH": f"{shims}:{os.environ['PATH']}",
            "FAKE_ROOT": str(root),
            "SYSTEMCTL_RECORD": str(root / "systemctl.log"),
        },
        capture_output=True,
        text=True,
        timeout=120,
    )
    return proc, root


def _check_installed(root: Path, simulator, tmp: Path) -> None:
    """The unit, relay.env and pyz are where the unit runs them, and that relay forwards."""
    assert (root / "systemctl.log").read_text().splitlines() == [
        "daemon-reload",
        "enable --now scheduled-events-relay-hook.socket",
        "is-active --quiet scheduled-events-relay-callback.socket",
        "enable --now scheduled-events-relay-callback.socket",
        # Issue 44: the probe is the responder's, on a port systemd holds.
        "enable --now scheduled-events-relay-ready.socket",
        "try-restart scheduled-events-relay-ready.service",
        "enable scheduled-events-relay.service",
        "restart scheduled-events-relay.service",
    ]
    units = root / "etc.up" / "systemd" / "system"
    callback = (units / "scheduled-events-relay-callback.socket").read_text()
    assert f"\nListenStream={ARGS['CALLBACK_PORT']}\n" in callback
    assert "\nListenStream=8493\n" in (units / "scheduled-events-relay-ready.socket").read_text()
    unit = (root / "etc.up" / "systemd" / "system" / "scheduled-events-relay.service").read_text()
    exec_start = shlex.split(re.search(r"^ExecStart=(.*)$", unit, re.M).group(1))
    assert exec_start[1:] == ["-I", "/opt/scheduled-events-relay/scheduled-events-relay.pyz"]
    pyz = root / "opt.up" / "scheduled-events-relay" / "scheduled-events-relay.pyz"
    env_lines = (root / "etc.up" / "scheduled-events-relay" / "relay.env").read_text().split()
    settings = dict(line.split("=", 1) for line in env_lines)
    assert settings == {
        "RELAY_FORWARD": f"servicebus://{ARGS['SERVICEBUS_NAMESPACE']}/{ARGS['DOCUMENTS_QUEUE']}",
        "RELAY_IDENTITY_CLIENT_ID": ARGS["IDENTITY_CLIENT_ID"],
        "RELAY_CALLBACK_LISTEN": f"0.0.0.0:{ARGS['CALLBACK_PORT']}",
        "RELAY_HEARTBEAT_TABLE": ARGS["HEARTBEAT_TABLE_URL"],
        # Issue 38: the load balancer's readiness probe, on by default; issue 44: the
        # relay publishes its drain for the responder, which holds the port. (Hook scripts
        # run in the hook unit at the relay's default --hook-socket: test_hook_unit.py.)
        "RELAY_DRAIN_FILE": "/run/scheduled-events-relay/drain.json",
    }
    # The installed relay and responder, as the units start them, with their outputs
    # pointed at this machine: IMDS is the simulator, documents go to a directory, no Azure
    # endpoint is called; the probe on a free loopback port instead of the VM's 8493.
    outbox = tmp / "forwarded"
    ready_port = free_port()
    env = {
        **relay_env(),
        **settings,
        "RELAY_FORWARD": f"file:{outbox}",
        "RELAY_IMDS_URL": simulator.vm_url("myVM"),
        "RELAY_STATE_DIR": str(tmp / "state"),
        "RELAY_DRAIN_FILE": str(tmp / "drain.json"),
        "RELAY_READY_STATUS": str(tmp / "status.json"),
    }
    responder = subprocess.Popen(
        [exec_start[0], "-I", str(pyz), "ready", f"--listen=127.0.0.1:{ready_port}"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    for name in ("RELAY_IDENTITY_CLIENT_ID", "RELAY_CALLBACK_LISTEN", "RELAY_HEARTBEAT_TABLE"):
        del env[name]  # Azure's identity and table; the callback port is the real VM's
    relay = subprocess.Popen(
        [exec_start[0], "-I", str(pyz)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    try:
        deadline = time.monotonic() + 20
        while not json_files(outbox) and relay.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        if not json_files(outbox):
            relay.terminate()
            out = relay.communicate()[0].decode()
            pytest.fail(f"the installed relay forwarded no document: {out}")
        envelope = json.loads(json_files(outbox)[0].read_text())
        assert envelope["vm"]["name"] == "myVM"
        answer = None
        while answer is None and time.monotonic() < deadline + 20:  # the responder is up
            try:
                answer = requests.get(f"http://127.0.0.1:{ready_port}/readyz", timeout=5)
            except requests.RequestException:
                time.sleep(0.1)
        assert answer is not None and (answer.status_code, answer.json()) == (200, {"ready": True})
        assert json.loads((tmp / "drain.json").read_text())["ready"] is True  # published
    finally:
        responder.terminate()
        responder.wait(10)
        relay.terminate()
        out = relay.communicate(timeout=10)[0]
    assert relay.returncode in (0, -15), out


@pytest.fixture(autouse=True)
def _needs_overlay() -> None:
    if not _can_overlay():
        missing("needs root and `unshare -m` (a private mount namespace)")


def test_an_existing_vm_gets_a_working_relay_as_the_readme_says(tmp_path, simulator) -> None:
    work = tmp_path / "repo"
    work.mkdir()
    bundle = _bundle(work)
    calls = _run_recorded(_blocks("az vm run-command invoke"), work)
    invoke = [c for c in calls if c["argv"][:3] == ["vm", "run-command", "invoke"]]
    assert len(invoke) == 1
    argv = invoke[0]["argv"]
    assert _option(argv, "--command-id") == ["RunShellScript"]
    (script_ref,) = _option(argv, "--scripts")
    assert invoke[0]["files"][script_ref] == bundle.read_text()
    params = _option(argv, "--parameters")
    assert params == OUTPUTS["relayBootstrapArguments"].split()
    identity = [c["argv"] for c in calls if c["argv"][:3] == ["vm", "identity", "assign"]]
    assert identity and _option(identity[0], "--identities") == [OUTPUTS["relayIdentityId"]]
    assert calls.index(next(c for c in calls if c["argv"][:2] == ["vm", "identity"])) < calls.index(
        invoke[0]
    )  # the identity first: the relay's first send needs it
    proc, root = _install(invoke[0]["files"][script_ref], params, tmp_path / "root")
    assert proc.returncode == 0, proc.stderr
    assert "add-relay.sh: relay running" in proc.stdout
    _check_installed(root, simulator, tmp_path)


def test_a_scale_set_gets_a_working_relay_on_every_instance(tmp_path, simulator) -> None:
    work = tmp_path / "repo"
    work.mkdir()
    bundle = _bundle(work)
    calls = _run_recorded(_blocks("az vmss extension set"), work)
    argv_of = [c["argv"] for c in calls]
    extension = next(a for a in argv_of if a[:3] == ["vmss", "extension", "set"])
    assert _option(extension, "--publisher") == ["Microsoft.Azure.Extensions"]
    assert _option(extension, "-n") == ["CustomScript"]
    (settings,) = _option(extension, "--protected-settings")
    encoded = json.loads(settings)["script"]
    assert len(encoded) <= MAX_SCRIPT
    script = gzip.decompress(base64.b64decode(encoded)).decode()
    assert script.endswith(bundle.read_text())
    # the model first (identity, Terminate notifications, the extension), then the instances
    order = [" ".join(a[:3]) for a in argv_of if a[0] == "vmss"]
    assert order == [
        "vmss identity assign",
        "vmss update -g",
        "vmss extension list",
        "vmss extension set",
    ]
    update = next(a for a in argv_of if a[:2] == ["vmss", "update"])
    assert _option(update, "--enable-terminate-notification") == ["true"]
    proc, root = _install(script, [], tmp_path / "root")  # the extension passes no arguments
    assert proc.returncode == 0, proc.stderr
    _check_installed(root, simulator, tmp_path)


def test_the_script_alone_says_how_to_get_a_relay(tmp_path) -> None:
    """infra/relay/add-relay.sh without the bundle stops before installing, naming the fix;
    the README says so and never passes the bare script with `embedded`."""
    proc, root = _install(
        ADD_RELAY.read_text(), OUTPUTS["relayBootstrapArguments"].split(), tmp_path / "root"
    )
    assert proc.returncode == 2
    assert "no relay: pass PACKAGE_URL, or run the bundled form (make relay)" in proc.stderr
    text = README.read_text()
    assert "--scripts @infra/relay/add-relay.sh --parameters $ARGS" not in text
    assert not (root / "etc.up" / "scheduled-events-relay").exists()


def test_several_vnets_are_peered_both_ways_and_open_the_callback_port(tmp_path) -> None:
    calls = _run_recorded(_blocks("az network vnet peering create"), tmp_path)
    argv_of = [c["argv"] for c in calls]
    peerings = [a for a in argv_of if a[:4] == ["network", "vnet", "peering", "create"]]
    assert len(peerings) == 2
    ours, theirs = peerings
    assert _option(ours, "--vnet-name") == ["vnet-sebridge"]
    assert _option(ours, "--remote-vnet")[0].endswith("/virtualNetworks/vnet-web")
    assert _option(theirs, "--vnet-name") == ["vnet-web"]
    assert _option(theirs, "--remote-vnet")[0].endswith("/virtualNetworks/vnet-sebridge")
    assert all("--allow-vnet-access" in p for p in peerings)
    rule = next(a for a in argv_of if a[:4] == ["network", "nsg", "rule", "create"])
    assert _option(rule, "--source-address-prefixes") == ["10.40.1.0/24"]
    assert _option(rule, "--destination-port-ranges") == [ARGS["CALLBACK_PORT"]]
    assert _option(rule, "--direction") == ["Inbound"]


def test_an_upgrade_keeps_the_operators_settings_and_the_bootstrap_sets_hooks(
    tmp_path, simulator
) -> None:
    """Running the script again (the documented upgrade) rewrites relay.env, its own, and
    leaves relay.local.env, the operator's, as it was: a hook line added there survives.
    The 8th argument sets the relay's hooks from the bootstrap (issue 33)."""
    work = tmp_path / "repo"
    work.mkdir()
    script = _bundle(work).read_text()
    hook = tmp_path / "drain.sh"
    hook.write_text("#!/bin/sh\nexit 0\n")
    hook.chmod(0o755)
    args = OUTPUTS["relayBootstrapArguments"].split()
    root = tmp_path / "root"
    proc, _ = _install(script, [*args, f"drain={hook}"], root)
    assert proc.returncode == 0, proc.stderr
    etc = root / "etc.up" / "scheduled-events-relay"
    assert f'RELAY_HOOKS=\'{{"drain":"{hook}"}}\'' in (etc / "relay.env").read_text()
    local = etc / "relay.local.env"
    assert local.read_text().startswith("# Your RELAY_* settings")
    # The operator's own line, as the docs tell them to add it.
    mine = local.read_text() + "RELAY_HOOK_WAIT=5\nRELAY_HOOK_TIMEOUT=300\n"
    local.write_text(mine)
    proc, _ = _install(script, args, root)  # the upgrade, without hooks this time
    assert proc.returncode == 0, proc.stderr
    assert local.read_text() == mine
    assert "RELAY_HOOKS" not in (etc / "relay.env").read_text()
    unit = (root / "etc.up" / "systemd" / "system" / "scheduled-events-relay.service").read_text()
    files = re.findall(r"^EnvironmentFile=(.*)$", unit, re.M)
    assert files == [
        "/etc/scheduled-events-relay/relay.env",
        "-/etc/scheduled-events-relay/relay.local.env",
    ]


def test_a_scale_sets_own_custom_script_is_not_replaced(tmp_path) -> None:
    """Issue 44: a VM has one Custom Script extension (Learn, custom-script-linux.md @
    014bcff1: "You can have only one version of an extension applied to the VM"), so
    setting ours replaced a set's own bootstrap script, silently. The block stops first,
    and the docs say so; existing instances are brought along in batches, never with
    `update-instances --instance-ids '*'` (every relay of the set restarted at once)."""
    work = tmp_path / "repo"
    work.mkdir()
    _bundle(work)
    block = _blocks("az vmss extension set")
    calls = _run_recorded(block, work, fails=True, AZ_CUSTOM_SCRIPT="bootstrap")
    assert not [c for c in calls if c["argv"][:3] == ["vmss", "extension", "set"]]
    assert "update-instances" not in block
    text = README.read_text()
    assert "A VM has ONE Custom Script extension: this REPLACES the set's own" in block
    assert "python -m functions relay rollout --scope" in text
    readme = (ROOT / "README.md").read_text()
    assert "which replaces the set's own: a VM has one" in readme
    assert "[docs/rollout.md](docs/rollout.md)" in readme
