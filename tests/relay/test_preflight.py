"""`python3 scheduled-events-relay.pyz check`: the preflight, as an operator runs it on a VM.

Against the IMDS simulator, the Service Bus stand-in (which checks the SAS token, the
session and the body like Azure) and Azurite's liveness table, with its settings in a
relay.env as the unit reads them. The message it sends is then given to the app's own
ingest, which admits it (attestation, Resource Graph's facts) and records nothing.
"""

from __future__ import annotations

import json
import subprocess
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from local.azurite import table_sas, table_url
from relay.liveness import liveness_row_keys
from simulator.instance import RESOURCE_GROUP, SUBSCRIPTION_ID
from tests.relay.conftest import relay_command, relay_env, vm_id_of
from tests.relay.servicebus_standin import ServiceBusStandIn

TABLE = "t1preflightliveness"


def run_check(pyz: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        relay_command(pyz, "check", *args),
        capture_output=True,
        text=True,
        timeout=60,
        env=relay_env(),
        cwd=cwd,
    )


@pytest.fixture
def vm_setup(simulator: Any, standin: ServiceBusStandIn, tmp_path: Path) -> tuple[Path, Path]:
    """relay.env as add-relay.sh writes one (forward, SAS, endpoint), and the state dir."""
    simulator.sim.add_vm("pf-vm1")
    conn = tmp_path / "servicebus.conn"
    conn.write_text(standin.connection_string)
    env = tmp_path / "relay.env"
    env.write_text(
        "# written by add-relay.sh\n"
        f"RELAY_FORWARD={standin.forward}\n"
        f'RELAY_SAS_CONNECTION_STRING_FILE="{conn}"\n'
        f"RELAY_SERVICEBUS_ENDPOINT={standin.endpoint}\n"
        f"RELAY_IMDS_URL={simulator.vm_url('pf-vm1')}\n"
    )
    return env, tmp_path / "state"


