"""A document can always come back (issue 40, contract §11): the relay sends its latest
document again while the app has not deleted the document's pending row.

Against Azurite (real rows, the relay's own SAS of add and update only) with a recording
document target; the app's half is functions/store/acks.py, called here as ingest calls it.
On 2cd3d60 a document was sent once: nothing here existed.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from azure.data.tables import TableServiceClient

from functions.model.envelope import parse_envelope as app_envelope
from functions.store.acks import acknowledge
from functions.store.acks import pending_row_keys as app_row_keys
from local.azurite import table_sas, table_url
from relay.keystore import CallbackKey
from relay.liveness import ACKS_FILE, SplitSender, TableLiveness, pending_row_keys
from relay.models import Envelope, VmRef
from relay.sendbase import Sender, SendError
from tests.relay.conftest import KEY, FixedKeys, json_files, vm_id_of, wait_for

TABLE = "acksliveness"
VM = VmRef(name="vm0", vm_id=vm_id_of("vm0"))
OTHER_KEY = bytes.fromhex("7a" * 32)


class Recorded(Sender):
    """The documents' target (Service Bus, a directory): what was sent, or a failure."""

    def __init__(self) -> None:
        self.sent: list[tuple[Envelope, str]] = []
        self.down = False

    def send(self, envelope: Envelope, body: str) -> None:
        if self.down:
            raise SendError("connection", "cannot reach Service Bus")
        self.sent.append((envelope, body))

    def describe(self) -> str:
        return "recorded"


@pytest.fixture
def table(azurite: str) -> Any:
    service = TableServiceClient.from_connection_string(azurite)
    service.delete_table(TABLE)
    return service.create_table(TABLE)


@pytest.fixture
def relay(azurite: str, table: Any) -> SplitSender:
    liveness = TableLiveness(
        table_url(azurite, TABLE), sas=table_sas(TABLE, permission="au"), keys=FixedKeys(KEY)
    )
    return SplitSender(Recorded(), liveness)


def document(sequence: int, events: list[dict[str, Any]] | None = None) -> Envelope:
    key = CallbackKey(KEY, 0)
    return Envelope(
        kind="document",
        vm=VM,
        sequence=sequence,
        observed_at=datetime(2026, 11, 28, 12, 0, sequence, tzinfo=UTC),
        document={"DocumentIncarnation": sequence, "Events": events or []},
        events="own",
        extra={"callback_key": {"id": key.id, "secret": KEY.hex()}},
    )


def heartbeat() -> Envelope:
    return Envelope(kind="heartbeat", vm=VM, sequence=0, observed_at=datetime.now(UTC))


def beat(relay: SplitSender, times: int = 1) -> None:
    for _ in range(times):
        relay.send(heartbeat(), heartbeat().to_json())


def sent(relay: SplitSender) -> list[tuple[Envelope, str]]:
    documents = relay.documents
    assert isinstance(documents, Recorded)
    return documents.sent


def pending(table: Any, sequence: int, key: bytes = KEY) -> bool:
    return any(row["RowKey"] == pending_row_keys(key, sequence)[1] for row in table.list_entities())


def test_the_relay_and_the_app_agree_on_the_pending_row() -> None:
    assert pending_row_keys(KEY, 12) == app_row_keys(KEY, 12)
    assert pending_row_keys(KEY, 12) != pending_row_keys(KEY, 13)
    assert pending_row_keys(KEY, 12) != pending_row_keys(OTHER_KEY, 12)
    assert pending_row_keys(KEY, 12)[0].startswith("ak")


def test_a_document_no_one_acknowledges_comes_back_ever_less_often(relay, table) -> None:
    relay.send(document(5), document(5).to_json())
    assert pending(table, 5)  # written before the document went
    [(first, body)] = sent(relay)
    assert json.loads(body)["acks"] == [5] and first.extra["acks"] == [5]
    resends = []
    for heartbeat_number in range(1, 40):
        before = len(sent(relay))
        beat(relay)
        if len(sent(relay)) > before:
            resends.append(heartbeat_number)
    # After 2, 4, 8 heartbeats, then every 12: a lost document costs a few messages, and
    # the first heartbeat, which may come before the app processed it, sends nothing.
    assert resends == [2, 6, 14, 26, 38]
    again = [envelope for envelope, _ in sent(relay)[1:]]
    assert [e.extra["resent"] for e in again] == [1, 2, 3, 4, 5]
    for envelope in again:  # the same document, as the relay saw it when it changed
        assert (envelope.sequence, envelope.observed_at) == (5, first.observed_at)
        assert envelope.document == first.document and envelope.extra["acks"] == [5]
    ids = [e.message_id() for e, _ in sent(relay)]
    assert len(set(ids)) == len(ids)  # Service Bus's duplicate detection drops none
    assert ids[1].endswith(":r5.1") and ids[1].startswith(ids[0])
    # The app's model reads the same MessageId from the body.
    assert [app_envelope(body).message_id() for _, body in sent(relay)] == ids


