"""A local user's key never speaks for the VM while its relay's anchor key does (issue 46).

Any process on a VM, root or not, can get attested documents from IMDS, so a local user can
have the app store a callback key of its own (it becomes the row's current key; the relay's
proven key, the anchor, is kept beside it: tests/security/test_key_rotation.py). If it also
holds the callback port (the relay restarting: any port above 1024 is anyone's), the app's
callbacks signed with that key are its to verify and answer. So while the anchor's relay
heartbeats, callbacks are signed with the anchor alone, and the local user's liveness rows
do not speak for the VM; only once the anchor's relay has been silent for
RELAY_SILENT_AFTER_SECONDS (a reimaged VM) does its new key take over.

The squatter is a real HTTP server on the victim's callback address and port that checks
signatures with the relay's own code (relay.signing.verify_v2) under the local user's key.
The relays' heartbeats are written by the relay's own code (relay.liveness.TableLiveness).
"""

from __future__ import annotations

import errno
import json
import threading
import time
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from functions.approvers.relay import PREVIOUS_KEY_NOTE
from functions.identity.registry import CachedResolver, IdentityStore
from functions.pipeline.admission import Admission
from functions.pipeline.context import Pipeline
from functions.pipeline.liveness_verifier import RegistryVerifier
from functions.pipeline.watchdog import run_watchdog
from functions.store.liveness import row_keys_for
from functions.store.state import Store
from relay.callback import CallbackApp, CallbackServer
from relay.keystore import KeyStore
from relay.signing import verify_v2
from tests.security.conftest import APP_SECRET, Fleet, Vm
from tests.security.test_key_rotation import identity, local_user, new_key
from tests.security.test_liveness_rows import heartbeat_row_of, keep_alive_at
from tests.security.test_one_vm import imds_event, user_event
from tests.security.test_state import Later
from tests.tablecount import TableCounter

pytestmark = pytest.mark.azurite


