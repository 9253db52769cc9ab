"""The shared IMDS document and envelope models."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from functions.model.envelope import (
    DocumentError,
    Envelope,
    parse_document,
    parse_envelope,
    parse_not_before,
)

# The seed's live-migration example: four documents, incarnations 1 to 4.
SEED_LIVE_MIGRATION = [
    {"DocumentIncarnation": 1, "Events": []},
    {
        "DocumentIncarnation": 2,
        "Events": [
            {
                "EventId": "C7061BAC-AFDC-4513-B24B-AA5F13A16123",
                "EventStatus": "Scheduled",
                "EventType": "Freeze",
                "ResourceType": "VirtualMachine",
                "Resources": ["WestNO_0", "WestNO_1"],
                "NotBefore": "Mon, 11 Apr 2022 22:26:58 GMT",
                "Description": "Virtual machine is being paused because of a memory-preserving "
                "Live Migration operation.",
                "EventSource": "Platform",
                "DurationInSeconds": 5,
            }
        ],
    },
    {
        "DocumentIncarnation": 3,
        "Events": [
            {
                "EventId": "C7061BAC-AFDC-4513-B24B-AA5F13A16123",
                "EventStatus": "Started",
                "EventType": "Freeze",
                "ResourceType": "VirtualMachine",
                "Resources": ["WestNO_0", "WestNO_1"],
                "NotBefore": "",
                "Description": "Virtual machine is being paused because of a memory-preserving "
                "Live Migration operation.",
                "EventSource": "Platform",
                "DurationInSeconds": 5,
            }
        ],
    },
    {"DocumentIncarnation": 4, "Events": []},
]


def test_seed_live_migration_replays_through_the_models():
    docs = [parse_document(json.dumps(d)) for d in SEED_LIVE_MIGRATION]
    assert [d.document_incarnation for d in docs] == [1, 2, 3, 4]
    assert docs[0].events == () and docs[3].events == ()
    scheduled, started = docs[1].events[0], docs[2].events[0]
    assert scheduled.event_id == started.event_id
    assert scheduled.is_scheduled and started.is_started
    assert scheduled.not_before == datetime(2022, 4, 11, 22, 26, 58, tzinfo=UTC)
    assert started.not_before is None
    assert scheduled.duration_in_seconds == 5
    assert scheduled.affects("westno_1") and not scheduled.affects("WestNO_2")
    # Written back, the document is what IMDS sent.
    assert docs[1].to_wire() == SEED_LIVE_MIGRATION[1]
    assert docs[2].to_wire() == SEED_LIVE_MIGRATION[2]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Mon, 11 Apr 2022 22:26:58 GMT", datetime(2022, 4, 11, 22, 26, 58, tzinfo=UTC)),
        ("2025-07-01T12:00:00Z", datetime(2025, 7, 1, 12, 0, tzinfo=UTC)),
        ("2025-07-01T14:00:00+02:00", datetime(2025, 7, 1, 12, 0, tzinfo=UTC)),
        ("", None),
        (None, None),
    ],
)
def test_not_before_formats(text, expected):
    assert parse_not_before(text) == expected


def test_not_before_garbage_is_a_clear_error():
    with pytest.raises(DocumentError, match="NotBefore"):
        parse_document(
            {
                "DocumentIncarnation": 1,
                "Events": [
                    {
                        "EventId": "x",
                        "EventStatus": "Scheduled",
                        "EventType": "Reboot",
                        "NotBefore": "next tuesday",
                    }
                ],
            }
        )


def test_unknown_types_and_fields_are_kept():
    raw = {
        "DocumentIncarnation": 7,
        "FutureTopLevel": {"a": 1},
        "Events": [
            {
                "EventId": "e1",
                "EventStatus": "Scheduled",
                "EventType": "HyperFreeze",
                "Resources": ["vm1"],
                "NotBefore": "Mon, 11 Apr 2022 22:26:58 GMT",
                "NewField": [1, 2],
            }
        ],
    }
    doc = parse_document(raw)
    assert doc.events[0].event_type == "HyperFreeze"
    assert doc.to_wire()["FutureTopLevel"] == {"a": 1}
    assert doc.to_wire()["Events"][0]["NewField"] == [1, 2]


@pytest.mark.parametrize(
    "bad",
    [
        b"not json",
        b"[]",
        {"DocumentIncarnation": 1},
        {"DocumentIncarnation": "1", "Events": []},
        {"DocumentIncarnation": 1, "Events": "none"},
        {"DocumentIncarnation": 1, "Events": [{"EventStatus": "Scheduled"}]},
    ],
)
def test_not_a_document_is_one_clear_error(bad):
    with pytest.raises(DocumentError, match="not"):
        parse_document(bad)


def _envelope(**overrides):
    data = {
        "schema": 1,
        "kind": "document",
        "vm": {"name": "WestNO_0", "callback_url": "http://10.0.0.4:8492/"},
        "relay_version": "0.1.0",
        "sequence": 3,
        "observed_at": "2026-11-21T10:00:00Z",
        "document": SEED_LIVE_MIGRATION[1],
    }
    data.update(overrides)
    return data


def test_envelope_round_trip_keeps_the_document_exactly():
    env = parse_envelope(json.dumps(_envelope()))
    assert env.vm.callback_url == "http://10.0.0.4:8492"
    assert env.document == SEED_LIVE_MIGRATION[1]
    again = parse_envelope(env.to_json())
    assert again == env
    assert json.loads(env.to_json())["schema"] == 1
    assert env.scheduled_events.document_incarnation == 2


def test_message_id_dedupes_resends_but_not_changes():
    a = parse_envelope(_envelope(sequence=3))
    b = parse_envelope(_envelope(sequence=9))  # the same document sent again after a restart
    c = parse_envelope(_envelope(document=SEED_LIVE_MIGRATION[2]))
    assert a.message_id() == b.message_id() != c.message_id()
    assert len(a.message_id()) <= 128
    at = datetime(2026, 11, 21, 10, 0, 0, 123000, tzinfo=UTC)
    hb = Envelope(kind="heartbeat", vm={"name": "vm"}, sequence=4, observed_at=at)
    assert hb.message_id() == "vm:hb:20261121T100000.123000"
    # A relay whose sequence restarted (state wiped) still gets its heartbeats through.
    later = Envelope(kind="heartbeat", vm={"name": "vm"}, sequence=4, observed_at=datetime.now(UTC))
    assert later.message_id() != hb.message_id()


@pytest.mark.parametrize(
    "overrides",
    [
        {"schema": 2},
        {"kind": "other"},
        {"document": None},
        {"document": {"Events": []}},
        {"observed_at": "2026-11-21T10:00:00"},
        {"sequence": -1},
        {"vm": {"name": ""}},
        {"vm": {"name": "a", "callback_url": "ftp://x"}},
    ],
)
def test_bad_envelopes_are_rejected_with_a_reason(overrides):
    with pytest.raises(DocumentError, match="not a relay envelope"):
        parse_envelope(_envelope(**overrides))


@pytest.mark.parametrize("text", ["Mon, 01 Jan 0001 00:00:00 GMT", "Sat, 11 Apr 0099 22:26:58 GMT"])
def test_a_year_written_in_four_digits_is_that_year_not_19xx_or_20xx(text: str) -> None:
    """email.utils reads years below 100 as 19xx/20xx even when written in full."""
    from functions.model.envelope import parse_not_before

    with pytest.raises(ValueError, match="outside"):
        parse_not_before(text)