def test_once_the_app_deletes_the_row_the_document_is_not_sent_again(relay, table) -> None:
    relay.send(document(5), document(5).to_json())
    [(_, body)] = sent(relay)
    assert acknowledge(table, KEY, app_envelope(body).acks or []) == 1  # one delete
    assert not pending(table, 5)
    beat(relay, 20)
    assert len(sent(relay)) == 1 and relay.last is None and relay.acks == []


def test_a_document_names_the_earlier_ones_not_yet_acknowledged(relay, table) -> None:
    relay.send(document(5), document(5).to_json())
    relay.send(document(7), document(7).to_json())  # 5 was lost, say: never acknowledged
    [_, (latest, body)] = sent(relay)
    assert latest.extra["acks"] == [5, 7]
    acknowledge(table, KEY, app_envelope(body).acks or [])
    assert not pending(table, 5) and not pending(table, 7)  # no row left behind
    beat(relay)
    relay.send(document(9), document(9).to_json())
    assert sent(relay)[-1][0].extra["acks"] == [9]
    # Redelivered by the outbox (the send failed after the row was written): named once.
    relay.send(document(9), document(9).to_json())
    assert sent(relay)[-1][0].extra["acks"] == [9]


def test_at_most_eight_rows_are_named(relay) -> None:
    for sequence in range(1, 21):
        relay.send(document(sequence), document(sequence).to_json())
    assert sent(relay)[-1][0].extra["acks"] == list(range(13, 21))


def test_a_row_that_could_not_be_written_is_never_taken_for_an_acknowledgement(
    azurite, table
) -> None:
    liveness = TableLiveness(
        "http://127.0.0.1:9/devstoreaccount1/nowhere",  # Table storage unreachable
        sas=table_sas(TABLE, permission="au"),
        keys=FixedKeys(KEY),
        timeout=2,
    )
    relay = SplitSender(Recorded(), liveness)
    relay.send(document(5), document(5).to_json())
    assert len(sent(relay)) == 1 and not relay.marked  # the document still went
    liveness.table_url = table_url(azurite, TABLE)  # storage is back
    beat(relay)  # writes the row instead of probing a row that never was
    assert pending(table, 5) and len(sent(relay)) == 1
    beat(relay, 2)
    assert len(sent(relay)) == 2  # not acknowledged: it comes back


def test_storage_or_the_queue_down_at_a_heartbeat_is_tried_at_the_next(relay, table) -> None:
    relay.send(document(5), document(5).to_json())
    relay.documents.down = True  # type: ignore[attr-defined]
    beat(relay, 2)
    assert len(sent(relay)) == 1 and relay.last is not None  # kept, not given up
    relay.documents.down = False  # type: ignore[attr-defined]
    beat(relay)
    assert len(sent(relay)) == 2


def test_a_rotated_key_starts_afresh(relay, table) -> None:
    relay.send(document(5), document(5).to_json())
    liveness = relay.heartbeats
    assert isinstance(liveness, TableLiveness)
    liveness.keys = FixedKeys(OTHER_KEY, KEY)
    relay.send(document(6), document(6).to_json())  # the watcher resends on a rotation
    assert sent(relay)[-1][0].extra["acks"] == [6]
    assert pending(table, 6, OTHER_KEY)


def restarted(relay: SplitSender, state: Path) -> SplitSender:
    """The relay killed and started again on its state directory: nothing in memory."""
    return SplitSender(Recorded(), relay.heartbeats, state=state)


def test_a_restarted_relay_names_the_rows_of_before(relay, table, tmp_path) -> None:
    """Issue 46: a document the app never had, its relay killed, left its row for good."""
    relay = restarted(relay, tmp_path)
    relay.send(document(5), document(5).to_json())  # lost: the app never has it
    relay = restarted(relay, tmp_path)
    relay.send(document(9), document(9).to_json())
    [(latest, body)] = sent(relay)
    assert latest.extra["acks"] == [5, 9]
    acknowledge(table, KEY, app_envelope(body).acks or [])
    assert not pending(table, 5) and not pending(table, 9)
    beat(relay)  # the row is gone: acknowledged, and so kept as nothing
    assert json.loads((tmp_path / ACKS_FILE).read_text())["acks"] == []
    relay = restarted(relay, tmp_path)
    relay.send(document(12), document(12).to_json())
    assert sent(relay)[-1][0].extra["acks"] == [12]  # the common path: its own row only


