"""The outbox: durable, ordered, sequence never reused, bounded without losing documents."""

from __future__ import annotations

import logging
import shutil
from datetime import UTC, datetime
from pathlib import Path

import pytest

from relay.models import Envelope, VmRef, parse_envelope
from relay.outbox import Outbox, OutboxError
from relay.senders import FileSender, SendLoop

VM = VmRef(name="vm0")


def document(incarnation: int) -> Envelope:
    return Envelope(
        kind="document",
        vm=VM,
        sequence=0,
        observed_at=datetime.now(UTC),
        document={"DocumentIncarnation": incarnation, "Events": []},
    )


def heartbeat() -> Envelope:
    return Envelope(kind="heartbeat", vm=VM, sequence=0, observed_at=datetime.now(UTC))


def test_names_sort_in_send_order_and_the_sequence_survives_a_restart(tmp_path: Path) -> None:
    outbox = Outbox(tmp_path)
    for incarnation in range(1, 12):
        outbox.append(document(incarnation))
    names = sorted(p.name for p in outbox.directory.iterdir())
    incarnations = [
        parse_envelope((outbox.directory / n).read_text()).document["DocumentIncarnation"]
        for n in names
    ]
    assert incarnations == list(range(1, 12))
    while (message := outbox.oldest()) is not None:
        outbox.remove(message)
    assert len(Outbox(tmp_path)) == 0
    reopened = Outbox(tmp_path)
    assert reopened.append(document(12)).sequence == 12


def test_a_restart_finds_pending_messages_and_discards_half_writes(tmp_path: Path) -> None:
    outbox = Outbox(tmp_path)
    outbox.append(document(1))
    outbox.append(document(2))
    (outbox.directory / ".tmp-000000000003-document.json").write_text('{"half')
    (tmp_path / "sequence").unlink()  # even without it, sequences never go back
    reopened = Outbox(tmp_path)
    assert [m.sequence for m in reopened._messages] == [1, 2]
    assert not list(reopened.directory.glob(".tmp-*"))
    assert reopened.append(document(3)).sequence == 3


def test_a_new_heartbeat_replaces_a_pending_one(tmp_path: Path) -> None:
    outbox = Outbox(tmp_path)
    outbox.append(heartbeat())
    outbox.append(document(1))
    outbox.append(heartbeat())
    assert [(m.sequence, m.kind) for m in outbox._messages] == [(2, "document"), (3, "heartbeat")]


def test_when_full_heartbeats_go_first_and_documents_are_kept_loudly(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    outbox = Outbox(tmp_path, max_messages=10)
    for incarnation in range(1, 10):
        outbox.append(document(incarnation))
    outbox.append(heartbeat())
    assert outbox.counts() == {"documents": 9, "heartbeats": 1}
    with caplog.at_level(logging.WARNING, logger="relay.outbox"):
        outbox.append(document(10))  # over the bound: the heartbeat makes room, loudly
        assert outbox.counts() == {"documents": 10, "heartbeats": 0}
        assert outbox.append(heartbeat()) is None
        for incarnation in range(11, 25):
            outbox.append(document(incarnation))
    assert outbox.counts() == {"documents": 24, "heartbeats": 0}
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    # Logged when crossing the bound and at each doubling, not once per document.
    assert [r.fields["documents"] for r in errors] == [10, 20]
    assert any("heartbeat not queued" in r.getMessage() for r in caplog.records)


def test_a_failed_write_raises_and_keeps_nothing_half_done(tmp_path: Path) -> None:
    outbox = Outbox(tmp_path)
    outbox.append(document(1))
    shutil.rmtree(outbox.directory)
    with pytest.raises(OutboxError, match="cannot write"):
        outbox.append(document(2))
    assert outbox.sequence == 1
    outbox.directory.mkdir()
    assert outbox.append(document(2)).sequence == 2


def test_an_unreadable_message_is_moved_aside_not_sent_nor_deleted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    outbox = Outbox(tmp_path)
    outbox.append(document(1))
    bad = outbox.append(document(2))
    outbox.append(document(3))
    bad.path.write_text('{"schema": 1, "kind": "document"}')
    forward = tmp_path / "forward"
    loop = SendLoop(outbox, FileSender(forward))
    with caplog.at_level(logging.ERROR, logger="relay.outbox"):
        for _ in range(3):
            message = outbox.oldest()
            assert message is not None
            loop.send_one(message)
    assert len(outbox) == 0
    assert (outbox.rejected / bad.path.name).exists()
    assert len(list(forward.iterdir())) == 2
    assert "moved aside" in caplog.text
