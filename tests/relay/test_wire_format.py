"""The wire format held both ways: the relay writes what the function app's model accepts.

The relay (standard library) and the function app (pydantic) each own a definition of the
envelope. The committed JSON Schema is generated from the function app's model; these tests
prove it is current, and that envelopes written by the real relay process validate against
it and parse with the functions' `parse_envelope`: documents (Scheduled, Started, own and
all events) and heartbeats, each with the VM's vmId, the relay's own callback key and IMDS's
attestation (issue 22), and the notice a relay sends for a document it cannot forward.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema

from functions.model.envelope import parse_envelope
from relay.attest import Attester, AttestingSender, binding_nonces
from relay.imds import ImdsClient
from relay.signing import key_id
from tests.relay.conftest import KEY, FixedKeys, json_files, relay_key, vm_id_of, wait_for
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
    outputs = {}
    for name, extra in (("own", []), ("all", ["--forward-all-events"])):
        forward = tmp_path / name
        relay_process(
            f"--imds-url={simulator.vm_url('web_1')}",
            f"--state-dir={tmp_path / name}-state",
            f"--forward=file:{forward}",
            "--callback-listen=127.0.0.1:0",
            "--callback-url=http://10.0.0.4:8492",
            *FAST,
            *extra,
        )
        outputs[name] = forward
    # Both relays up and polling before anything happens (a busy machine starts them late:
    # an event played before a relay's first poll could come and go unseen).
    for forward in outputs.values():
        wait_for(lambda f=forward: len(json_files(f / "heartbeats")) >= 1)
    event_id = sim.add_event(event_type="Terminate", resources=["web_1"], notice=600)
    sim.add_event(event_type="Reboot", resources=["web_2"], notice=600)
    for forward in outputs.values():  # seen Scheduled by each relay, then started
        wait_for(lambda f=forward: any(event_id in p.read_text() for p in json_files(f)))
    sim.start_event(event_id)
    for forward in outputs.values():
        wait_for(lambda f=forward: any('"Started"' in p.read_text() for p in json_files(f)))
    schema = json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))
    validator = jsonschema.Draft202012Validator(schema)
    seen = set()
    for name, forward in outputs.items():
        key = relay_key(tmp_path / f"{name}-state")
        for path in json_files(forward) + json_files(forward / "heartbeats"):
            data = json.loads(path.read_text())
            errors = [e.message for e in validator.iter_errors(data)]
            assert not errors, (path.name, errors)
            envelope = parse_envelope(path.read_text())  # the function app's own parser
            assert envelope.vm.name == "web_1"
            assert envelope.vm.callback_url == "http://10.0.0.4:8492"
            assert envelope.vm.subscription_id and envelope.vm.resource_group
            # Issue 22: Azure's id for the VM, the relay's own key, IMDS's attestation.
            assert envelope.vm.vm_id == vm_id_of("web_1")
            assert envelope.callback_key is not None
            assert (envelope.callback_key.id, envelope.callback_key.secret) == (
                key_id(key),
                key.hex(),
            )
            assert envelope.attestation is not None
            assert envelope.attestation.nonce in binding_nonces(data)
            seen.add((envelope.kind, data.get("events")))
            if envelope.kind == "document":
                document = envelope.scheduled_events
                assert document is not None
                statuses = {e.event_status for e in document.events}
                seen.add(("status", frozenset(statuses)))
    assert {("document", "own"), ("document", "all"), ("heartbeat", None)} <= seen
    assert ("status", frozenset({"Started"})) in seen  # NotBefore "" once Started


def test_an_unforwardable_notice_validates_against_the_schema_and_the_model(
    simulator: Any,
) -> None:
    """Contract §8: what the relay sends instead of a document too large to forward (the
    document over the message limit: its incarnation known; or an IMDS answer over the read
    limit: incarnation null) is a valid, attested envelope of kind `unforwardable`."""
    from datetime import UTC, datetime

    from relay.models import Envelope, VmRef
    from relay.sendbase import Sender

    simulator.sim.add_vm("vm0")
    sent: list[str] = []

    class Recorder(Sender):
        def send(self, envelope: Any, body: str) -> None:
            sent.append(body)

        def describe(self) -> str:
            return "recorder"

    attesting = AttestingSender(
        Recorder(), Attester(ImdsClient(simulator.vm_url("vm0"), timeout=5)), FixedKeys(KEY)
    )
    attesting.max_bytes = 20_000
    vm = VmRef(name="vm0", vm_id=vm_id_of("vm0"), subscription_id="s", resource_group="g")
    now = datetime.now(UTC)
    big = Envelope(
        kind="document",
        vm=vm,
        sequence=3,
        observed_at=now,
        document={"DocumentIncarnation": 2, "Events": [], "Padding": "x" * 30_000},
        relay_version="t",
        events="own",
    )
    attesting.send(big, big.to_json())  # over the message limit: a notice instead
    unreadable = Envelope(
        kind="unforwardable",
        vm=vm,
        sequence=4,
        observed_at=now,
        relay_version="t",
        extra={
            "unforwardable": {
                "incarnation": None,
                "bytes": 70_000,
                "reason": "IMDS answer over the relay's read limit",
            }
        },
    )
    attesting.send(unreadable, unreadable.to_json())
    validator = jsonschema.Draft202012Validator(json.loads(SCHEMA_PATH.read_text("utf-8")))
    assert len(sent) == 2
    for body in sent:
        data = json.loads(body)
        assert not [e.message for e in validator.iter_errors(data)], data
        envelope = parse_envelope(body)
        assert envelope.kind == "unforwardable" and envelope.document is None
        assert envelope.unforwardable is not None and envelope.unforwardable.bytes > 20_000
        assert envelope.attestation is not None
        assert envelope.attestation.nonce == binding_nonces(data)[0]
        assert envelope.callback_key is not None and envelope.callback_key.id == key_id(KEY)
    first, second = (parse_envelope(b).unforwardable for b in sent)
    assert (first.incarnation, second.incarnation) == (2, None)


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
    key = {"id": key_id(KEY), "secret": KEY.hex()}
    identified = {
        **good,
        "vm": {"name": "vm0", "vm_id": vm_id_of("vm0")},
        "callback_key": key,
        "attestation": {"signature": "MIAG", "nonce": "0" * 32},
    }
    assert not list(validator.iter_errors(identified))
    notice = {
        **identified,
        "kind": "unforwardable",
        "document": None,
        "unforwardable": {"incarnation": None, "bytes": 1, "reason": "r"},
    }
    assert not list(validator.iter_errors(notice))
    for bad in (
        {**good, "kind": "gossip"},
        {**good, "vm": {}},
        {**good, "events": "some"},
        {**good, "document": {"Events": []}},
        {**identified, "vm": {"name": "vm0", "vm_id": "not-a-uuid"}},
        {**identified, "callback_key": {**key, "id": "ABC"}},
        {**identified, "callback_key": {"id": key["id"]}},
        {**identified, "attestation": {"signature": "MIAG", "nonce": "0" * 33}},
        {**identified, "attestation": {"nonce": "0" * 32}},
        {**notice, "unforwardable": {"incarnation": None, "bytes": -1}},
        {**notice, "unforwardable": {"reason": "no size"}},
    ):
        assert list(validator.iter_errors(bad)), bad
