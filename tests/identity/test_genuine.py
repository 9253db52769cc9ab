"""Genuine Azure-signed attested documents (tests/identity/genuine/SOURCES.md) verify with
the shipped trust at their own signing time, and tampered copies of them do not.

No network: the shipped trust holds every intermediate these chains use, and issuer
fetching is off (a test that passed only because it reached Microsoft would prove
nothing here)."""

from __future__ import annotations

import base64
import datetime as dt
import json
from dataclasses import dataclass
from pathlib import Path

import pytest
from asn1crypto import cms
from asn1crypto import x509 as asn1_x509
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization

from functions.identity import pkcs7
from functions.identity.attestation import AttestationError, AttestationVerifier
from simulator import identity as sim_identity

GENUINE = Path(__file__).resolve().parent / "genuine"
RETIRED = GENUINE / "retired"


@dataclass(frozen=True)
class Sample:
    file: str
    vm_id: str
    subscription: str
    signed: str  # createdOn, ISO
    chain: tuple[str, ...]  # subject CNs, leaf first, as the verifier builds it
    names: tuple[str, ...]
    retired: bool = False  # its chain needs retired/ as extra trust

    @property
    def at(self) -> dt.datetime:
        return dt.datetime.fromisoformat(self.signed) + dt.timedelta(minutes=1)

    @property
    def signature(self) -> str:
        return json.loads((GENUINE / self.file).read_text())["signature"]


SUB_TC = "8a205152-b25a-417f-a676-80465535a6c9"
EAST = ("eastus.metadata.azure.com", "metadata.azure.com")
RSA_ROOT_2017 = "Microsoft RSA Root Certificate Authority 2017"
SAMPLES = (
    Sample(
        "coder-southcentralus-2022-04.json",
        "bd8e7443-24a0-41f3-b949-8baf4fd1c573",
        "5f130ffc-0a3e-4795-b691-4f56a12a5547",
        "2022-04-19T01:27:21+00:00",
        ("metadata.azure.com", "Microsoft RSA TLS CA 01", "Baltimore CyberTrust Root"),
        ("metadata.azure.com", "southcentralus.metadata.azure.com"),
        retired=True,
    ),
    Sample(
        "coder-usgovvirginia-2023-03.json",
        "990878d4-068a-4ac4-9ee9-1231d2218ef2",
        "0afbfffa-5df9-4a3b-987e-fe7577624272",
        "2023-03-08T17:09:33+00:00",
        ("metadata.azure.us", "Microsoft Azure TLS Issuing CA 05", "DigiCert Global Root G2"),
        ("usgovvirginia.metadata.azure.us", "metadata.azure.us"),
        retired=True,
    ),
    Sample(
        "taskcluster-eastus-2025-04.json",
        "f9cc27a0-2d12-40cf-adc9-7a676efec010",
        SUB_TC,
        "2025-04-23T16:23:58+00:00",
        ("metadata.azure.com", "Microsoft Azure RSA TLS Issuing CA 03", RSA_ROOT_2017),
        EAST,
    ),
    Sample(
        "taskcluster-southcentralus-2025-08.json",
        "9b8e2728-7a37-4a9e-a5d3-a942fd311e2d",
        SUB_TC,
        "2025-08-19T19:04:40+00:00",
        ("metadata.azure.com", "Microsoft Azure RSA TLS Issuing CA 04", RSA_ROOT_2017),
        ("southcentralus.metadata.azure.com", "metadata.azure.com"),
    ),
    Sample(
        "taskcluster-eastus-2025-11.json",
        "ddc87bd2-3ebb-43dc-92a9-90b104cd9527",
        SUB_TC,
        "2025-11-19T12:53:30+00:00",
        ("metadata.azure.com", "Microsoft Azure RSA TLS Issuing CA 07", RSA_ROOT_2017),
        EAST,
    ),
    Sample(
        "taskcluster-eastus-2026-04.json",
        "20835698-65ee-46e6-809f-30dc266e1aed",
        SUB_TC,
        "2026-04-23T15:49:58+00:00",
        ("metadata.azure.com", "Microsoft Azure RSA TLS Issuing CA 04", RSA_ROOT_2017),
        EAST,
    ),
    Sample(
        "taskcluster-eastus-2026-07-g2.json",
        "b1310a36-d400-46f6-82cb-6217df846586",
        SUB_TC,
        "2026-07-28T13:24:00+00:00",
        ("metadata.azure.com", "Microsoft TLS G2 RSA CA OCSP 02", "Microsoft TLS RSA Root G2"),
        EAST,
    ),
)
CURRENT = [s for s in SAMPLES if not s.retired]