class Squatter:
    """The local user's server on the VM's callback port: it can verify only what is
    signed with the local user's own key, and answers that with a fake approval."""

    def __init__(self, keys: KeyStore, vm_id: str, address: str, port: int) -> None:
        self.key_ids: list[str] = []
        self.verified = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                headers = dict(self.headers.items())
                outer.key_ids.append(headers.get("X-Relay-Key-Id", ""))
                try:
                    verify_v2(keys.keys(), vm_id, headers, "POST", self.path, body)
                except Exception:
                    self._answer(401, {"error": "bad signature"})
                    return
                outer.verified += 1
                ids = json.loads(body).get("EventIds", [])
                self._answer(200, {"imds_status": 200, "results": dict.fromkeys(ids, "approved")})

            def _answer(self, status: int, answer: dict) -> None:
                data = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = bind(address, port, Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def bind(address: str, port: int, handler: type[BaseHTTPRequestHandler]) -> ThreadingHTTPServer:
    """The port the relay just let go (it may take a moment to be free again)."""
    deadline = time.monotonic() + 5
    while True:
        try:
            return ThreadingHTTPServer((address, port), handler)
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE or time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def stop_relay(vm: Vm) -> None:
    if vm.callback is not None:
        vm.callback.stop()
        vm.callback = None


def start_relay(fleet: Fleet, vm: Vm) -> CallbackApp:
    """The VM's relay (started again, or a reimaged VM's new one) on the callback port."""
    stop_relay(vm)
    app = CallbackApp(vm.keys, vm.vm_id, vm.name, vm.imds)
    deadline = time.monotonic() + 5
    while True:
        try:
            vm.callback = CallbackServer(f"{vm.address}:{fleet.port}", app, poll_interval=0.05)
            vm.callback.start()
            return app
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE or time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def enrolled_local_user(fleet: Fleet, tmp_path: Path, azurite: str) -> tuple[Vm, str]:
    """The victim's relay enrolled and heartbeating under its key (the anchor), then a local
    user's key made the row's current one. Returns the local user and the anchor's id."""
    victim = fleet.vms["victim"]
    assert fleet.deliver(victim.message([])).outcome == "processed"
    heartbeat_row_of(fleet, victim, azurite)
    anchor = victim.keys.current_key().id
    local = local_user(fleet, tmp_path / "local-user")
    assert fleet.deliver(local.message([])).outcome == "processed"
    stored = identity(fleet)
    assert stored.current_key is not None
    assert stored.current_key.key_id == local.keys.current_key().id
    assert stored.anchor == anchor  # the relay's key, kept beside the local user's
    victim.sequence = local.sequence
    return local, anchor


def test_a_squatter_with_the_local_users_key_cannot_verify_or_answer_the_callbacks(
    fleet: Fleet, tmp_path: Path, azurite: str
):
    victim = fleet.vms["victim"]
    local, anchor = enrolled_local_user(fleet, tmp_path, azurite)
    stop_relay(victim)  # the relay restarting: the local user takes the port
    squatter = Squatter(local.keys, victim.vm_id, victim.address, fleet.port)
    try:
        event_id, events = user_event(fleet, "victim")
        fleet.deliver(victim.message(events))
    finally:
        squatter.close()

    assert squatter.key_ids, "the approver never called the VM"
    assert set(squatter.key_ids) == {anchor}, squatter.key_ids  # signed with the anchor only
    assert squatter.verified == 0
    record = fleet.store.get_event(event_id)
    assert record.approval != "approved", record.approval_attempts
    assert imds_event(fleet, "victim", event_id)["EventStatus"] == "Scheduled"

    # Legitimate: the relay back on its port approves at the first request, by its anchor.
    app = start_relay(fleet, victim)
    event_id, events = user_event(fleet, "victim")
    fleet.deliver(victim.message(events))
    record = fleet.store.get_event(event_id)
    assert record.approval == "approved" and record.approved_by == "victim"
    assert app.key_matches == {"current": 1, "previous": 0}
    assert all(PREVIOUS_KEY_NOTE not in a.outcome for a in record.approval_attempts)
    assert imds_event(fleet, "victim", event_id)["EventStatus"] == "Started"


def test_a_reimaged_vm_gets_its_callbacks_with_its_new_key(fleet: Fleet, azurite: str):
    victim = fleet.vms["victim"]
    assert fleet.deliver(victim.message([])).outcome == "processed"
    anchor = victim.keys.current_key()
    silent_after = fleet.pipeline.settings.relay_silent_after_seconds
    # The old relay's last heartbeat, longer ago than RELAY_SILENT_AFTER_SECONDS; then the
    # VM is reimaged: a new key file without the old one (nothing to prove a rotation by).
    keep_alive_at(fleet.store, victim, datetime.now(UTC) - timedelta(seconds=silent_after + 60))
    new_key(victim)
    app = start_relay(fleet, victim)
    heartbeat_row_of(fleet, victim, azurite)  # the new relay heartbeats under its new key
    assert fleet.deliver(victim.message([])).outcome == "processed"
    stored = identity(fleet)
    assert stored.anchor == anchor.id != stored.keys[0].key_id

    event_id, events = user_event(fleet, "victim")
    fleet.deliver(victim.message(events))

    record = fleet.store.get_event(event_id)
    assert record.approval == "approved" and record.approved_by == "victim"
    assert app.key_matches == {"current": 1, "previous": 0}  # its new key, at the first try
    assert all(PREVIOUS_KEY_NOTE not in a.outcome for a in record.approval_attempts)
    # Its liveness is its new key's row, and the old key's stale row does not make it
    # silent, an hour on without a document either: the watchdog deletes it as superseded.
    verify = RegistryVerifier(fleet.pipeline.admission.registry)
    hint = fleet.store.liveness.get(victim.vm_id, verify, lambda _: None)
    assert hint is not None and hint.current
    assert hint.row == row_keys_for(victim.keys.current_key().secret)[1]
    fleet.pipeline.clock = Later(hours=1)
    fleet.store.liveness.table.delete_entity(*row_keys_for(victim.keys.current_key().secret))
    keep_alive_at(fleet.store, victim, fleet.pipeline.clock.now())  # (a contract-1 row)
    report = run_watchdog(fleet.pipeline)
    assert "victim" not in report.silent, report
    rows = {row["RowKey"] for row in fleet.store.liveness.table.list_entities()}
    assert row_keys_for(anchor.secret)[1] not in rows


def test_the_local_users_liveness_row_does_not_speak_for_the_vm(
    fleet: Fleet, tmp_path: Path, azurite: str
):
    victim = fleet.vms["victim"]
    local, _ = enrolled_local_user(fleet, tmp_path, azurite)
    # The local user holds the relays' table right too: its row, signed with its own key,
    # written after the relay's last heartbeat.
    heartbeat_row_of(fleet, local, azurite)
    verify = RegistryVerifier(fleet.pipeline.admission.registry)

    hint = fleet.store.liveness.get(victim.vm_id, verify, lambda _: None)

    assert hint is not None and hint.current
    assert hint.row == row_keys_for(victim.keys.current_key().secret)[1]  # the anchor's
    # A stale row of the local user's, while the anchor's is fresh: superseded (deleted),
    # never the VM's silence.
    keep_alive_at(fleet.store, local, datetime.now(UTC) - timedelta(hours=1))
    report = run_watchdog(fleet.pipeline)
    assert "victim" not in report.silent, report
    rows = {row["RowKey"] for row in fleet.store.liveness.table.list_entities()}
    assert row_keys_for(local.keys.current_key().secret)[1] not in rows
    assert row_keys_for(victim.keys.current_key().secret)[1] in rows


def test_the_callback_lookup_costs_one_read_unless_an_unproven_key_is_held(
    fleet: Fleet, tmp_path: Path, azurite: str
):
    """The steady case (the anchor is the current key) reads the identities row alone, as
    before; only a row holding an unproven key adds the anchor's liveness row."""
    victim = fleet.vms["victim"]
    assert fleet.deliver(victim.message([])).outcome == "processed"
    heartbeat_row_of(fleet, victim, azurite)
    with TableCounter(azurite) as counter:
        counted = _counted_pipeline(fleet, counter)
        counter.reset()
        found = counted.relay_identity(victim.vm_id)
        assert found is not None and [k.key_id for k in found[0].keys] == [
            victim.keys.current_key().id
        ]
        assert counter.total() == 1, counter.counts()

        local = local_user(fleet, tmp_path / "local-user")
        assert fleet.deliver(local.message([])).outcome == "processed"
        counter.reset()
        found = counted.relay_identity(victim.vm_id)
        assert found is not None and [k.key_id for k in found[0].keys] == [
            victim.keys.current_key().id
        ]
        assert counter.total() == 2, counter.counts()  # and the anchor's liveness row


def test_a_flagged_vm_costs_no_read_of_its_anchors_liveness_row(
    fleet: Fleet, tmp_path: Path, azurite: str
):
    """A VM whose relay is not to be asked (`unstarted`, in its identity row) is passed
    over on its identity row alone: the anchor's liveness row, read only to choose between
    an unproven key and the anchor, is not read for a relay that will not be called."""
    from functions.pipeline.relay_phase import _relays
    from functions.store.records import EventRecord

    victim = fleet.vms["victim"]
    assert fleet.deliver(victim.message([])).outcome == "processed"
    heartbeat_row_of(fleet, victim, azurite)
    local = local_user(fleet, tmp_path / "local-user")
    assert fleet.deliver(local.message([])).outcome == "processed"
    assert identity(fleet).unproven_current  # the anchor's liveness row would decide
    now = datetime.now(UTC)
    record = EventRecord(
        event_id="EV-FLAG",
        event_type="Reboot",
        event_status="Scheduled",
        resources=[victim.name],
        first_seen=now,
    )
    with TableCounter(azurite) as counter:
        counted = _counted_pipeline(fleet, counter)
        counter.reset()
        assert [a.name for a in _relays(counted, record, now, set())] == [victim.name]
        assert _liveness_reads(counter), counter.counts()  # unflagged: read

        fleet.pipeline.admission.registry.mutate(
            victim.vm_id,
            lambda i: i.model_copy(update={"unstarted": "EV-OTHER", "unstarted_at": now}),
        )
        counter.reset()
        assert _relays(counted, record, now, set()) == []
        assert not _liveness_reads(counter), counter.counts()
        assert counter.total() == 2, counter.counts()  # its VM row and its identity row


def _counted_pipeline(fleet: Fleet, counter: TableCounter) -> Pipeline:
    """The fleet's pipeline with its Table requests (its identity rows' too) counted."""
    store = Store.from_connection_string(counter.connection_string, fleet.store.prefix)
    registry = IdentityStore.from_service(store.service, APP_SECRET, store.prefix)
    admission = fleet.pipeline.admission
    return Pipeline(
        store,
        fleet.pipeline.settings,
        fleet.publisher,
        fleet.pipeline.session,
        fleet.pipeline.clock,
        admission=Admission(
            verifier=admission.verifier,
            identities=CachedResolver(registry, admission.identities.upstream),
            callback_port=admission.callback_port,
        ),
    )


def _liveness_reads(counter: TableCounter) -> int:
    return sum(n for (_, table), n in counter.counts().items() if "liveness" in table)
