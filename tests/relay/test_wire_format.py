"""The wire format held both ways: the relay writes what the function app's model accepts.

The relay (standard library) and the function app (pydantic) each own a definition of the
envelope. The committed JSON Schema is generated from the function app's model; these tests
prove it is current, and that envelopes written by the real relay process validate against
it and parse with the functions' `parse_envelope`: documents (Scheduled, Started, own and
all events) and heartbeats.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema

from functions.model.envelope import parse_envelope
from tests.relay.conftest import json_files, wait_for
from tests.relay.wire_schema import SCHEMA_PATH, render

FAST = ["--poll-interval=0.05", "--heartbeat-interval=1"]


def test_the_committed_schema_is_generated_from_the_model() -> None:
    assert SCHEMA_PATH.read_text(encoding="utf-8") == render(), (
        "functions/model/envelope.schema.json is stale: run "
        ".venv/bin/python -m tests.relay.wire_schema"
    )


def test_relay_output_validates_against_the_schema_and_the_model(
    simulator: Any, relay_process: Any, tmp_path: Path
) -> None:
    sim = simulator.sim
    sim.add_vm("web_1", scale_set="web")
    sim.add_vm("web_2", scale_set="web")
    (tmp_path / "key").write_text("k" * 32)
    outputs = {}
    for name, extra in (("own", []), ("all", ["--forward-all-events"])):
        forward = tmp_path / name
        relay_process(
            f"--imds-url={simulator.vm_url('web_1')}",
            f"--state-dir={tmp_path / name}-state",
            f"--forward=file:{forward}",
            "--callback-listen=127.0.0.1:0",
            "--callback-url=http://10.0.0.4:8492",
            f"--callback-key-file={tmp_path / 'key'}",
            *FAST,
            *extra,
        )
        outputs[name] = forward
    event_id = sim.add_event(event_type="Terminate", resources=["web_1"], notice=600)
    sim.add_event(event_type="Reboot", resources=["web_2"], notice=600)
    sim.start_event(event_id)
    for forward in outputs.values():
        wait_for(lambda f=forward: len(json_files(f / "heartbeats")) >= 1)
        wait_for(lambda f=forward: any('"Started"' in p.read_text() for p in json_files(f)))
    schema = json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))
    validator = jsonschema.Draft202012Validator(schema)
    seen = set()
    for forward in outputs.values():
        for path in json_files(forward) + json_files(forward / "heartbeats"):
            data = json.loads(path.read_text())
            errors = [e.message for e in validator.iter_errors(data)]
            assert not errors, (path.name, errors)
            envelope = parse_envelope(path.read_text())  # the function app's own parser
            assert envelope.vm.name == "web_1"
            assert envelope.vm.callback_url == "http://10.0.0.4:8492"
            assert envelope.vm.subscription_id and envelope.vm.resource_group
            seen.add((envelope.kind, data.get("events")))
            if envelope.kind == "document":
                document = envelope.scheduled_events
                assert document is not None
                statuses = {e.event_status for e in document.events}
                seen.add(("status", frozenset(statuses)))
    assert {("document", "own"), ("document", "all"), ("heartbeat", None)} <= seen
    assert ("status", frozenset({"Started"})) in seen  # NotBefore "" once Started


def test_a_schema_violation_is_caught() -> None:
    """The schema is not vacuous: a wrong kind or a missing VM name fails it."""
    schema = json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))
    validator = jsonschema.Draft202012Validator(schema)
    good = {
        "schema": 1,
        "kind": "document",
        "vm": {"name": "vm0"},
        "sequence": 1,
        "observed_at": "2026-01-01T00:00:00Z",
        "document": {"DocumentIncarnation": 1, "Events": []},
    }
    assert not list(validator.iter_errors(good))
    for bad in (
        {**good, "kind": "gossip"},
        {**good, "vm": {}},
        {**good, "events": "some"},
        {**good, "document": {"Events": []}},
    ):
        assert list(validator.iter_errors(bad)), bad