def retired_pem() -> str:
    return "".join(p.read_text() for p in sorted(RETIRED.glob("*.pem")))


def verifier_for(sample: Sample) -> AttestationVerifier:
    extra = retired_pem() if sample.retired else None
    return AttestationVerifier(extra_pem=extra, fetch_issuers=False)


@pytest.mark.parametrize("sample", SAMPLES, ids=lambda s: s.file)
def test_a_genuine_document_verifies_at_its_signing_time(sample: Sample) -> None:
    verifier = verifier_for(sample)
    signed = verifier.inspect(sample.signature, sample.at)
    assert signed.chain == sample.chain
    assert signed.signer_names == sample.names
    attested = verifier.verify_document(sample.signature, sample.at, vm_id=sample.vm_id)
    assert attested.vm_id == sample.vm_id
    assert attested.subscription_id == sample.subscription
    assert attested.created_on == dt.datetime.fromisoformat(sample.signed)


@pytest.mark.parametrize("sample", SAMPLES, ids=lambda s: s.file)
def test_a_genuine_document_is_refused_once_expired(sample: Sample) -> None:
    later = sample.at + dt.timedelta(hours=7)  # IMDS documents live 6 hours
    with pytest.raises(AttestationError, match="expired at") as info:
        verifier_for(sample).verify_document(sample.signature, later)
    assert info.value.check == "time"


@pytest.mark.parametrize("sample", [s for s in SAMPLES if s.retired], ids=lambda s: s.file)
def test_a_retired_chain_is_refused_by_the_default_trust(sample: Sample) -> None:
    """Baltimore CyberTrust Root and the Azure TLS Issuing CAs 01-06 are not shipped: the
    signature and the names of these samples still hold (checked above with retired/ as
    extra trust), the chain does not."""
    with pytest.raises(AttestationError, match="does not chain") as info:
        AttestationVerifier(fetch_issuers=False).verify_document(sample.signature, sample.at)
    assert info.value.check == "chain"


def test_the_vm_id_and_subscription_rules_hold_on_a_genuine_document() -> None:
    sample = CURRENT[-1]
    with pytest.raises(AttestationError) as info:
        verifier_for(sample).verify_document(
            sample.signature, sample.at, vm_id="00000000-0000-0000-0000-000000000000"
        )
    assert info.value.check == "vm_id"
    only_other = AttestationVerifier(
        fetch_issuers=False, allowed_subscriptions=frozenset({"11111111-0000-0000-0000-0"})
    )
    with pytest.raises(AttestationError) as info:
        only_other.verify_document(sample.signature, sample.at)
    assert info.value.check == "subscription"
    with pytest.raises(AttestationError) as info:
        verifier_for(sample).verify_document(sample.signature, sample.at, nonces=("1234567890",))
    assert info.value.check == "nonce"


def test_microsofts_page_example_has_azures_signer_info_and_is_refused_for_its_name() -> None:
    """The IMDS page's example is signed by a self-signed test certificate with no SAN:
    its signature holds (the same SignerInfo shape: digest OID sha256WithRSAEncryption,
    no signed attributes), the verifier refuses it for its name before any chain."""
    signature = json.loads((GENUINE / "microsoft-docs-imds-example-2018.json").read_text())
    der = base64.b64decode(signature["signature"])
    data = pkcs7.signed_data(der)
    info, leaf, _ = pkcs7.signer(data)
    assert info["digest_algorithm"]["algorithm"].dotted == "1.2.840.113549.1.1.11"
    key = x509.load_der_x509_certificate(leaf.dump()).public_key()
    pkcs7.check_signature(info, key, pkcs7.content(data))  # holds
    at = dt.datetime(2018, 11, 20, 22, 8, tzinfo=dt.UTC)
    verifier = AttestationVerifier(fetch_issuers=False)
    with pytest.raises(AttestationError, match="no subjectAltName") as refused:
        verifier.inspect(signature["signature"], at)
    assert refused.value.check == "signer_name"
    # The whole document is refused sooner, by the cheap check of its signed JSON (the
    # 2018 example predates subscriptionId).
    with pytest.raises(AttestationError, match="no subscriptionId"):
        verifier.verify_document(signature["signature"], at)


