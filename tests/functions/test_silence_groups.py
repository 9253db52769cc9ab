"""Silence paged per common cause (issue 44 item 4): relays of many VMs gone silent at once
(an NSG change, a bad relay build) are one announcement and one PagerDuty incident per
scale set, listing them, not one per VM. On 2f59d6a, 60 silent relays in one scale set made
60 `relay_silent` announcements, 60 PagerDuty triggers and 60 incidents (dedup_key
`relay-silent:<vm>`). The PagerDuty bodies are checked against PagerDuty's Events API v2
OpenAPI description (tests.conformance). Azurite."""

from __future__ import annotations

from datetime import timedelta

import jsonschema
import pytest

from functions.model.event import Transition
from functions.notify import pagerduty
from functions.pipeline.ingest import ingest_message
from functions.pipeline.watchdog import run_watchdog
from functions.store.state import Store
from tests.conformance.test_pagerduty_schema import REQUEST
from tests.functions.conftest import FakeClock, envelope, make_pipeline, write_liveness

pytestmark = pytest.mark.azurite

SILENT = 60  # relays of one scale set gone silent in the same minutes
OTHER = 3  # and some in another set


def silent_notes(pub) -> list:
    return [n for n in pub.published if n.transition is Transition.RELAY_SILENT]


def test_relays_silent_together_page_once_per_scale_set(store: Store, clock: FakeClock) -> None:
    pipeline, pub = make_pipeline(store, clock)
    fleet = [(f"web_{i}", "web") for i in range(SILENT)] + [(f"db_{i}", "db") for i in range(OTHER)]
    fleet.append(("lonely", ""))  # in no scale set: its subscription's group, of one
    for seq, (name, scale_set) in enumerate(fleet, start=1):
        ingest_message(envelope(name, seq, [], scale_set=scale_set or None), pipeline)
        write_liveness(store, name, clock.now())
    clock.advance(11 * 60)
    report = run_watchdog(pipeline)
    assert sorted(report.silent) == sorted(name for name, _ in fleet)
    notes = silent_notes(pub)
    assert len(notes) == 3, [n.detail[:80] for n in notes]
    by_group = {n.silent_group or n.vm: n for n in notes}
    web = next(n for n in notes if n.silent_label == "scale set web")
    assert web.silent_count == SILENT and len(web.silent_vms) == SILENT
    assert set(web.silent_vms) == {f"web_{i}" for i in range(SILENT)}
    assert web.vm is None and web.page is True
    assert f"relays of {SILENT} VMs in scale set web went silent together" in web.detail
    assert "and 10 more" in web.detail  # 50 named in the text, every one in silent_vms
    db = next(n for n in notes if n.silent_label == "scale set db")
    assert db.silent_count == OTHER
    assert by_group["lonely"].vm == "lonely" and by_group["lonely"].silent_group is None

    # PagerDuty: one incident per group, valid Events v2 bodies.
    bodies = [pagerduty.build_event(n, "R" * 32) for n in notes]
    keys = sorted(b["dedup_key"] for b in bodies if b)
    assert len(keys) == 3 and len(set(keys)) == 3
    assert any(k.startswith("relay-silent-group:vmss:") and k.endswith("/web") for k in keys)
    assert "relay-silent:lonely" in keys
    for body in bodies:
        assert body is not None and body["event_action"] == "trigger"
        # PagerDuty's own request schema (/enqueue; the same as the project's pinned
        # PagerDuty/api-schema@5cd58ff transcription in tests/conformance).
        jsonschema.validate(body, REQUEST, format_checker=jsonschema.FormatChecker())
    web_body = pagerduty.build_event(web, "R" * 32)
    assert web_body is not None
    assert web_body["payload"]["custom_details"]["silent_count"] == SILENT
    assert web_body["payload"]["summary"].startswith(f"Relays of {SILENT} VMs in scale set web")

    # Announced once: the next sweep announces nothing again.
    assert run_watchdog(pipeline).silent == []
    assert len(silent_notes(pub)) == 3


def test_a_straggler_of_the_group_joins_its_incident(store: Store, clock: FakeClock) -> None:
    """Relays heartbeat at their own phase, so a common cause is found over a few sweeps:
    each sweep's group announcement carries the same dedup_key, one incident."""
    pipeline, pub = make_pipeline(store, clock)
    names = [f"web_{i}" for i in range(6)]
    for seq, name in enumerate(names, start=1):
        ingest_message(envelope(name, seq, [], scale_set="web"), pipeline)
    for name in names[:3]:
        write_liveness(store, name, clock.now())
    clock.advance(60)
    for name in names[3:]:
        write_liveness(store, name, clock.now())
    clock.advance(10 * 60 - 30)  # the first three are silent now (over 10 min)
    assert len(run_watchdog(pipeline).silent) == 3
    clock.advance(60)  # and the other three
    assert len(run_watchdog(pipeline).silent) == 3
    notes = silent_notes(pub)
    assert len(notes) == 2 and {n.silent_count for n in notes} == {3}
    assert notes[0].message_id() != notes[1].message_id()  # two announcements
    keys = {pagerduty.dedup_key(n) for n in notes}
    assert len(keys) == 1  # one incident


def test_a_failed_announcement_releases_every_claim_of_its_group(
    store: Store, clock: FakeClock
) -> None:
    pipeline, pub = make_pipeline(store, clock)
    for seq, name in enumerate(("web_0", "web_1"), start=1):
        ingest_message(envelope(name, seq, [], scale_set="web"), pipeline)
        write_liveness(store, name, clock.now())
    clock.advance(11 * 60)
    real = pipeline.publisher.publish

    def down(note) -> None:
        if note.transition is Transition.RELAY_SILENT:
            raise ConnectionError("Service Bus unreachable")
        real(note)

    pipeline.publisher.publish = down  # type: ignore[method-assign]
    assert run_watchdog(pipeline).silent == []
    pipeline.publisher.publish = real  # type: ignore[method-assign]
    clock.advance(60)
    assert sorted(run_watchdog(pipeline).silent) == ["web_0", "web_1"]
    (note,) = silent_notes(pub)
    assert note.silent_count == 2
    clock.advance(timedelta(minutes=1).total_seconds())
    assert run_watchdog(pipeline).silent == []
