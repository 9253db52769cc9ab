"""The relay bootstrap: cloud-init carries the relay itself and infra/relay/add-relay.sh,
run with seven arguments, all filled by main.bicep (six still work: heartbeats then stay on
Service Bus); it fits in customData; no secret travels in it; the committed relay is a fresh
build of relay/; the script refuses bad input.

Per-VM identity (issue #22): main.bicep passes `none` as the 5th argument (it was the relay
key's Key Vault secret URI; there is no shared key any more) and the relays' own liveness
table as the 7th. infra/relay/ is the relay engineer's (another branch): the script tests
here test it as it is."""

from __future__ import annotations

import base64
import gzip
import json
import lzma
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.infra.bicep import INFRA, dotted, load
from tests.infra.checkov_gate import SAMPLE

# What the script is tested with: the 5th argument is `none` now (it was the relay key's Key
# Vault secret URI; there is no shared key any more). An old caller's URI is only warned about.
ARGS = {**SAMPLE, "RELAY_KEY_SECRET_URI": "none"}

CLOUD_INIT = INFRA / "relay" / "cloud-init.yaml"
ADD_RELAY = INFRA / "relay" / "add-relay.sh"
ADD_RELAY_GZ = INFRA / "relay" / "add-relay.sh.gz"  # what customData carries (make relay)
PYZ_XZ = INFRA / "relay" / "scheduled-events-relay.pyz.xz"
DEPLOY_DIR = INFRA.parent / "relay" / "deploy"
UNIT = DEPLOY_DIR / "scheduled-events-relay.service"
CUSTOM_DATA_LIMIT = 65535  # bytes, once Azure decodes customData's base64 (ARM reference)
PLACEHOLDER = re.compile(r"\{\{([A-Z0-9_]+)\}\}")
DRAIN_FILE = "RELAY_DRAIN_FILE=/run/scheduled-events-relay/drain.json\n"
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


def render(**overrides: str) -> str:
    values = dict(
        ARGS,
        ADD_RELAY_SCRIPT_B64=base64.b64encode(ADD_RELAY_GZ.read_bytes()).decode(),
        RELAY_PYZ_B64=base64.b64encode(PYZ_XZ.read_bytes()).decode(),
        **overrides,
    )
    return PLACEHOLDER.sub(lambda m: values[m.group(1)], CLOUD_INIT.read_text())


def test_every_placeholder_is_filled_by_main_bicep() -> None:
    used = set(PLACEHOLDER.findall(CLOUD_INIT.read_text()))
    assert used == set(_replacements()) == {*ARGS, "ADD_RELAY_SCRIPT_B64", "RELAY_PYZ_B64"}


def test_the_script_and_template_are_loaded_from_their_files() -> None:
    main = load("main")
    assert main.variables["cloudInitTemplate"]["function"]["parameters"]["file_path"] == (
        "relay/cloud-init.yaml"
    )
    script = main.variables["addRelayScriptB64"]["function"]
    assert script["type"] == "load_file_as_base64"
    assert script["parameters"]["file_path"] == "relay/add-relay.sh.gz"
    assert _replacements()["ADD_RELAY_SCRIPT_B64"] == "addRelayScriptB64"
    # Embedded only without a package URL (the VM then installs the release asset).
    chosen = main.variables["relayPyzB64"]["operator"]
    assert chosen["type"] == "conditional"
    condition = chosen["operands"]["condition"]["function"]
    assert condition == {"type": "empty", "parameters": {"item_to_test": "relayPackageUrl"}}
    pyz = chosen["operands"]["true_value"]["function"]
    assert pyz["type"] == "load_file_as_base64"
    assert pyz["parameters"]["file_path"] == "relay/scheduled-events-relay.pyz.xz"
    assert chosen["operands"]["false_value"] == ""
    assert _replacements()["RELAY_PYZ_B64"] == "relayPyzB64"


