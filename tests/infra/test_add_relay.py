"""infra/relay/add-relay.sh itself: it refuses bad input before doing anything (its
arguments, the table URL, the hooks, the readiness port), takes six to ten arguments, and
writes what the relay reads (relay.env, the hooks, the drain file) and the units relay/deploy
has. How cloud-init runs it, filled by main.bicep, is tested in
tests/infra/test_cloud_init.py; both use tests/infra/relay_bootstrap.py.

infra/relay/ is the relay engineer's (another branch): these test the script as it is."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from tests.infra.checkov_gate import SAMPLE
from tests.infra.relay_bootstrap import ADD_RELAY, ARG_ORDER, ARGS, DEPLOY_DIR, UNIT, checked

DRAIN_FILE = "RELAY_DRAIN_FILE=/run/scheduled-events-relay/drain.json\n"


def test_the_unit_in_the_script_is_the_relays_unit() -> None:
    text = ADD_RELAY.read_text()
    unit = re.search(r"<<'UNIT_FILE'\n(.*?)^UNIT_FILE$", text, re.S | re.M)
    assert unit, "add-relay.sh writes the unit from a quoted UNIT_FILE heredoc"
    assert unit.group(1) == UNIT.read_text()


@pytest.mark.parametrize("fifth", ["none", ""])
def test_the_fifth_argument_is_none_or_empty(fifth) -> None:
    args = [ARGS[k] for k in ARG_ORDER]
    args[ARG_ORDER.index("RELAY_KEY_SECRET_URI")] = fifth
    proc = checked(*args)
    assert (proc.returncode, proc.stdout, proc.stderr) == (
        0,
        f"|{ARGS['HEARTBEAT_TABLE_URL']}\n",
        "",
    )


def test_an_old_callers_key_vault_uri_is_ignored_with_a_warning() -> None:
    """Before per-VM keys the 5th argument was the relay key's secret URI: a bootstrap
    command from then still installs (nothing is read from Key Vault), saying so."""
    args = [ARGS[k] for k in ARG_ORDER]
    args[ARG_ORDER.index("RELAY_KEY_SECRET_URI")] = SAMPLE["RELAY_KEY_SECRET_URI"]
    assert SAMPLE["RELAY_KEY_SECRET_URI"].startswith("https://kv-x.vault.azure.net/secrets/")
    proc = checked(*args)
    assert (proc.returncode, proc.stdout) == (0, f"|{ARGS['HEARTBEAT_TABLE_URL']}\n")
    assert proc.stderr.startswith("add-relay.sh: warning: ignoring the 5th argument")


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
        ("RELAY_PACKAGE_URL", "https://example.org/scheduled-events-relay.pyz"),  # no checksum
        ("RELAY_PACKAGE_URL", "http://example.org/r.pyz#sha256=" + "0" * 64),
        ("RELAY_PACKAGE_URL", "https://example.org/r.pyz#sha256=" + "0" * 63),
        ("RELAY_PACKAGE_URL", "https://example.org/r.pyz#sha256=" + "A" * 64),
    ],
)
def test_the_script_refuses_bad_arguments_before_doing_anything(field, bad) -> None:
    args = [bad if k == field else ARGS[k] for k in ARG_ORDER]
    proc = subprocess.run(["sh", str(ADD_RELAY), *args], capture_output=True, text=True)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("add-relay.sh:")


@pytest.mark.parametrize(
    ("field", "bad"),
    [
        ("HEARTBEAT_TABLE_URL", "http://stx.table.core.windows.net/sebridgevms"),
        ("HEARTBEAT_TABLE_URL", "https://stx.blob.core.windows.net/sebridgevms"),
        ("HEARTBEAT_TABLE_URL", "https://stx.table.core.windows.net/"),
        ("HEARTBEAT_TABLE_URL", "https://stx.table.core.windows.net"),
        ("HEARTBEAT_TABLE_URL", "https://stx.table.core.windows.net/sebridgevms/"),
        ("HEARTBEAT_TABLE_URL", "https://stx.table.core.windows.net/sebridgevms?sv=x"),
        ("HEARTBEAT_TABLE_URL", "https://stx.table.core.windows.net/vm-s"),
        ("HEARTBEAT_TABLE_URL", "https://stx.table.core.windows.net/1vms"),
        ("HEARTBEAT_TABLE_URL", "https://stx.table.core.windows.net/v\u00e9ms"),
        ("HEARTBEAT_TABLE_URL", "https://StX.table.core.windows.net/sebridgevms"),
        ("HEARTBEAT_TABLE_URL", "https://st.table.core.windows.net/sebridgevms"),  # 2 chars
        ("HEARTBEAT_TABLE_URL", "https://x.y.table.core.windows.net/sebridgevms"),
        ("HEARTBEAT_TABLE_URL", "https://evil.example/stx.table.core.windows.net/vms"),
        ("HEARTBEAT_TABLE_URL", "https://stx.table.core..net/sebridgevms"),
        ("HEARTBEAT_TABLE_URL", "https://stx.table.core./sebridgevms"),
        ("HEARTBEAT_TABLE_URL", "https://stx.table.core.windows.net:443/sebridgevms"),
        ("HEARTBEAT_TABLE_URL", "sebridgevms"),
    ],
)
def test_the_script_refuses_a_malformed_table_url(field, bad) -> None:
    # The checks alone (checked): a URL wrongly let through must not run the install.
    proc = checked(*[bad if k == field else ARGS[k] for k in ARG_ORDER])
    assert proc.returncode == 2, proc.stdout
    assert (
        proc.stderr == f"add-relay.sh: {bad} is not https://ACCOUNT.table.core.windows.net/TABLE\n"
    )


@pytest.mark.parametrize("count", [0, 1, 5, 11])
def test_the_script_wants_six_to_ten_arguments(count) -> None:
    args = [*(ARGS[k] for k in ARG_ORDER), "", "extra", "more"][:count]
    proc = subprocess.run(["sh", str(ADD_RELAY), *args], capture_output=True, text=True)
    assert proc.returncode == 2
    assert "usage:" in proc.stderr


@pytest.mark.parametrize(
    "table",
    [
        "https://stsebridgeabc.table.core.windows.net/sebridgevms",
        "https://" + "s" * 24 + ".table.core.windows.net/T" + "t" * 62,
        "https://stx.table.core.chinacloudapi.cn/sebridgevms",
        "https://stx.table.core.usgovcloudapi.net/sebridgevms",
    ],
)
def test_the_script_takes_a_seventh_argument_the_table_url(table) -> None:
    args = [ARGS[k] for k in ARG_ORDER][:6]
    proc = checked(*args, table)
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, f"|{table}\n", "")


def test_six_arguments_still_install_a_relay_that_heartbeats_on_service_bus() -> None:
    """A bootstrap command from before the table (six arguments) still works, and so does ""."""
    six = [ARGS[k] for k in ARG_ORDER][:6]
    assert len(six) == 6 and ARG_ORDER[6] == "HEARTBEAT_TABLE_URL"
    for args in (six, [*six, ""]):
        proc = checked(*args)
        assert (proc.returncode, proc.stdout, proc.stderr) == (0, "|\n", "")


def test_the_package_url_may_be_written_embedded() -> None:
    args = [ARGS[k] for k in ARG_ORDER]
    args[ARG_ORDER.index("RELAY_PACKAGE_URL")] = "embedded"
    proc = checked(*args)
    assert (proc.returncode, proc.stdout) == (0, f"|{ARGS['HEARTBEAT_TABLE_URL']}\n")
    url = "https://example.org/r.pyz#sha256=" + "0" * 64
    args[ARG_ORDER.index("RELAY_PACKAGE_URL")] = url
    assert checked(*args).stdout.startswith("https://example.org/r.pyz|")


def _heartbeat_env_line() -> str:
    line = re.search(r'^\[ -z "\$TABLE_URL" \] \|\| echo .*$', ADD_RELAY.read_text(), re.M)
    assert line, "add-relay.sh appends RELAY_HEARTBEAT_TABLE to relay.env when given a table"
    return line.group(0)


@pytest.mark.parametrize("table", ["", "https://stx.table.core.windows.net/sebridgevms"])
def test_the_table_url_reaches_the_relay_as_relay_heartbeat_table(tmp_path, table) -> None:
    env = tmp_path / "relay.env.new"
    env.write_text(_expand(_heredoc("ENV")) + "\n")
    before = env.read_text()
    subprocess.run(
        ["sh", "-c", _heartbeat_env_line()],
        env={"ETC": str(tmp_path), "TABLE_URL": table, "PATH": "/usr/bin:/bin"},
        check=True,
    )
    if table:
        assert env.read_text() == before + f"RELAY_HEARTBEAT_TABLE={table}\n"
    else:
        assert env.read_text() == before  # no line: the relay heartbeats on Service Bus
    script = ADD_RELAY.read_text()
    assert script.index(_heartbeat_env_line()) < script.index('mv "$ETC/relay.env.new"')


def test_relay_heartbeat_table_is_the_relays_setting() -> None:
    """The contract: RELAY_HEARTBEAT_TABLE is the relay's `heartbeat_table` (--heartbeat-table).
    Skips until the relay side of the change is in relay/settings.py."""
    from relay.settings import SETTING_NAMES

    if "heartbeat_table" not in SETTING_NAMES:
        pytest.skip("relay/settings.py has no heartbeat_table yet (the relay side lands later)")
    assert "RELAY_HEARTBEAT_TABLE=" in _heartbeat_env_line()


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
    }
    text = re.sub(r"\$(\w+)", lambda m: values[m.group(1)], text)
    return text.replace("\\\\", "\\")


def test_the_script_removes_what_the_shared_key_versions_left() -> None:
    """An upgrade over a shared-key install stops the Key Vault fetcher and deletes the key."""
    script = ADD_RELAY.read_text()
    cleanup = script[script.index("# Left by the shared-key versions") :]
    assert "systemctl disable --now scheduled-events-relay-key.timer" in cleanup
    for path in (
        "/etc/systemd/system/scheduled-events-relay-key.timer",
        "/etc/systemd/system/scheduled-events-relay-key.service",
        "/usr/local/sbin/scheduled-events-relay-key",
        '"$ETC/callback.key"',
    ):
        assert path in cleanup.split("systemctl daemon-reload")[0], path


def test_relay_env_names_real_relay_settings() -> None:
    from relay.settings import SETTING_NAMES

    env = _expand(_heredoc("ENV"))
    values = dict(line.split("=", 1) for line in env.splitlines() if line.strip())
    fields = {f"RELAY_{name.upper()}" for name in SETTING_NAMES}
    assert set(values) <= fields, set(values) - fields
    assert values["RELAY_FORWARD"] == "servicebus://sb-x.servicebus.windows.net/documents"
    assert values["RELAY_IDENTITY_CLIENT_ID"] == ARGS["IDENTITY_CLIENT_ID"]
    assert values["RELAY_CALLBACK_LISTEN"] == "0.0.0.0:8492"
    # The app calls Azure's address for the VM: nothing advertised, no key file.
    assert set(values) == {"RELAY_FORWARD", "RELAY_IDENTITY_CLIENT_ID", "RELAY_CALLBACK_LISTEN"}


def test_the_script_installs_the_relay_where_the_unit_runs_it() -> None:
    unit = UNIT.read_text()
    assert "EnvironmentFile=/etc/scheduled-events-relay/relay.env" in unit
    assert "User=scheduled-events-relay" in unit
    assert (
        "ExecStart=/usr/bin/python3 -I /opt/scheduled-events-relay/scheduled-events-relay.pyz"
        in unit
    )
    script = ADD_RELAY.read_text()
    assert "PYZ=$PREFIX/scheduled-events-relay.pyz" in script
    assert "PREFIX=/opt/scheduled-events-relay" in script
    assert "sys.version_info < (3, 9)" in script  # any Python >= 3.9, nothing installed
    assert "sha256sum -c" in script  # a downloaded relay is checked before it is installed
    assert "pip" not in script and "venv" not in script


def _hooks_parsed(hooks: str) -> subprocess.CompletedProcess:
    """add-relay.sh's argument checks with HOOKS as the 8th argument, printing RELAY_HOOKS'
    value instead of installing."""
    text = ADD_RELAY.read_text()
    cut = text.index('[ "$(id -u)" = 0 ]')
    script = text[:cut] + 'printf "%s\\n" "$HOOKS_JSON"\nexit 0\n'
    args = [ARGS[k] for k in ARG_ORDER][: ARG_ORDER.index("RELAY_HOOKS")]
    return subprocess.run(
        ["sh", "-c", script, "add-relay.sh", *args, hooks], capture_output=True, text=True
    )


def test_the_bootstrap_sets_the_relays_hooks(tmp_path, monkeypatch) -> None:
    """The 8th argument, NAME=/abs/path[,...], becomes RELAY_HOOKS as the relay reads it
    (issue 33: the hook line an operator added by hand was lost on every upgrade)."""
    from relay.settings import load_settings

    drain, undrain = tmp_path / "drain.sh", tmp_path / "undrain.sh"
    for hook in (drain, undrain):
        hook.write_text("#!/bin/sh\nexit 0\n")
        hook.chmod(0o755)
    proc = _hooks_parsed(f"drain={drain},undrain={undrain}")
    assert proc.returncode == 0, proc.stderr
    value = proc.stdout.strip()
    assert json.loads(value) == {"drain": str(drain), "undrain": str(undrain)}
    # What the relay makes of it (systemd strips the single quotes the script writes).
    line = re.search(
        r"""^\[ -z "\$HOOKS_JSON" \] \|\| echo "RELAY_HOOKS='\$HOOKS_JSON'".*$""",
        ADD_RELAY.read_text(),
        re.M,
    )
    assert line, "add-relay.sh writes RELAY_HOOKS into relay.env"
    env = {
        "RELAY_HOOKS": value,
        "RELAY_CALLBACK_LISTEN": "127.0.0.1:0",
        "RELAY_FORWARD": f"file:{tmp_path}",
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    settings = load_settings([])
    assert {k: str(v) for k, v in settings.hooks.items()} == {
        "drain": str(drain),
        "undrain": str(undrain),
    }
    for empty in ("", "none"):
        assert _hooks_parsed(empty).stdout == "\n"


@pytest.mark.parametrize(
    ("hooks", "says"),
    [
        ("drain", "is not NAME=/abs/path"),
        ("dr ain=/bin/true", "is not NAME=/abs/path"),
        ("=/bin/true", "is not NAME=/abs/path"),
        ("drain=bin/true", "is not an absolute path"),
        ("drain=/bin/tr'ue", "may only use"),
        ("drain=/nonexistent/drain.sh", "is not an executable file on this VM"),
        ("drain=/etc/passwd", "is not an executable file on this VM"),
        ("drain=/etc", "is not an executable file on this VM"),
    ],
)
def test_bad_hooks_are_refused_before_anything_is_installed(hooks, says) -> None:
    proc = _hooks_parsed(hooks)
    assert proc.returncode == 2 and says in proc.stderr, proc.stderr
    assert proc.stdout == ""


def test_operator_settings_live_in_a_file_the_script_never_rewrites() -> None:
    """relay.env is the script's (rewritten on every run, an upgrade); relay.local.env is
    the operator's: the unit reads it after relay.env (its values win) and the script only
    creates it when missing."""
    unit = UNIT.read_text()
    env_files = re.findall(r"^EnvironmentFile=(.*)$", unit, re.M)
    assert env_files == [
        "/etc/scheduled-events-relay/relay.env",
        "-/etc/scheduled-events-relay/relay.local.env",
    ]
    script = ADD_RELAY.read_text()
    assert 'if [ ! -e "$ETC/relay.local.env" ]; then' in script
    writes = re.findall(r'>>? *"\$ETC/relay\.local\.env"', script)
    assert len(writes) == 1  # the one guarded creation


def _ready_parsed(*ready: str) -> subprocess.CompletedProcess:
    """add-relay.sh's argument checks with READY as the 9th argument (or none given),
    printing the relay.env line it would write instead of installing."""
    text = ADD_RELAY.read_text()
    cut = text.index('[ "$(id -u)" = 0 ]')
    line = re.search(r'^\[ -z "\$READY" \] \|\| echo "RELAY_DRAIN_FILE=.*$', text, re.M)
    assert line, "add-relay.sh writes RELAY_DRAIN_FILE into relay.env when the probe is on"
    socket = re.search(r'^    sed "s\|\^ListenStream=8493\$\|ListenStream=\$READY\|" ', text, re.M)
    assert socket, "add-relay.sh puts READY in the readiness socket unit"
    script = text[:cut] + line.group(0).replace('>> "$ETC/relay.env.new"', "")
    script += '\n[ -z "$READY" ] || echo "ListenStream=$READY"\nexit 0\n'

    args = [ARGS[k] for k in ARG_ORDER][: ARG_ORDER.index("READY_PORT")]
    return subprocess.run(
        ["sh", "-c", script, "add-relay.sh", *args, *ready], capture_output=True, text=True
    )


@pytest.mark.parametrize(
    ("ready", "line"),
    [
        ((), f"{DRAIN_FILE}ListenStream=8493\n"),  # eight arguments, as before: on
        (("",), f"{DRAIN_FILE}ListenStream=8493\n"),
        (("9000",), f"{DRAIN_FILE}ListenStream=9000\n"),
        (("off",), ""),
        (("0",), ""),
    ],
)
def test_the_readiness_probe_is_on_unless_turned_off(ready, line) -> None:
    """Issue 38: /readyz was off unless an operator edited relay.local.env on every VM. Now
    add-relay.sh turns it on (port 8493) for every install, old callers' eight arguments
    included; its 9th argument, `off`, turns it off. Issue 44: the port goes to the
    readiness responder's socket unit, and the relay publishes its drain for it."""
    proc = _ready_parsed(*ready)
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, line, "")


