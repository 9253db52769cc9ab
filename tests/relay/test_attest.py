"""Attestation at send time (contract §1) against the IMDS simulator's attested documents."""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime
from typing import Any

import pytest
from asn1crypto import cms

from relay.attest import Attester, AttestingSender, binding_nonces, canonical
from relay.imds import ImdsClient
from relay.models import Envelope, VmRef
from relay.sendbase import Sender, SendError
from relay.signing import sha256
from tests.relay.conftest import KEY, FixedKeys, vm_id_of


class Recorder(Sender):
    def __init__(self) -> None:
        self.sent: list[tuple[Envelope, str]] = []

    def send(self, envelope: Envelope, body: str) -> None:
        self.sent.append((envelope, body))

    def describe(self) -> str:
        return "recorder"


def document_envelope() -> Envelope:
    return Envelope(
        kind="document",
        vm=VmRef(name="vm0", vm_id=vm_id_of("vm0")),
        sequence=3,
        observed_at=datetime.now(UTC),
        document={"DocumentIncarnation": 2, "Events": []},
        relay_version="t",
        events="own",
    )


def signed_content(signature: str) -> dict[str, Any]:
    info = cms.ContentInfo.load(base64.b64decode(signature))
    return json.loads(info["content"]["encap_content_info"]["content"].native)


@pytest.fixture
def sender(simulator: Any) -> tuple[AttestingSender, Recorder, Attester]:
    simulator.sim.add_vm("vm0")
    inner = Recorder()
    attester = Attester(ImdsClient(simulator.vm_url("vm0"), timeout=5))
    return AttestingSender(inner, attester, FixedKeys(KEY)), inner, attester


def test_the_attestation_binds_the_exact_envelope(simulator: Any, sender: Any) -> None:
    attesting, inner, attester = sender
    envelope = document_envelope()
    attesting.send(envelope, envelope.to_json())
    [(sent, body)] = inner.sent
    data = json.loads(body)
    assert data["callback_key"] == {"id": FixedKeys(KEY).current_key().id, "secret": KEY.hex()}
    without = {k: v for k, v in data.items() if k != "attestation"}
    nonce = sha256(canonical(without)).hexdigest()[:32]
    assert data["attestation"]["nonce"] == nonce == binding_nonces(data)[0]
    content = signed_content(data["attestation"]["signature"])
    assert content["nonce"] == nonce and content["vmId"] == vm_id_of("vm0")
    assert simulator.attested == [("vm0", nonce)] and attester.calls == 1
    assert sent.message_id().endswith(":" + data["callback_key"]["id"])
    assert sent.session_id == vm_id_of("vm0")
    # Any change to the body breaks the binding.
    changed = {**without, "sequence": 4}
    assert binding_nonces(changed)[0] != nonce


def test_a_400_to_a_32_character_nonce_falls_back_to_10_digits(simulator: Any, sender: Any) -> None:
    attesting, inner, attester = sender
    simulator.sim.inject_fault(kind="short-nonce", endpoint="attested", count=None)
    envelope = document_envelope()
    with pytest.raises(SendError) as caught:  # one attested call per attempt: retried
        attesting.send(envelope, envelope.to_json())
    assert not caught.value.slow and inner.sent == []
    attesting.send(envelope, envelope.to_json())
    [(_, body)] = inner.sent
    data = json.loads(body)
    short = binding_nonces(data)[1]
    assert len(short) == 10 and short.isdigit()
    assert (
        data["attestation"]["nonce"]
        == short
        == signed_content(data["attestation"]["signature"])["nonce"]
    )
    assert attester.calls == 2


def test_imds_signing_another_nonce_falls_back_to_10_digits(simulator: Any, sender: Any) -> None:
    """Issue 32: IMDS answering 200 with another nonce signed (Learn documents a 10-digit
    nonce) made every message fail admission; the relay now reads the signed nonce."""
    attesting, inner, attester = sender
    simulator.sim.inject_fault(kind="other-nonce", endpoint="attested", count=1)
    envelope = document_envelope()
    with pytest.raises(SendError) as caught:  # nothing the app would refuse is sent
        attesting.send(envelope, envelope.to_json())
    assert not caught.value.slow and inner.sent == [] and attester.short_nonce
    attesting.send(envelope, envelope.to_json())
    [(_, body)] = inner.sent
    data = json.loads(body)
    short = binding_nonces(data)[1]
    signed = signed_content(data["attestation"]["signature"])["nonce"]
    assert data["attestation"]["nonce"] == short == signed and len(short) == 10


def test_another_nonce_signed_for_10_digits_too_is_a_lasting_failure(
    simulator: Any, sender: Any
) -> None:
    attesting, inner, attester = sender
    simulator.sim.inject_fault(kind="other-nonce", endpoint="attested", count=None)
    envelope = document_envelope()
    with pytest.raises(SendError):
        attesting.send(envelope, envelope.to_json())
    with pytest.raises(SendError) as caught:
        attesting.send(envelope, envelope.to_json())
    assert caught.value.slow and caught.value.kind == "attestation-nonce-mismatch"
    assert inner.sent == [] and attester.calls == 2


def test_imds_failing_to_attest_keeps_the_message(simulator: Any, sender: Any) -> None:
    attesting, inner, _ = sender
    simulator.sim.inject_fault(kind="status", status=503, endpoint="attested")
    envelope = document_envelope()
    with pytest.raises(SendError) as caught:
        attesting.send(envelope, envelope.to_json())
    assert not caught.value.slow and inner.sent == []  # transient: the send loop retries
    attesting.send(envelope, envelope.to_json())
    assert len(inner.sent) == 1


def test_a_message_too_large_is_replaced_by_an_unforwardable_notice(sender: Any) -> None:
    attesting, inner, _ = sender
    attesting.max_bytes = 20_000
    envelope = document_envelope()
    big = {**envelope.document, "Padding": "x" * 30_000}
    attesting.send(envelope.replace(document=big), envelope.replace(document=big).to_json())
    [(_, body)] = inner.sent
    data = json.loads(body)
    assert data["kind"] == "unforwardable" and data["document"] is None
    assert data["unforwardable"]["incarnation"] == 2 and data["unforwardable"]["bytes"] > 30_000
    assert data["attestation"]["nonce"] == binding_nonces(data)[0]


def test_a_rotated_relay_attests_its_keys_proof(simulator: Any) -> None:
    """The proof (relay.keystore) travels in the attested body, as the app's model reads it."""
    from functions.identity.keys import CallbackKey, parse_key_proof
    from functions.model.envelope import parse_envelope as app_envelope

    simulator.sim.add_vm("vm0")
    inner, previous = Recorder(), bytes(range(32))
    keys = FixedKeys(KEY, previous)
    attester = Attester(ImdsClient(simulator.vm_url("vm0"), timeout=5))
    envelope = document_envelope()
    AttestingSender(inner, attester, keys).send(envelope, envelope.to_json())
    [(_, body)] = inner.sent
    sent = app_envelope(body).callback_key
    assert sent is not None and sent.id == keys.current_key().id
    proof = parse_key_proof(sent.model_dump())
    old = CallbackKey(FixedKeys(previous).current_key().id, previous)
    assert proof is not None and proof.previous_id == old.key_id
    assert proof.made(old, sent.id)