def _builder():
    import importlib.util

    path = INFRA.parent / "relay" / "deploy" / "build_pyz.py"
    spec = importlib.util.spec_from_file_location("build_pyz", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_embedded_relay_is_a_fresh_build_of_relay(tmp_path) -> None:
    builder = _builder()
    # The archive it unpacks to, not liblzma's bytes (which may differ between its versions).
    stored = builder.build_bytes(zipfile.ZIP_STORED)
    assert builder.embedded_archive(PYZ_XZ.read_bytes()) == stored, (
        "infra/relay/scheduled-events-relay.pyz.xz is stale: make relay"
    )
    pyz = tmp_path / "scheduled-events-relay.pyz"  # what add-relay.sh unpacks on the VM
    pyz.write_bytes(lzma.decompress(PYZ_XZ.read_bytes()))
    with zipfile.ZipFile(pyz) as archive, zipfile.ZipFile(builder.build(tmp_path / "d.pyz")) as d:
        assert {n: archive.read(n) for n in archive.namelist()} == {
            n: d.read(n) for n in d.namelist()
        }  # the same files as the release pyz, only stored instead of deflated
    help_text = subprocess.run(
        [sys.executable, "-I", "-S", str(pyz), "--help"], capture_output=True, text=True, check=True
    ).stdout
    assert "--forward" in help_text


def test_custom_data_fits_azures_limit() -> None:
    import yaml

    text = render(
        RELAY_KEY_SECRET_URI="https://" + "k" * 24 + ".vault.azure.net/secrets/" + "r" * 127,
        HEARTBEAT_TABLE_URL="https://" + "s" * 24 + ".table.core.windows.net/" + "t" * 63,
    )
    size = len(text.encode())
    assert size <= CUSTOM_DATA_LIMIT, f"customData is {size} bytes, over {CUSTOM_DATA_LIMIT}"
    assert size <= CUSTOM_DATA_LIMIT - 4096, f"{size} bytes leaves under 4 KiB of headroom"
    files = {f["path"]: f for f in yaml.safe_load(text)["write_files"]}
    pyz = files["/opt/scheduled-events-relay/scheduled-events-relay.pyz.xz"]
    assert pyz["encoding"] == "b64"  # cloud-init writes the xz; add-relay.sh unpacks it
    assert base64.b64decode(pyz["content"]) == PYZ_XZ.read_bytes()


def test_the_embedded_script_is_add_relay_sh_gzipped_reproducibly() -> None:
    """customData carries add-relay.sh without its comments, gzipped (cloud-init `gz+b64`);
    `make relay` rewrites the committed copy, and it must be the script as it is now."""
    import yaml

    from relay.deploy.build_pyz import embedded_script, slim_script

    assert ADD_RELAY_GZ.read_bytes() == embedded_script(), (
        "infra/relay/add-relay.sh.gz is stale: run `make relay`"
    )
    script = ADD_RELAY.read_text()
    shipped = gzip.decompress(ADD_RELAY_GZ.read_bytes()).decode()
    assert shipped == slim_script(script)
    # Only comment and blank lines left out, in the shell and in the unit it writes.
    assert shipped.splitlines() == [
        line
        for n, line in enumerate(script.splitlines())
        if n == 0 or line.strip()[:1] not in ("#", "")
    ]
    unit = re.search(r"<<'UNIT_FILE'\n(.*?)^UNIT_FILE$", shipped, re.S | re.M)
    assert unit and unit.group(1).splitlines() == [
        line for line in UNIT.read_text().splitlines() if line.strip()[:1] not in ("#", "")
    ]
    syntax = subprocess.run(["sh", "-n"], input=shipped, capture_output=True, text=True)
    assert syntax.returncode == 0, syntax.stderr
    files = {f["path"]: f for f in yaml.safe_load(render())["write_files"]}
    assert files["/usr/local/sbin/add-scheduled-events-relay"]["encoding"] == "gz+b64"


def test_the_unit_in_the_script_is_the_relays_unit() -> None:
    text = ADD_RELAY.read_text()
    unit = re.search(r"<<'UNIT_FILE'\n(.*?)^UNIT_FILE$", text, re.S | re.M)
    assert unit, "add-relay.sh writes the unit from a quoted UNIT_FILE heredoc"
    assert unit.group(1) == UNIT.read_text()


def test_the_bundled_script_carries_the_relay(tmp_path) -> None:
    """What run-command sends: add-relay.sh, a marker, the pyz in base64 (make relay)."""
    bundle = tmp_path / "add-relay-bundled.sh"
    release_pyz = lzma.decompress(PYZ_XZ.read_bytes())
    payload = base64.encodebytes(release_pyz).decode()
    bundle.write_text(ADD_RELAY.read_text() + "__RELAY_PYZ_BASE64__\n" + payload)
    extract = re.search(
        r"^    (sed '1,/\^__RELAY_PYZ_BASE64__\$/d' \"\$0\" \| base64 -d)",
        ADD_RELAY.read_text(),
        re.M,
    )
    assert extract, "add-relay.sh extracts the appended relay with sed | base64 -d"
    out = subprocess.run(
        ["sh", "-c", extract.group(1), str(bundle)], capture_output=True, check=True
    ).stdout
    assert out == release_pyz
    assert "\nexit 0\n" in ADD_RELAY.read_text()  # the shell never reads the payload


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
        r"PACKAGE_URL=\$6 TABLE_URL=\$\{7-\} HOOKS=\$\{8-\}\n"
        r"READY=\$\{9-\} HOOK_AS=\$\{10-\}$",
        ADD_RELAY.read_text(),
        re.M,
    )
    assert usage, "add-relay.sh's argument order changed: update cloud-init.yaml and this test"


