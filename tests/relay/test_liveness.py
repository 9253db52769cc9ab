"""Heartbeats straight into the VM table (relay.liveness): keys, wire, errors, the process.

Against Azurite with a SAS of add + update only (what the relay's identity gets in Azure),
read back through the function app's own Store, so both sides agree on the row.
"""

from __future__ import annotations

import json
import random
import threading
import time
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from functions.store.keys import row_key, vm_partition
from functions.store.tables import Store
from local.azurite import table_sas, table_url
from relay.identity import STORAGE_RESOURCE, ManagedIdentityTokenProvider
from relay.liveness import TableLiveness, http_date, parse_http_date, vm_keys
from relay.models import Envelope, VmRef
from relay.senders import SendError
from relay.settings import SettingsError, load_settings
from tests.conftest import free_port
from tests.relay.conftest import json_files, wait_for

PREFIX = "lv"
TABLE = f"{PREFIX}vms"


@pytest.fixture(scope="module")
def store(azurite: str) -> Store:
    return Store.from_connection_string(azurite, PREFIX).ensure_tables()


def heartbeat(name: str, callback: str | None = "http://10.0.0.4:8787") -> Envelope:
    return Envelope(
        kind="heartbeat",
        vm=VmRef(name=name, callback_url=callback),
        sequence=1,
        observed_at=datetime.now(UTC),
        relay_version="9.9.9",
    )


def writer(azurite: str, permission: str = "au", table: str = TABLE) -> TableLiveness:
    return TableLiveness(table_url(azurite, table), sas=table_sas(table, permission))


# ------------------------------------------------------------------ keys


def test_keys_are_the_function_apps_for_any_name() -> None:
    rng = random.Random(11)
    alphabet = "aZ09-_.'/\\#?% \x00\x1f\x7f\x85éßİ\u2028😀"
    names = ["vm0", "VM0", "O'Brien", "%2F", "", "a" * 600, "%" * 300, "\x01" * 128]
    names += ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 200))) for _ in range(400)]
    for name in names:
        assert vm_keys(name) == (vm_partition(name), row_key(name)), repr(name)


# ------------------------------------------------------------------ against Azurite


@pytest.mark.parametrize("name", ["vm0", "O'Brien/VM#1?%", "ünïcode-vm", "\x01" * 128])
def test_a_heartbeat_lands_in_the_vm_row_the_function_app_reads(
    azurite: str, store: Store, name: str
) -> None:
    before = datetime.now(UTC) - timedelta(seconds=1)
    writer(azurite).write(heartbeat(name))
    vm = store.get_vm(name)
    assert vm is not None and vm.last_seen is not None
    assert before <= vm.last_seen <= datetime.now(UTC) + timedelta(seconds=1)
    assert (vm.callback_url, vm.relay_version, vm.name) == ("http://10.0.0.4:8787", "9.9.9", name)
    silent_after = vm.last_seen + timedelta(seconds=1)
    assert name in {v.name for v in store.vms_due(silent_after)}  # the watchdog's query
    assert name not in {v.name for v in store.vms_due(vm.last_seen - timedelta(seconds=1))}


def test_a_heartbeat_merges_and_never_undoes_what_a_document_wrote(
    azurite: str, store: Store
) -> None:
    from functions.store.records import VmRecord

    def document(rec: VmRecord | None) -> VmRecord:
        rec = rec or VmRecord(name="merge-vm")
        rec.last_sequence, rec.event_ids, rec.scale_set = 7, ["E1"], "ss1"
        return rec

    store.mutate_vm("merge-vm", document)
    writer(azurite).write(heartbeat("merge-vm", callback=None))
    vm = store.get_vm("merge-vm")
    assert vm is not None
    assert (vm.last_sequence, vm.event_ids, vm.scale_set) == (7, ["E1"], "ss1")
    assert vm.relay_version == "9.9.9" and vm.last_seen is not None
    # ... and the ETag moved, so a document's conditional write re-reads (tested in ingest).


