"""The relay's reading of the signed JSON in an attested document (relay/pkcs7.py).

Held to documents Azure itself signed: the genuine samples in tests/identity/genuine/
(sources, repositories and commits in its SOURCES.md) and the Learn page's 2018 example
(MicrosoftDocs/azure-compute-docs `articles/virtual-machines/instance-metadata-service.md`
@ 1dc6d3b8), each read independently with asn1crypto's full CMS parser.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
from asn1crypto import cms

from relay.pkcs7 import DerError, econtent, signed_json

GENUINE = Path(__file__).resolve().parents[1] / "identity" / "genuine"
SAMPLES = sorted(GENUINE.glob("*.json"))


def reference(signature: str) -> dict[str, object]:
    info = cms.ContentInfo.load(base64.b64decode(signature))
    return json.loads(info["content"]["encap_content_info"]["content"].native)


def test_there_are_genuine_samples() -> None:
    assert len(SAMPLES) >= 7


@pytest.mark.parametrize("path", SAMPLES, ids=lambda p: p.stem)
def test_the_signed_json_of_each_genuine_document(path: Path) -> None:
    signature = json.loads(path.read_text())["signature"]
    expected = reference(signature)
    assert signed_json(signature) == expected
    assert "nonce" in expected and "vmId" in expected


@pytest.mark.parametrize("path", SAMPLES, ids=lambda p: p.stem)
def test_a_der_walk_that_fails_falls_back_to_finding_the_json(path: Path) -> None:
    signature = json.loads(path.read_text())["signature"]
    der = bytearray(base64.b64decode(signature))
    # The outer SEQUENCE re-written with an indefinite (BER) length: the DER walk stops.
    assert der[0] == 0x30 and der[1] & 0x80
    count = der[1] & 0x7F
    ber = bytes(der[:1]) + b"\x80" + bytes(der[2 + count :]) + b"\x00\x00"
    with pytest.raises(DerError):
        econtent(ber)
    assert signed_json(base64.b64encode(ber).decode()) == reference(signature)


@pytest.mark.parametrize(
    "signature",
    ["", "not base64!", base64.b64encode(b"\x30\x03\x06\x01\x00").decode(), "AAAA"],
)
def test_unreadable_signatures_give_none(signature: str) -> None:
    assert signed_json(signature) is None