def test_bootstrap_arguments_output_matches_the_script_order() -> None:
    main = load("main")
    value = main.outputs["relayBootstrapArguments"]["value"]
    assert value.split() == [
        "${serviceBus.outputs.fullyQualifiedNamespace}",
        "${serviceBus.outputs.queueName}",
        "${relayIdentity.properties.clientId}",
        "${relayCallbackPort}",
        "${relayKeyArgument}",
        "${relayPackageArgument}",
        "${storage.outputs.livenessTableUrl}",
    ]
    # The former key secret URI: a placeholder word that keeps the 6th and 7th in place.
    assert main.variables["relayKeyArgument"] == "none"
    assert _replacements()["RELAY_KEY_SECRET_URI"] == "relayKeyArgument"
    assert "keyVault" not in value
    # `--parameters $ARGS` splits on spaces: an empty package URL would vanish and shift the
    # table URL into its place, so the output writes it as a word the script reads as "".
    ternary = main.variables["relayPackageArgument"]["operator"]
    assert ternary["type"] == "conditional"
    ops = ternary["operands"]
    assert ops["condition"]["function"]["type"] == "empty"
    assert ops["condition"]["function"]["parameters"] == {"item_to_test": "relayPackageUrl"}
    assert (ops["true_value"], ops["false_value"]) == ("embedded", "relayPackageUrl")


def test_main_fills_the_table_url_from_the_storage_module() -> None:
    assert dotted(_replacements()["HEARTBEAT_TABLE_URL"]) == "storage.outputs.livenessTableUrl"
    outputs = load("main").outputs
    assert dotted(outputs["relayHeartbeatTable"]["value"]) == "storage.outputs.livenessTableUrl"
    st = load("storage")
    url = st.outputs["livenessTableUrl"]["value"]
    assert url == "${account.properties.primaryEndpoints.table}${livenessTable.name}"
    assert st.resource("livenessTable").body["name"] == "${tablePrefix}liveness"
    assert "heartbeatTableUrl" not in st.outputs  # the vms table is never handed to relays