def test_a_read_only_credential_is_refused_with_the_reason(azurite: str, store: Store) -> None:
    with pytest.raises(SendError) as caught:
        writer(azurite, permission="r").write(heartbeat("ro-vm"))
    assert caught.value.slow and caught.value.kind == "http-403"
    assert "liveness role" in str(caught.value) and "AuthorizationPermission" in str(caught.value)
    assert store.get_vm("ro-vm") is None


def test_a_missing_table_says_so(azurite: str) -> None:
    with pytest.raises(SendError) as caught:
        writer(azurite, table="lvnosuchtable").write(heartbeat("vm0"))
    assert caught.value.slow and "TableNotFound" in str(caught.value)


# ------------------------------------------------------------------ against a stand-in


class _Answers(BaseHTTPRequestHandler):
    """Answers every PATCH with the next (status, headers) and keeps what it got."""

    script: list[tuple[int, dict[str, str]]] = []
    seen: list[dict[str, Any]] = []

    def do_PATCH(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        type(self).seen.append(
            {
                "path": self.path,
                "headers": {k.lower(): v for k, v in self.headers.items()},
                "entity": json.loads(body),
            }
        )
        status, headers = type(self).script.pop(0) if type(self).script else (204, {})
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def standin() -> Any:
    handler = type("Answers", (_Answers,), {"script": [], "seen": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield handler, f"http://127.0.0.1:{server.server_address[1]}/acct/{TABLE}"
    finally:
        server.shutdown()
        server.server_close()


def test_busy_table_storage_is_retried_honouring_retry_after(standin: Any) -> None:
    handler, url = standin
    handler.script = [(503, {"Retry-After": "7"})]
    with pytest.raises(SendError) as caught:
        TableLiveness(url, sas="sig=x").write(heartbeat("vm0"))
    assert not caught.value.slow and caught.value.retry_after == 7.0


def test_a_vm_clock_off_by_an_hour_is_corrected_at_once(standin: Any) -> None:
    handler, url = standin
    true_now = time.time()
    handler.script = [(204, {"Date": http_date(true_now)})] * 3
    lagging = TableLiveness(url, sas="sig=x", clock=lambda: true_now - 3600)
    lagging.write(heartbeat("vm0"))
    assert len(handler.seen) == 2  # the row is rewritten with the corrected time at once
    written = datetime.fromisoformat(handler.seen[-1]["entity"]["seen"].replace("Z", "+00:00"))
    assert abs(written.timestamp() - true_now) < 2
    assert abs(lagging.skew - 3600) < 2
    lagging.write(heartbeat("vm0"))
    assert len(handler.seen) == 3  # already corrected: one request


def test_the_request_is_an_insert_or_merge_of_plain_columns(standin: Any) -> None:
    handler, url = standin
    TableLiveness(url, sas="?sv=1&sig=abc").write(heartbeat("Vm'1"))
    [got] = handler.seen
    pk, _rk = vm_keys("Vm'1")
    assert got["path"] == f"/acct/{TABLE}(PartitionKey='{pk}',RowKey='vm%27%271')?sv=1&sig=abc"
    assert "if-match" not in got["headers"] and got["headers"]["x-ms-version"] == "2019-02-02"
    assert got["entity"]["seen@odata.type"] == "Edm.DateTime"
    assert set(got["entity"]) == {
        "PartitionKey",
        "RowKey",
        "name",
        "seen",
        "seen@odata.type",
        "callback_url",
        "relay_version",
    }


def test_the_managed_identity_token_is_for_storage(simulator: Any, standin: Any) -> None:
    handler, url = standin
    simulator.sim.add_vm("vm0")
    tokens = ManagedIdentityTokenProvider(simulator.vm_url("vm0"), resource=STORAGE_RESOURCE)
    TableLiveness(url, tokens=tokens).write(heartbeat("vm0"))
    auth = handler.seen[0]["headers"]["authorization"]
    assert auth.startswith("Bearer ")
    import base64

    payload = auth.split()[1].split(".")[1]
    claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    assert claims["aud"] == STORAGE_RESOURCE
    assert "?" not in handler.seen[0]["path"]


def test_http_dates_round_trip() -> None:
    now = float(int(time.time()))
    assert parse_http_date(http_date(now)) == now
    for bad in ("", "yesterday", "Mon, 32 Foo 2026 10:00:00 GMT", "Mon, 01 Jan 26 1:2:3 PST"):
        assert parse_http_date(bad) is None


# ------------------------------------------------------------------ settings


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--heartbeat-table=http://example.com/acct/t1vms"], "loopback"),
        (["--heartbeat-table=https://a.table.core.windows.net/t1vms?sig=x"], "no query"),
        (["--heartbeat-table=https://a.table.core.windows.net/9vms"], "start with a letter"),
        (["--heartbeat-table=https://a.table.core.windows.net/"], "not a table name"),
        (["--heartbeat-table-sas-file=/etc/hostname"], "needs --heartbeat-table"),
    ],
)
def test_bad_heartbeat_table_settings_stop_the_relay(
    tmp_path: Path, args: list[str], message: str
) -> None:
    with pytest.raises(SettingsError, match=message):
        load_settings([f"--forward=file:{tmp_path}", *args])


def test_a_sas_file_without_a_signature_is_refused(tmp_path: Path) -> None:
    sas = tmp_path / "sas"
    sas.write_text("not a sas\n")
    with pytest.raises(SettingsError, match="no sig="):
        load_settings(
            [
                f"--forward=file:{tmp_path}",
                "--heartbeat-table=https://a.table.core.windows.net/t1vms",
                f"--heartbeat-table-sas-file={sas}",
            ]
        )


# ------------------------------------------------------------------ the relay process


def test_the_relay_writes_heartbeats_to_the_table_and_documents_to_its_target(
    azurite: str,
    store: Store,
    simulator: Any,
    relay_process: Any,
    key_file: Path,
    tmp_path: Path,
) -> None:
    sim = simulator.sim
    sim.add_vm("lv-vm1")
    sas = tmp_path / "table.sas"
    sas.write_text(table_sas(TABLE) + "\n")
    inbox = tmp_path / "inbox"
    port = free_port()
    relay = relay_process(
        f"--imds-url={simulator.vm_url('lv-vm1')}",
        f"--state-dir={tmp_path / 'state'}",
        f"--forward=file:{inbox}",
        f"--heartbeat-table={table_url(azurite, TABLE)}",
        f"--heartbeat-table-sas-file={sas}",
        "--heartbeat-interval=1",
        "--poll-interval=0.1",
        f"--callback-listen=127.0.0.1:{port}",
        f"--callback-key-file={key_file}",
    )
    first = wait_for(lambda: store.get_vm("lv-vm1"), timeout=20)
    assert first.callback_url == f"http://127.0.0.1:{port}"
    wait_for(lambda: store.get_vm("lv-vm1").last_seen > first.last_seen, timeout=10)
    sim.play("live-migration", target="lv-vm1")
    wait_for(lambda: any("document" in p.name for p in json_files(inbox)), timeout=20)
    assert not json_files(inbox / "heartbeats")  # no heartbeat went to the documents' target
    assert relay.proc.poll() is None
    lines = [line for line in relay.logs() if line.get("kind") == "heartbeat"]
    assert lines, "the relay logs the heartbeats it wrote"


def test_liveness_columns_a_relay_wrote_are_checked_before_use(azurite: str, store: Store) -> None:
    """The relay writes its row past the envelope's checks: the app calls back only a plain
    http(s) URL and bounds the version it shows."""
    from azure.data.tables import UpdateMode

    pk, rk = vm_keys("forged-vm")
    for url in ("file:///etc/passwd", "http://user@10.0.0.9:8787", "http://10.0.0.9:99999"):
        store.vms.upsert_entity(
            {
                "PartitionKey": pk,
                "RowKey": rk,
                "name": "forged-vm",
                "callback_url": url,
                "relay_version": "v" * 5000,
            },
            mode=UpdateMode.MERGE,
        )
        vm = store.get_vm("forged-vm")
        assert vm is not None and vm.callback_url is None, url
        assert vm.relay_version is not None and len(vm.relay_version) == 100
