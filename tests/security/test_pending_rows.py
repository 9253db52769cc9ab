"""A pending-document row is swept once its VM's later document is acknowledged (issue 46,
finding 7c), and only by that VM.

A relay writes a pending row before each document (contract §11) and names the rows in
its documents (`acks`); the app deletes the named rows. A document that never reached the
app (dead-lettered after Service Bus took it) whose relay was then killed left its row for
good: the restarted relay named only its new document. Heartbeats take sequences too, so
the app cannot find that row by its number; the relay keeps the rows it named in its state
directory and names them again after a restart.

The relay is the real one, as `relay` builds it (relay.senders.build_sender: the file
target for Service Bus, its own SAS of add and update on the liveness table, its own key
and IMDS attestation), with its real outbox; the app is the security fleet's (admission,
ingest) on Azurite. On main before this change the lost document's row stayed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from local.azurite import table_sas, table_url
from relay.attest import Attester
from relay.liveness import pending_row_keys
from relay.models import Envelope, VmRef
from relay.outbox import Outbox
from relay.senders import SendLoop, build_sender
from relay.settings import load_settings
from tests.security.conftest import Fleet, Vm


@dataclass
class Relay:
    """One run of a VM's relay: its outbox and sender on the VM's state directory. A new
    one on the same directory is the relay restarted after a kill."""

    vm: Vm
    inbox: Path
    loop: SendLoop

    @classmethod
    def start(cls, fleet: Fleet, vm: Vm, azurite: str, tmp_path: Path) -> Relay:
        table = fleet.store.liveness.table.table_name
        sas = tmp_path / f"{vm.name}.sas"
        sas.write_text(table_sas(table, permission="au") + "\n")
        inbox = tmp_path / f"{vm.name}-queue"
        settings = load_settings(
            [
                f"--forward=file:{inbox}",
                f"--state-dir={vm.state}",
                f"--heartbeat-table={table_url(azurite, table)}",
                f"--heartbeat-table-sas-file={sas}",
            ]
        )
        sender = build_sender(settings, keys=vm.keys, attester=Attester(vm.imds))
        return cls(vm, inbox, SendLoop(Outbox(vm.state), sender))

    def _send(self, kind: str, document: dict | None) -> int:
        envelope = Envelope(
            kind=kind,
            vm=VmRef(name=self.vm.name, vm_id=self.vm.vm_id),
            sequence=0,  # the outbox stamps it
            observed_at=datetime.now(UTC),
            document=document,
            events=None if document is None else "own",
        )
        message = self.loop.outbox.append(envelope)
        assert message is not None
        sent = self.loop.outbox.oldest()
        assert sent == message
        self.loop.send_one(sent)
        return message.sequence

    def heartbeat(self) -> int:
        return self._send("heartbeat", None)

    def document(self) -> tuple[int, str]:
        """Send an (empty) document: its sequence and the body Service Bus took."""
        sequence = self._send("document", {"DocumentIncarnation": 1, "Events": []})
        [path] = self.inbox.glob(f"{sequence:012d}-*-document.json")
        body = path.read_text()
        path.unlink()  # taken off the queue: delivered by the caller, or lost
        return sequence, body


def pending(fleet: Fleet, vm: Vm, sequence: int) -> bool:
    row = pending_row_keys(vm.keys.current_key().secret, sequence)[1]
    return any(r["RowKey"] == row for r in fleet.store.liveness.table.list_entities())


def test_a_lost_documents_row_goes_with_the_next_acknowledged_document(
    fleet: Fleet, azurite: str, tmp_path: Path
) -> None:
    victim = fleet.vms["victim"]
    relay = Relay.start(fleet, victim, azurite, tmp_path)
    relay.heartbeat()
    first, body = relay.document()
    assert json.loads(body)["acks"] == [first]  # the common path: one row, one delete
    assert fleet.deliver(body).outcome == "processed"
    assert not pending(fleet, victim, first)
    relay.heartbeat()  # its probe finds the row gone: nothing more is named
    lost, body = relay.document()  # Service Bus took it; it was dead-lettered
    assert json.loads(body)["acks"] == [lost] and pending(fleet, victim, lost)
    relay.heartbeat()
    # Killed before it sent the document again; restarted on the same state directory.
    relay = Relay.start(fleet, victim, azurite, tmp_path)
    relay.heartbeat()
    later, body = relay.document()
    assert later > lost + 1  # heartbeats took the numbers between: nothing says which
    assert fleet.deliver(body).outcome == "processed"
    assert not pending(fleet, victim, lost)  # on main: left behind for good
    assert not pending(fleet, victim, later)
    assert json.loads(body)["acks"] == [lost, later]  # two deletes, none on the common path
    relay.heartbeat()
    _, body = relay.document()
    assert len(json.loads(body)["acks"]) == 1  # all acknowledged: only its own again


def test_another_vms_document_cannot_delete_this_vms_rows(
    fleet: Fleet, azurite: str, tmp_path: Path
) -> None:
    victim, attacker = fleet.vms["victim"], fleet.vms["attacker"]
    relay = Relay.start(fleet, victim, azurite, tmp_path)
    relay.heartbeat()
    lost, _ = relay.document()  # never delivered
    assert pending(fleet, victim, lost)
    # The attacker's own relay, restarted, and a compromised one naming the victim's
    # sequences outright: its document's rows are under its own key, whatever it names.
    hostile = Relay.start(fleet, attacker, azurite, tmp_path)
    hostile.heartbeat()
    _, body = hostile.document()
    assert lost in json.loads(body)["acks"]
    assert fleet.deliver(body).outcome == "processed"
    named = attacker.message([], acks=list(range(max(lost - 3, 0), lost + 5)))
    assert fleet.deliver(named).outcome == "processed"
    assert pending(fleet, victim, lost)