def test_the_script_takes_the_arguments_main_bicep_passes() -> None:
    """What cloud-init and relayBootstrapArguments now pass: `none` in 5th place, the
    liveness table 7th. Skips, saying so, while infra/relay/add-relay.sh (the relay
    engineer's, another branch) still wants a Key Vault secret URI there."""
    args = [ARGS[k] for k in ARG_ORDER]
    args[ARG_ORDER.index("RELAY_KEY_SECRET_URI")] = load("main").variables["relayKeyArgument"]
    args[ARG_ORDER.index("RELAY_PACKAGE_URL")] = "embedded"
    table = "https://stsebridgeabc.table.core.windows.net/sebridgeliveness"
    args[ARG_ORDER.index("HEARTBEAT_TABLE_URL")] = table
    proc = _checked(*args)
    if "is not a Key Vault secret URI" in proc.stderr:
        pytest.skip("add-relay.sh still reads a key secret URI as its 5th argument (relay side)")
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, f"|{table}\n", "")


def test_no_secret_travels_in_cloud_init_or_the_script() -> None:
    for text in (CLOUD_INIT.read_text(), ADD_RELAY.read_text()):
        assert not re.search(r"SharedAccessKey|AccountKey=|password|CALLBACK_KEY__", text, re.I)
    script = ADD_RELAY.read_text()
    # No key is fetched from anywhere: no token for Key Vault, no key file for the relay (it
    # makes its own callback-key.json in its state directory).
    assert "https://vault.azure.net" not in script and "oauth2" not in script
    assert "RELAY_CALLBACK_KEY_FILE" not in script and "RELAY_CALLBACK_URL" not in script
    assert "urllib" not in script and "<<PY" not in script


@pytest.mark.parametrize("fifth", ["none", ""])
def test_the_fifth_argument_is_none_or_empty(fifth) -> None:
    args = [ARGS[k] for k in ARG_ORDER]
    args[ARG_ORDER.index("RELAY_KEY_SECRET_URI")] = fifth
    proc = _checked(*args)
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
    proc = _checked(*args)
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
    # The checks alone (_checked): a URL wrongly let through must not run the install.
    proc = _checked(*[bad if k == field else ARGS[k] for k in ARG_ORDER])
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


def _checked(*args: str) -> subprocess.CompletedProcess:
    """add-relay.sh up to its first side effect (the root check, then IMDS and installing),
    printing what it parsed instead: the argument checks alone, safe to run anywhere."""
    text = ADD_RELAY.read_text()
    cut = text.index('[ "$(id -u)" = 0 ]')
    script = text[:cut] + 'printf "%s|%s\\n" "$PACKAGE_URL" "$TABLE_URL"\nexit 0\n'
    return subprocess.run(
        ["sh", "-c", script, "add-relay.sh", *args], capture_output=True, text=True
    )


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
    proc = _checked(*args, table)
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, f"|{table}\n", "")


def test_six_arguments_still_install_a_relay_that_heartbeats_on_service_bus() -> None:
    """A bootstrap command from before the table (six arguments) still works, and so does ""."""
    six = [ARGS[k] for k in ARG_ORDER][:6]
    assert len(six) == 6 and ARG_ORDER[6] == "HEARTBEAT_TABLE_URL"
    for args in (six, [*six, ""]):
        proc = _checked(*args)
        assert (proc.returncode, proc.stdout, proc.stderr) == (0, "|\n", "")


def test_the_package_url_may_be_written_embedded() -> None:
    args = [ARGS[k] for k in ARG_ORDER]
    args[ARG_ORDER.index("RELAY_PACKAGE_URL")] = "embedded"
    proc = _checked(*args)
    assert (proc.returncode, proc.stdout) == (0, f"|{ARGS['HEARTBEAT_TABLE_URL']}\n")
    url = "https://example.org/r.pyz#sha256=" + "0" * 64
    args[ARG_ORDER.index("RELAY_PACKAGE_URL")] = url
    assert _checked(*args).stdout.startswith("https://example.org/r.pyz|")


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


def test_the_bootstrap_sets_the_relays_hooks(tmp_path) -> None:
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
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        settings = load_settings([])
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
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


