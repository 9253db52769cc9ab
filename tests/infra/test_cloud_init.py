"""The relay bootstrap as cloud-init carries it: infra/relay/cloud-init.yaml carries the
relay itself and infra/relay/add-relay.sh, run with seven arguments, all filled by
main.bicep (six still work: heartbeats then stay on Service Bus); it fits in customData; no
secret travels in it; the committed relay and script are fresh builds of relay/. The
script's own checks and what it installs are tested in tests/infra/test_add_relay.py.

Per-VM identity (issue #22): main.bicep passes `none` as the 5th argument (it was the relay
key's Key Vault secret URI; there is no shared key any more) and the relays' own liveness
table as the 7th. infra/relay/ is the relay engineer's (another branch): the script tests
here test it as it is."""

from __future__ import annotations

import base64
import gzip
import lzma
import re
import subprocess
import sys
import zipfile

import pytest

from tests.infra.bicep import INFRA, dotted, load
from tests.infra.relay_bootstrap import (
    ADD_RELAY,
    ADD_RELAY_GZ,
    ARG_ORDER,
    ARGS,
    CLOUD_INIT,
    DEPLOY_DIR,
    PLACEHOLDER,
    PYZ_XZ,
    UNIT,
    checked,
    render,
    replacements,
)

CUSTOM_DATA_LIMIT = 65535  # bytes, once Azure decodes customData's base64 (ARM reference)


def test_every_placeholder_is_filled_by_main_bicep() -> None:
    used = set(PLACEHOLDER.findall(CLOUD_INIT.read_text()))
    assert used == set(replacements()) == {*ARGS, "ADD_RELAY_SCRIPT_B64", "RELAY_PYZ_B64"}


def test_the_script_and_template_are_loaded_from_their_files() -> None:
    main = load("main")
    assert main.variables["cloudInitTemplate"]["function"]["parameters"]["file_path"] == (
        "relay/cloud-init.yaml"
    )
    script = main.variables["addRelayScriptB64"]["function"]
    assert script["type"] == "load_file_as_base64"
    assert script["parameters"]["file_path"] == "relay/add-relay.sh.gz"
    assert replacements()["ADD_RELAY_SCRIPT_B64"] == "addRelayScriptB64"
    # Embedded only without a package URL (the VM then installs the release asset).
    chosen = main.variables["relayPyzB64"]["operator"]
    assert chosen["type"] == "conditional"
    condition = chosen["operands"]["condition"]["function"]
    assert condition == {"type": "empty", "parameters": {"item_to_test": "relayPackageUrl"}}
    pyz = chosen["operands"]["true_value"]["function"]
    assert pyz["type"] == "load_file_as_base64"
    assert pyz["parameters"]["file_path"] == "relay/scheduled-events-relay.pyz.xz"
    assert chosen["operands"]["false_value"] == ""
    assert replacements()["RELAY_PYZ_B64"] == "relayPyzB64"


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
    assert replacements()["RELAY_KEY_SECRET_URI"] == "relayKeyArgument"
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
    assert dotted(replacements()["HEARTBEAT_TABLE_URL"]) == "storage.outputs.livenessTableUrl"
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
    proc = checked(*args)
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


def test_cloud_init_turns_the_probe_on_and_main_bicep_can_turn_it_off() -> None:
    """The example VMs get the probe from cloud-init's 9th argument: relayReadyPort (8493),
    or `off` when it is 0; the 8th is `none` (hook scripts are the operator's)."""
    main = load("main")
    assert main.param_default("relayReadyPort") == 8493
    assert replacements()["READY_PORT"] == "relayReadyArgument"
    assert replacements()["RELAY_HOOKS"] == "none"
    ternary = main.variables["relayReadyArgument"]["operator"]["operands"]
    assert ternary["false_value"] == "off"
    assert ternary["condition"]["operator"]["type"] == "greater_than"
    assert ternary["condition"]["operator"]["operands"]["operand_1"] == "relayReadyPort"


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
