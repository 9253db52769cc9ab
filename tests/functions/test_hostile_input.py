"""Hostile and broken messages on the documents queue: each is either processed or
rejected with its reason (and completed), never left to fail every redelivery; the VM's
next valid message always goes through. Against Azurite and local relays."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest

from functions.model.envelope import MAX_DESCRIPTION_CHARS
from functions.pipeline.ingest import ingest_message
from functions.pipeline.publish import LocalPublisher
from functions.pipeline.watchdog import run_watchdog
from functions.store.keys import _escape, row_key
from tests.functions.conftest import T0, envelope, event, make_pipeline


def rejected(store) -> list[dict]:
    return sorted(store.rejected_rows(), key=lambda r: r["RowKey"])


def raw(vm: str, sequence: int, events: list[dict], **fields) -> str:
    data = json.loads(envelope(vm, sequence, events, **fields))
    return json.dumps(data)


@pytest.mark.parametrize(
    "not_before",
    ["0001-01-01T00:00:00+01:00", "Fri, 31 Dec 9999 23:59:59 -2359", "1900-01-01T00:00:00Z"],
)
def test_not_before_out_of_range_is_rejected_and_the_next_document_is_approved(
    store, clock, relay, not_before
):
    pipeline, pub = make_pipeline(store, clock)
    bad = {**event("EV-O", source="User"), "NotBefore": not_before}
    body = raw("vm1", 1, [bad], callback_url=relay.url)
    result = ingest_message(body, pipeline, message_id="m-bad")
    assert result.outcome == "rejected"
    assert "Events.0.NotBefore" in result.reason
    assert "out of range" in result.reason or "outside 1970..8999" in result.reason
    (row,) = rejected(store)
    assert row["message_id"] == "m-bad" and row["reason"] == result.reason
    assert json.loads(row["body"])["vm"]["name"] == "vm1"
    assert store.get_event("EV-O") is None and store.get_vm("vm1") is None
    assert relay.requests == [] and pub.published == []
    # The same event, now with a sane NotBefore, in the VM's next document: approved.
    good = envelope("vm1", 2, [event("EV-O", source="User")], callback_url=relay.url)
    result = ingest_message(good, pipeline)
    assert result.outcome == "processed"
    assert [a.outcome for a in result.approvals] == ["approved"]
    assert pub.transitions("EV-O") == ["scheduled", "decided", "approved"]
    assert relay.starts() == ["EV-O"]


def test_observed_at_out_of_range_is_rejected(store, clock):
    pipeline, _ = make_pipeline(store, clock)
    body = json.loads(envelope("vm1", 1, [event("EV-T")]))
    body["observed_at"] = "0001-01-01T00:00:00+01:00"
    result = ingest_message(json.dumps(body), pipeline, message_id="m-t")
    assert result.outcome == "rejected" and "observed_at" in result.reason
    assert [r["message_id"] for r in rejected(store)] == ["m-t"]
    assert ingest_message(envelope("vm1", 2, [event("EV-T")]), pipeline).outcome == "processed"
    assert store.get_vm("vm1").last_sequence == 2


def test_names_with_del_and_c1_controls_work_and_never_share_a_row(store, clock, new_relay):
    pipeline, _ = make_pipeline(store, clock)
    names = ["web\x7f1", "web\x851", "web\x9f1", "web1", "web%7F1", "web\x001"]
    relays = {name: new_relay() for name in names}
    for name in names:
        body = envelope(
            name,
            1,
            [event(f"EV-{name}", source="User", resources=(name,))],
            callback_url=relays[name].url,
        )
        result = ingest_message(body, pipeline)
        assert result.outcome == "processed", result.reason
        assert [a.outcome for a in result.approvals] == ["approved"]
    assert len({row_key(name) for name in names}) == len(names)
    for name in names:  # each its own row, holding its own name and relay
        vm = store.get_vm(name)
        assert vm.name == name and vm.callback_url == relays[name].url
        assert relays[name].starts() == [f"EV-{name}"]
    assert len(store.list_vms()) == len(names)
    assert rejected(store) == []
    # and their later documents go through as well
    for name in names:
        assert ingest_message(envelope(name, 2, []), pipeline).outcome == "processed"
        assert store.get_event(f"EV-{name}").ended == "completed"


def test_every_character_is_escaped_alike_with_or_without_the_fast_path():
    """Keys of names with no character to escape skip the per-character pass: the result
    must be what that pass would give, for every character around the escaped ranges."""
    for code in [*range(0x2FF), 0xD800, 0xFFFF, 0x1F600]:
        name = f"vm{chr(code)}x"
        expected = "".join(_escape(ch) for ch in name.casefold())
        assert row_key(name) == expected, hex(code)


def test_a_40_kb_description_is_shortened_with_a_marker(store, clock):
    pipeline, pub = make_pipeline(store, clock)
    long = {**event("EV-D"), "Description": "ü" * 40_000}
    result = ingest_message(envelope("vm1", 1, [long]), pipeline)
    assert result.outcome == "processed"
    stored = store.get_event("EV-D").description
    assert stored.startswith("ü" * MAX_DESCRIPTION_CHARS)
    assert stored.endswith(f"[truncated: {40_000 - MAX_DESCRIPTION_CHARS} more characters]")
    assert pub.published[1].event.description == stored
    assert ingest_message(envelope("vm1", 2, []), pipeline).outcome == "processed"


def test_a_thousand_events_are_rejected_with_the_reason(store, clock):
    pipeline, pub = make_pipeline(store, clock)
    many = [event(f"EV-{i:04}") for i in range(1000)]
    result = ingest_message(envelope("vm1", 1, many), pipeline, message_id="m-many")
    assert result.outcome == "rejected"
    assert "Events" in result.reason and "at most 100" in result.reason
    assert store.get_vm("vm1") is None and pub.published == []
    (row,) = rejected(store)
    assert row["message_id"] == "m-many" and len(row["body"]) <= 30000
    assert ingest_message(envelope("vm1", 2, [event("EV-1")]), pipeline).outcome == "processed"
    assert pub.transitions("EV-1") == ["scheduled", "decided"]


def test_1000_resources_of_128_characters_fit_the_event_row(store, clock):
    """At the envelope's bounds (1000 resources of 128 characters): the event row is split
    over several properties (functions.store.rows), so it is processed."""
    pipeline, _ = make_pipeline(store, clock)
    names = ("vm1", *(f"{i:04}" + "n" * 124 for i in range(999)))
    big = event("EV-BIG", resources=names)
    result = ingest_message(envelope("vm1", 1, [big]), pipeline, message_id="m-big")
    assert result.outcome == "processed"
    assert len(store.get_event("EV-BIG").resources) == 1000


def test_a_row_table_storage_refuses_is_rejected_not_redelivered(store, clock, monkeypatch):
    """Should a row still be refused (400: here, as if the split were left out), the
    message is rejected with that reason, not redelivered."""
    from functions.store import rows as tables

    monkeypatch.setattr(tables, "CHUNK_CHARS", 1_000_000)  # one property of 130 K units
    pipeline, _ = make_pipeline(store, clock)
    names = ("vm1", *(f"{i:04}" + "n" * 124 for i in range(999)))
    big = event("EV-BIG", resources=names)
    result = ingest_message(envelope("vm1", 1, [big]), pipeline, message_id="m-big")
    assert result.outcome == "rejected" and result.vm == "vm1"
    assert result.reason.startswith("Table storage refused a row for this message")
    assert [r["message_id"] for r in rejected(store)] == ["m-big"]
    assert store.get_event("EV-BIG") is None
    ok = ingest_message(envelope("vm1", 2, [event("EV-2")]), pipeline)
    assert ok.outcome == "processed" and store.get_vm("vm1").last_sequence == 2


def test_rejected_body_of_astral_text_fits_the_row(store, clock):
    pipeline, _ = make_pipeline(store, clock)
    body = '{"schema": 1, "kind": "nonsense", "pad": "' + "😀" * 40_000 + '"}'
    result = ingest_message(body, pipeline, message_id="m-astral")
    assert result.outcome == "rejected"
    (row,) = rejected(store)
    assert len(row["body"].encode("utf-16-le")) <= 60000


def test_a_not_before_beyond_the_horizon_is_rejected_with_the_reason(store, clock):
    """No Azure maintenance is announced years ahead; such a NotBefore would hold a set's
    capacity slot for as long (MAX_NOT_BEFORE_DAYS, 7 by default). Within it: processed."""
    pipeline, pub = make_pipeline(store, clock)
    far = event("EV-FAR", not_before=T0 + timedelta(days=365 * 100))
    result = ingest_message(envelope("vm1", 1, [far]), pipeline)
    assert result.outcome == "rejected" and "MAX_NOT_BEFORE_DAYS" in result.reason
    assert store.get_event("EV-FAR") is None
    near = event("EV-NEAR", not_before=T0 + timedelta(days=6))
    assert ingest_message(envelope("vm1", 2, [near]), pipeline).outcome == "processed"
    assert pub.transitions("EV-NEAR") == ["scheduled", "decided"]


class FailsOn(LocalPublisher):
    """A topic that fails once for one transition (say, a throttled send)."""

    def __init__(self, transition: str) -> None:
        super().__init__()
        self.transition = transition

    def publish(self, notification) -> None:
        if notification.transition.value == self.transition and self.transition:
            self.transition = ""
            raise ConnectionError("topic unreachable")
        super().publish(notification)


def test_a_fault_after_the_vm_row_is_saved_is_repaired_by_the_redelivery(store, clock, relay):
    """The approval is recorded even though its announcement failed; the redelivery (stale
    for the VM row) reconciles the event from its row and announces it; nothing twice."""
    pipeline, _ = make_pipeline(store, clock)
    pipeline.publisher = topic = FailsOn("approved")
    body = envelope("vm1", 1, [event("EV-A", source="User")], callback_url=relay.url)
    result = ingest_message(body, pipeline)
    assert result.outcome == "processed" and result.approvals[0].outcome == "approved"
    assert relay.starts() == ["EV-A"] and store.get_event("EV-A").approval == "approved"
    assert "approved" not in store.get_event("EV-A").announced  # not published: still due
    redelivered = ingest_message(body, pipeline)
    assert redelivered.outcome == "stale" and ("EV-A", "approved") in redelivered.transitions
    assert run_watchdog(pipeline).republished == []
    assert topic.transitions("EV-A") == ["scheduled", "decided", "approved"]
    assert relay.starts() == ["EV-A"]
    assert run_watchdog(pipeline).republished == []
    assert relay.starts() == ["EV-A"]  # approved once
    nxt = ingest_message(envelope("vm1", 2, [], callback_url=relay.url), pipeline)
    assert nxt.outcome == "processed"