def test_rows_kept_under_a_key_rotated_out_meanwhile_are_not_named(relay, table, tmp_path):
    relay = restarted(relay, tmp_path)
    relay.send(document(5), document(5).to_json())
    relay = restarted(relay, tmp_path)
    liveness = relay.heartbeats
    assert isinstance(liveness, TableLiveness)
    liveness.keys = FixedKeys(OTHER_KEY, KEY)
    relay.send(document(6), document(6).to_json())
    assert sent(relay)[-1][0].extra["acks"] == [6]  # 5's row is under the old key


def test_a_damaged_or_unwritable_file_names_none_and_sends_all_the_same(
    relay, table, tmp_path
) -> None:
    kept = {"key": CallbackKey(KEY, 0).id, "acks": [1, "2"]}  # not a sequence: damaged
    (tmp_path / ACKS_FILE).write_text(json.dumps(kept))
    relay = restarted(relay, tmp_path)
    relay.send(document(5), document(5).to_json())
    assert sent(relay)[-1][0].extra["acks"] == [5] and pending(table, 5)
    relay = restarted(relay, tmp_path / "nowhere")  # a directory that is not there
    relay.send(document(6), document(6).to_json())
    assert sent(relay)[-1][0].extra["acks"] == [6] and pending(table, 6)


def test_heartbeats_and_other_messages_are_unchanged(relay, table) -> None:
    beat(relay, 3)
    assert sent(relay) == [] and relay.last is None
    notice = document(4).replace(kind="unforwardable", document=None)
    relay.send(notice, notice.to_json())
    assert sent(relay)[0][0] is notice and "acks" not in notice.extra


def test_the_relay_process_sends_its_document_again_until_the_app_deletes_the_row(
    azurite: str, table: Any, simulator: Any, relay_process: Any, tmp_path: Path
) -> None:
    """The zipapp, as a VM runs it (on Python 3.9 too, `make test-py39`)."""
    simulator.sim.add_vm("ack-vm1")
    sas = tmp_path / "table.sas"
    sas.write_text(table_sas(TABLE, permission="au") + "\n")
    inbox, state = tmp_path / "inbox", tmp_path / "state"
    relay_process(
        f"--imds-url={simulator.vm_url('ack-vm1')}",
        f"--state-dir={state}",
        f"--forward=file:{inbox}",
        f"--heartbeat-table={table_url(azurite, TABLE)}",
        f"--heartbeat-table-sas-file={sas}",
        "--heartbeat-interval=1",
        "--poll-interval=0.1",
    )

    def first_document() -> Any:
        files = [p for p in json_files(inbox) if p.name.endswith("-document.json")]
        return json.loads(files[0].read_text()) if files else None

    document = wait_for(first_document, timeout=20)
    sequence = document["sequence"]
    assert document["acks"] == [sequence] and "resent" not in document
    secret = bytes.fromhex(document["callback_key"]["secret"])
    assert wait_for(lambda: pending(table, sequence, secret))
    # No app deletes the row: the same document is written again (same sequence, so the
    # same file), now marked as sent again.
    again = wait_for(lambda: (first_document() or {}).get("resent") == 1 and first_document())
    assert (
        again["observed_at"] == document["observed_at"]
        and again["document"] == document["document"]
    )
    acknowledge(table, secret, again["acks"])  # what ingest does once it has it

    def last_beat() -> int:
        """The newest heartbeat's time (its liveness row's `at`, whole seconds): heartbeats,
        not the wall clock, say how often the relay has looked since (a busy machine slows
        the relay; a sleep would then check nothing)."""
        rows = table.query_entities("relay_version ne ''")
        return max((int(getattr(row["at"], "value", row["at"])) for row in rows), default=0)

    acked = last_beat()
    wait_for(lambda: last_beat() >= acked + 2, timeout=60)  # one may already have been probing
    settled = first_document()
    wait_for(lambda: last_beat() >= acked + 6, timeout=60)  # four more heartbeats
    assert first_document() == settled  # nothing sent again once the row is gone
