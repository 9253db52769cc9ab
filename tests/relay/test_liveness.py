"""Heartbeats into the liveness table (contract §5): signed rows of untrusted hints.

Against a loopback Table storage stand-in (requests recorded) and Azurite (a real row).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
import time
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from local.azurite import table_sas, table_url
from relay.identity import STORAGE_RESOURCE, ManagedIdentityTokenProvider
from relay.liveness import (
    TableLiveness,
    http_date,
    liveness_keys,
    liveness_row_keys,
)
from relay.models import Envelope, VmRef, parse_http_date
from relay.senders import SendError
from relay.settings import SettingsError, load_settings
from tests.relay.conftest import KEY, FixedKeys, json_files, vm_id_of, wait_for

TABLE = "lvliveness"
VM_ID = vm_id_of("vm0")


def heartbeat(vm_id: str = VM_ID, version: str = "9.9.9") -> Envelope:
    return Envelope(
        kind="heartbeat",
        vm=VmRef(name="vm0", vm_id=vm_id),
        sequence=1,
        observed_at=datetime.now(UTC),
        relay_version=version,
    )


def liveness(url: str, **kwargs: Any) -> TableLiveness:
    kwargs.setdefault("sas", "sig=x")
    return TableLiveness(url, keys=FixedKeys(KEY), **kwargs)


def test_keys_are_the_contracts() -> None:
    for vm_id in (VM_ID, VM_ID.upper(), "00000000-0000-0000-0000-000000000000"):
        bucket = int(hashlib.sha256(vm_id.lower().encode()).hexdigest()[:8], 16) % 8
        assert liveness_keys(vm_id) == (f"lv{bucket:02d}", vm_id.lower())


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
        liveness(url).write(heartbeat())
    assert not caught.value.slow and caught.value.retry_after == 7.0


def test_a_vm_clock_off_by_an_hour_is_corrected_at_once(standin: Any) -> None:
    handler, url = standin
    true_now = time.time()
    handler.script = [(204, {"Date": http_date(true_now)})] * 3
    lagging = liveness(url, clock=lambda: true_now - 3600)
    lagging.write(heartbeat())
    assert len(handler.seen) == 2  # the row is rewritten with the corrected time at once
    written = datetime.fromisoformat(handler.seen[-1]["entity"]["seen"].replace("Z", "+00:00"))
    assert abs(written.timestamp() - true_now) < 2
    assert abs(lagging.skew - 3600) < 2
    lagging.write(heartbeat())
    assert len(handler.seen) == 3  # already corrected: one request


def test_the_request_is_an_insert_or_merge_of_a_signed_row(standin: Any) -> None:
    handler, url = standin
    now = 1_800_000_000.4
    handler.script = [(204, {"Date": http_date(now)})]  # clocks agree: one request
    facts = lambda: (1_799_999_990, "hook,readiness")  # noqa: E731
    liveness(url, sas="?sv=1&sig=abc", clock=lambda: now, facts=facts).write(
        heartbeat(version="v" * 80)
    )
    [got] = handler.seen
    # The row's keys come from the callback key alone: another VM cannot find or write it.
    rk = hmac.new(KEY, b"liveness-row/v1", hashlib.sha256).hexdigest()
    pk = f"lv{int(rk[:8], 16) % 8:02d}"
    assert liveness_row_keys(KEY) == (pk, rk) and rk != VM_ID
    assert got["path"] == f"/acct/{TABLE}(PartitionKey='{pk}',RowKey='{rk}')?sv=1&sig=abc"
    assert "if-match" not in got["headers"] and got["headers"]["x-ms-version"] == "2019-02-02"
    version = "v" * 64
    # Contract 2 (issue 44): probe_at and drain are columns, and signed with the rest.
    message = f"liveness/v2\n{VM_ID}\n1800000000\n{version}\n2\n1799999990\nhook,readiness"
    assert got["entity"] == {
        "PartitionKey": pk,
        "RowKey": rk,
        "vm_id": VM_ID,
        "seen": "2027-01-15T08:00:00Z",
        "seen@odata.type": "Edm.DateTime",
        "at": "1800000000",
        "at@odata.type": "Edm.Int64",
        "relay_version": version,
        "key_id": hashlib.sha256(KEY).hexdigest()[:16],
        "contract": 2,
        "probe_at": "1799999990",
        "probe_at@odata.type": "Edm.Int64",
        "drain": "hook,readiness",
        "sig": hmac.new(KEY, message.encode(), hashlib.sha256).hexdigest(),
    }


def test_within_a_day_of_a_rotation_the_previous_keys_row_is_written_too(standin: Any) -> None:
    """An app that has not learnt the new key yet still sees this relay alive (its row
    under the previous key stays fresh); each row is signed with its own key."""
    handler, url = standin
    now = 1_800_000_000.0
    previous = bytes.fromhex("ab" * 32)
    handler.script = [(204, {"Date": http_date(now)})] * 2
    TableLiveness(url, sas="sv=1", keys=FixedKeys(KEY, previous), clock=lambda: now).write(
        heartbeat()
    )
    rows = [seen["entity"] for seen in handler.seen]
    assert [r["RowKey"] for r in rows] == [
        liveness_row_keys(KEY)[1],
        liveness_row_keys(previous)[1],
    ]
    assert [r["key_id"] for r in rows] == [
        hashlib.sha256(KEY).hexdigest()[:16],
        hashlib.sha256(previous).hexdigest()[:16],
    ]
    message = f"liveness/v2\n{VM_ID}\n1800000000\n9.9.9\n2\n0\n".encode()
    assert rows[1]["sig"] == hmac.new(previous, message, hashlib.sha256).hexdigest()


def test_a_heartbeat_without_a_vm_id_is_not_written(standin: Any) -> None:
    handler, url = standin
    with pytest.raises(SendError, match="no vmId"):
        liveness(url).send(heartbeat(vm_id=None), "{}")  # type: ignore[arg-type]
    assert handler.seen == []


def test_the_managed_identity_token_is_for_storage(simulator: Any, standin: Any) -> None:
    handler, url = standin
    simulator.sim.add_vm("vm0")
    tokens = ManagedIdentityTokenProvider(simulator.vm_url("vm0"), resource=STORAGE_RESOURCE)
    TableLiveness(url, tokens=tokens, keys=FixedKeys(KEY)).write(heartbeat())
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
        (["--heartbeat-table=http://example.com/acct/t1liveness"], "loopback"),
        (["--heartbeat-table=https://a.table.core.windows.net/t1liveness?sig=x"], "no query"),
        (["--heartbeat-table=https://a.table.core.windows.net/9liveness"], "start with a letter"),
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
                "--heartbeat-table=https://a.table.core.windows.net/t1liveness",
                f"--heartbeat-table-sas-file={sas}",
            ]
        )


# ------------------------------------------------------------------ the relay process


def test_the_relay_writes_signed_heartbeats_to_the_table_and_documents_to_its_target(
    azurite: str, simulator: Any, relay_process: Any, tmp_path: Path
) -> None:
    from azure.data.tables import TableServiceClient

    service = TableServiceClient.from_connection_string(azurite)
    table = service.create_table_if_not_exists(TABLE)
    sim = simulator.sim
    sim.add_vm("lv-vm1")
    vm_id = vm_id_of("lv-vm1")
    sas = tmp_path / "table.sas"
    sas.write_text(table_sas(TABLE) + "\n")
    inbox, state = tmp_path / "inbox", tmp_path / "state"
    relay = relay_process(
        f"--imds-url={simulator.vm_url('lv-vm1')}",
        f"--state-dir={state}",
        f"--forward=file:{inbox}",
        f"--heartbeat-table={table_url(azurite, TABLE)}",
        f"--heartbeat-table-sas-file={sas}",
        "--heartbeat-interval=1",
        "--poll-interval=0.1",
    )

    def at_value(value: Any) -> int:
        return int(getattr(value, "value", value))

    def at(entity: Any) -> int:
        return at_value(entity["at"])

    def current_secret() -> bytes | None:
        try:
            return bytes.fromhex(
                json.loads((state / "callback-key.json").read_text())["current"]["secret"]
            )
        except (OSError, ValueError, KeyError):
            return None

    def row() -> Any:
        key = current_secret()
        try:
            return table.get_entity(*liveness_row_keys(key)) if key else None
        except Exception:
            return None

    first = wait_for(row, timeout=20)
    secret = current_secret()
    assert secret is not None and first["vm_id"] == vm_id
    assert (first["contract"], at_value(first["probe_at"]), first["drain"]) == (2, 0, "")
    v2 = f"liveness/v2\n{vm_id}\n{at(first)}\n{first['relay_version']}\n2\n0\n"
    message = v2.encode()
    assert first["sig"] == hmac.new(secret, message, hashlib.sha256).hexdigest()
    assert first["key_id"] == hashlib.sha256(secret).hexdigest()[:16]
    wait_for(lambda: at(row()) > at(first), timeout=10)
    sim.play("live-migration", target="lv-vm1")
    wait_for(lambda: any("document" in p.name for p in json_files(inbox)), timeout=20)
    assert not json_files(inbox / "heartbeats")  # no heartbeat went to the documents' target
    assert relay.proc.poll() is None