# ---------------------------------------------------------------------- tampered copies


def _rebuilt(signature: str, change) -> str:
    info = cms.ContentInfo.load(base64.b64decode(signature))
    data = info["content"]
    change(data)
    # asn1crypto caches encodings: drop them so the changed fields are re-encoded.
    return base64.b64encode(
        cms.ContentInfo({"content_type": "signed_data", "content": data}).dump(force=True)
    ).decode()


@pytest.mark.parametrize("sample", CURRENT, ids=lambda s: s.file)
def test_one_byte_of_content_changed_is_refused(sample: Sample) -> None:
    der = bytearray(base64.b64decode(sample.signature))
    at = der.find(sample.vm_id.encode())
    der[at] = ord("0") if der[at] != ord("0") else ord("1")
    with pytest.raises(AttestationError, match="signature does not verify") as info:
        verifier_for(sample).verify_document(base64.b64encode(bytes(der)).decode(), sample.at)
    assert info.value.check == "signature"


def test_another_signer_in_the_bag_is_refused() -> None:
    """A second SignerInfo (and its certificate) beside Azure's: one signer only."""
    sample = CURRENT[-1]
    forger = sim_identity.issuer_for("g1")
    forged = base64.b64decode(sim_identity.sign(b"{}", forger.leaf, forger.leaf_key))
    theirs = cms.ContentInfo.load(forged)["content"]

    def add_signer(data: cms.SignedData) -> None:
        data["certificates"] = [*data["certificates"], theirs["certificates"][0]]
        data["signer_infos"] = [*data["signer_infos"], theirs["signer_infos"][0]]

    with pytest.raises(AttestationError, match="2 signers") as info:
        verifier_for(sample).verify_document(_rebuilt(sample.signature, add_signer), sample.at)
    assert info.value.check == "signature"


def test_a_forged_signer_beside_the_genuine_leaf_is_refused() -> None:
    """The content re-signed by a forger's `metadata.azure.com` certificate, Azure's leaf
    left in the bag: the SignerInfo names the forger's certificate, which chains nowhere."""
    sample = CURRENT[-1]
    genuine_leaf = x509.load_der_x509_certificate(
        cms.ContentInfo.load(base64.b64decode(sample.signature))["content"]["certificates"][
            0
        ].chosen.dump()
    )
    forger = sim_identity.issuer_for("g1")
    content = cms.ContentInfo.load(base64.b64decode(sample.signature))["content"]
    signed = content["encap_content_info"]["content"].native.replace(b"eastus", b"westus")
    forged = sim_identity.sign(signed, forger.leaf, forger.leaf_key, extra_certs=(genuine_leaf,))
    with pytest.raises(AttestationError, match="does not chain") as info:
        verifier_for(sample).verify_document(forged, sample.at)
    assert info.value.check == "chain"


@pytest.mark.parametrize("sample", CURRENT, ids=lambda s: s.file)
def test_the_leaf_re_signed_by_a_test_ca_is_refused(sample: Sample) -> None:
    """Azure's leaf, every field and its public key kept (so the document's signature
    still holds), re-signed by a test CA under the same issuer name: the chain fails."""
    data = cms.ContentInfo.load(base64.b64decode(sample.signature))["content"]
    leaf = x509.load_der_x509_certificate(data["certificates"][0].chosen.dump())
    _, test_ca_key = sim_identity.make_root("Test CA")
    builder = (
        x509.CertificateBuilder()
        .subject_name(leaf.subject)
        .issuer_name(leaf.issuer)
        .public_key(leaf.public_key())
        .serial_number(leaf.serial_number)
        .not_valid_before(leaf.not_valid_before_utc)
        .not_valid_after(leaf.not_valid_after_utc)
    )
    for ext in leaf.extensions:
        if ext.oid.dotted_string != "1.3.6.1.4.1.11129.2.4.2":  # the CT proofs are CA-signed
            builder = builder.add_extension(ext.value, ext.critical)
    resigned = builder.sign(test_ca_key, hashes.SHA384())
    replacement = asn1_x509.Certificate.load(resigned.public_bytes(serialization.Encoding.DER))

    def swap(signed: cms.SignedData) -> None:
        signed["certificates"] = [replacement]

    with pytest.raises(AttestationError, match="does not chain") as info:
        verifier_for(sample).verify_document(_rebuilt(sample.signature, swap), sample.at)
    assert info.value.check == "chain"