def test_every_step_passes_and_the_app_admits_the_message_without_recording_it(
    relay_pyz: Path,
    vm_setup: tuple[Path, Path],
    standin: ServiceBusStandIn,
    azurite: str,
    tmp_path: Path,
) -> None:
    from azure.data.tables import TableServiceClient

    table = TableServiceClient.from_connection_string(azurite).create_table_if_not_exists(TABLE)
    sas = tmp_path / "table.sas"
    sas.write_text(table_sas(TABLE) + "\n")
    env, state = vm_setup
    done = run_check(
        relay_pyz,
        f"--env-file={env}",
        f"--state-dir={state}",
        f"--heartbeat-table={table_url(azurite, TABLE)}",
        f"--heartbeat-table-sas-file={sas}",
        "--out",
        str(tmp_path / "doc.json"),
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    steps = [line.split(":")[0] for line in lines if line.startswith(("PASS", "FAIL"))]
    assert steps == [
        "PASS settings",
        "PASS scheduled events",
        "PASS compute metadata",
        "PASS attested document",
        "PASS callback key and sender",
        "PASS service bus",
        "PASS liveness",
    ], done.stdout
    assert lines[-1] == "all checks passed"
    # The attested document, saved as IMDS answered it, with the nonce to check it under.
    saved = json.loads((tmp_path / "doc.json").read_text())
    assert saved["encoding"] == "pkcs7" and saved["signature"]
    # The command the relay prints runs as printed from the repository (issue 33), here
    # against the simulator's CA as the local app trusts it (ATTESTATION_CA_PEM).
    import re
    import sys

    from simulator.identity import test_issuer

    hint = re.search(
        r"on the app's side: (\.venv/bin/python -m functions attestation .*)$", done.stdout, re.M
    )
    assert hint and "check doc.json --nonce " in hint.group(1), done.stdout
    argv = hint.group(1).split()
    assert argv[0] == ".venv/bin/python"
    root = Path(__file__).resolve().parents[2]
    checked = subprocess.run(
        [sys.executable, *argv[1:-3], str(tmp_path / "doc.json"), *argv[-2:], "--offline"],
        cwd=root,
        env={"PATH": "/usr/bin:/bin", "ATTESTATION_CA_PEM": test_issuer().root_pem},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert json.loads(checked.stdout)["ok"] is True
    # One preflight message on the documents queue, attested, in the VM's session.
    vm_id = vm_id_of("pf-vm1")
    (message,) = standin.messages
    assert message.properties["SessionId"] == vm_id
    body = message.envelope
    assert body["kind"] == "preflight" and body["vm"]["vm_id"] == vm_id
    assert body["attestation"]["signature"] and body["callback_key"]["id"]
    # The liveness row, signed with the service's key (made in its state directory).
    key = json.loads((state / "callback-key.json").read_text())["current"]
    row = table.get_entity(*liveness_row_keys(bytes.fromhex(key["secret"])))  # issue 27 layout
    assert row["key_id"] == key["id"]

    # The app admits it (Azure's signature, Resource Graph's facts) and records nothing.
    from functions.identity.facts import VmFacts
    from functions.pipeline.ingest import ingest_message
    from functions.store.state import Store
    from tests import identity_harness
    from tests.functions.conftest import FakeClock, make_pipeline

    store = Store.from_connection_string(azurite, "tpf" + vm_id[:8]).ensure_tables()
    clock = FakeClock(datetime.now(UTC))
    pipeline, publisher = make_pipeline(store, clock)
    identity_harness.RESOLVER.register(
        VmFacts(
            vm_id=vm_id,
            name="pf-vm1",
            resource_id=f"/subscriptions/{SUBSCRIPTION_ID}/resourceGroups/{RESOURCE_GROUP}"
            "/providers/Microsoft.Compute/virtualMachines/pf-vm1",
            subscription_id=SUBSCRIPTION_ID,
            resource_group=RESOURCE_GROUP,
            fetched_at=clock.now(),
        )
    )
    result = ingest_message(message.body, pipeline)
    assert (result.outcome, result.vm) == ("preflight", "pf-vm1"), result.reason
    assert store.get_vm("pf-vm1") is None and list(store.rejected_rows()) == []
    assert publisher.published == []


def test_a_missing_send_right_fails_its_step_and_says_which_right(
    relay_pyz: Path, vm_setup: tuple[Path, Path], standin: ServiceBusStandIn, tmp_path: Path
) -> None:
    env, state = vm_setup
    standin.fail(403, count=None)
    done = run_check(relay_pyz, "--env-file", str(env), f"--state-dir={state}", cwd=tmp_path)
    assert done.returncode == 1, done.stdout
    fail = [line for line in done.stdout.splitlines() if line.startswith("FAIL")]
    assert fail[0].startswith("FAIL service bus: 403 forbidden")
    assert "'Azure Service Bus Data Sender' on the queue" in fail[0]
    assert "PASS attested document" in done.stdout
    assert standin.messages == []
    assert done.stdout.splitlines()[-1] == f"{len(fail)} check(s) failed"


def test_a_refused_token_says_so(
    relay_pyz: Path, vm_setup: tuple[Path, Path], standin: ServiceBusStandIn, tmp_path: Path
) -> None:
    env, state = vm_setup
    conn = tmp_path / "servicebus.conn"
    conn.write_text(standin.connection_string.replace(standin.key, "d3Jvbmcta2V5"))
    done = run_check(relay_pyz, "--env-file", str(env), f"--state-dir={state}", cwd=tmp_path)
    assert done.returncode == 1
    assert "FAIL service bus: 401 unauthorized" in done.stdout
    assert "Service Bus Data Sender" in done.stdout


def test_without_imds_every_imds_step_fails_and_nothing_is_sent(
    relay_pyz: Path, vm_setup: tuple[Path, Path], standin: ServiceBusStandIn, tmp_path: Path
) -> None:
    env, state = vm_setup
    done = run_check(
        relay_pyz,
        "--env-file",
        str(env),
        f"--state-dir={state}",
        "--imds-url=http://127.0.0.1:9",
        "--imds-timeout=0.5",
        cwd=tmp_path,
    )
    assert done.returncode == 1
    for step in ("scheduled events", "compute metadata", "attested document"):
        assert f"FAIL {step}:" in done.stdout
    assert standin.messages == []


def test_bad_settings_exit_2_with_one_line(relay_pyz: Path, tmp_path: Path) -> None:
    done = run_check(relay_pyz, "--env-file", str(tmp_path / "missing.env"), cwd=tmp_path)
    assert done.returncode == 2
    assert done.stdout.startswith("FAIL settings:")


def test_the_relays_help_names_the_check(relay_pyz: Path, tmp_path: Path) -> None:
    done = subprocess.run(
        relay_command(relay_pyz, "--help"), capture_output=True, text=True, env=relay_env()
    )
    assert done.returncode == 0 and "check [--env-file relay.env]" in " ".join(done.stdout.split())