@pytest.mark.parametrize("bad", ["65536", "8492", "abc", "-1", "9" * 30])
def test_a_bad_readiness_port_is_refused_before_anything_is_installed(bad) -> None:
    proc = _ready_parsed(bad)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr == (
        f"add-relay.sh: readiness port {bad}: 1-65535 (not {ARGS['CALLBACK_PORT']}) or off\n"
    )


def test_the_relay_reads_the_line(tmp_path, monkeypatch) -> None:
    """What add-relay.sh writes is a setting the relay takes (and the responder's default)."""
    from relay.responder import DEFAULT_DRAIN_FILE
    from relay.settings import load_settings

    value = DRAIN_FILE.strip().partition("=")[2]
    assert Path(value) == DEFAULT_DRAIN_FILE
    for env_value, expected in ((value, Path(value)),):
        env = {"RELAY_DRAIN_FILE": env_value, "RELAY_FORWARD": f"file:{tmp_path}"}
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        assert load_settings([]).drain_file == expected


@pytest.mark.parametrize(
    ("heredoc", "unit", "port"),
    [
        ("CALLBACK_SOCKET", "scheduled-events-relay-callback.socket", "8492"),
        ("READY_SOCKET", "scheduled-events-relay-ready.socket", "8493"),
        ("READY_UNIT", "scheduled-events-relay-ready.service", None),
    ],
)
def test_the_port_sockets_and_the_responder_are_relay_deploys_units(heredoc, unit, port) -> None:
    """Issue 44 and 46: add-relay.sh writes the socket units that hold the callback and
    probe ports and the readiness responder's unit, as relay/deploy has them (install.sh
    copies those), the ports and Python filled in by sed."""
    text = ADD_RELAY.read_text()
    found = re.search(rf"<<'{heredoc}'\n(.*?)^{heredoc}$", text, re.S | re.M)
    assert found and found.group(1) == (DEPLOY_DIR / unit).read_text()
    if port:
        assert f"s|^ListenStream={port}$|" in text and f"ListenStream={port}\n" in found.group(1)
    service = (DEPLOY_DIR / "scheduled-events-relay.service").read_text()
    assert "Sockets=scheduled-events-relay-callback.socket\n" in service
    assert "RuntimeDirectoryPreserve=restart\n" in service  # a stopped relay drains nothing