def test_cloud_init_turns_the_probe_on_and_main_bicep_can_turn_it_off() -> None:
    """The example VMs get the probe from cloud-init's 9th argument: relayReadyPort (8493),
    or `off` when it is 0; the 8th is `none` (hook scripts are the operator's)."""
    main = load("main")
    assert main.param_default("relayReadyPort") == 8493
    assert _replacements()["READY_PORT"] == "relayReadyArgument"
    assert _replacements()["RELAY_HOOKS"] == "none"
    ternary = main.variables["relayReadyArgument"]["operator"]["operands"]
    assert ternary["false_value"] == "off"
    assert ternary["condition"]["operator"]["type"] == "greater_than"
    assert ternary["condition"]["operator"]["operands"]["operand_1"] == "relayReadyPort"


def test_the_relay_reads_the_line(tmp_path) -> None:
    """What add-relay.sh writes is a setting the relay takes (and the responder's default)."""
    from relay.responder import DEFAULT_DRAIN_FILE
    from relay.settings import load_settings

    value = DRAIN_FILE.strip().partition("=")[2]
    assert Path(value) == DEFAULT_DRAIN_FILE
    for env_value, expected in ((value, Path(value)),):
        env = {"RELAY_DRAIN_FILE": env_value, "RELAY_FORWARD": f"file:{tmp_path}"}
        old = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            assert load_settings([]).drain_file == expected
        finally:
            for k, v in old.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


def test_add_relay_unpacks_the_xz_cloud_init_writes(tmp_path) -> None:
    """cloud-init has no xz encoding: it writes scheduled-events-relay.pyz.xz as it came
    (`encoding: b64`) and add-relay.sh unpacks it with the VM's Python (or `xz -d`)."""
    text = ADD_RELAY.read_text()
    unpack = re.search(
        r'^    "\$PY" -c (\'[^\']*\') "\$PYZ\.xz" > "\$work/relay\.pyz" \|\|$', text, re.M
    )
    assert unpack, "add-relay.sh unpacks $PYZ.xz with $PY's lzma"
    assert 'xz -dc "$PYZ.xz" > "$work/relay.pyz" ||' in text and 'rm -f "$PYZ.xz"' in text
    (tmp_path / "relay.pyz.xz").write_bytes(PYZ_XZ.read_bytes())
    out = subprocess.run(
        ["sh", "-c", f'"{sys.executable}" -I -c {unpack.group(1)} relay.pyz.xz > relay.pyz'],
        cwd=tmp_path,
        check=True,
    )
    assert out.returncode == 0
    pyz = tmp_path / "relay.pyz"
    assert zipfile.is_zipfile(pyz) and lzma.decompress(PYZ_XZ.read_bytes()) == pyz.read_bytes()


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


def test_the_standalone_cloud_init_and_install_sh_carry_the_same_units() -> None:
    import yaml

    doc = yaml.safe_load((DEPLOY_DIR / "cloud-init.yaml").read_text())
    files = {f["path"]: f["content"] for f in doc["write_files"]}
    for unit in (
        "scheduled-events-relay.service",
        "scheduled-events-relay-ready.socket",
        "scheduled-events-relay-ready.service",
        "scheduled-events-relay-callback.socket",
    ):
        expected = (
            (DEPLOY_DIR / unit)
            .read_text()
            .replace("ListenStream=8492", "ListenStream=__RELAY_CALLBACK_PORT__")
        )
        assert files[f"/etc/systemd/system/{unit}"] == expected, unit
        assert unit in (DEPLOY_DIR / "install.sh").read_text()
    runcmd = "\n".join(doc["runcmd"])
    assert "scheduled-events-relay-callback.socket scheduled-events-relay-ready.socket" in runcmd
    env = files["/etc/scheduled-events-relay/relay.env"]
    assert "RELAY_DRAIN_FILE=/run/scheduled-events-relay/drain.json" in env
