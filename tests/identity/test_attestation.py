"""The attested-document verifier (contract §1): a genuine message is accepted, and every
forgery a compromised VM (or anyone holding a Service Bus send right) could try is refused
with a reason that says which check failed."""

from __future__ import annotations

import base64
import datetime as dt
import json
from typing import Any

import pytest
from asn1crypto import algos, cms
from asn1crypto import x509 as asn1_x509
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding
from cryptography.x509.oid import NameOID

from functions.identity.attestation import (
    AttestationError,
    AttestationVerifier,
    binding_nonces,
    canonical,
)
from simulator import identity as sim_identity

VM_A = "11111111-2222-3333-4444-555555555555"
VM_B = "99999999-8888-7777-6666-555555555555"
SUB = "00000000-0000-0000-0000-000000000000"
OTHER_SUB = "12345678-0000-0000-0000-000000000000"


# One worker runs the whole module (make test: --dist loadgroup): its fixture once.
pytestmark = pytest.mark.xdist_group("attestation")


@pytest.fixture(scope="module")
def issuer() -> sim_identity.Issuer:
    return sim_identity.test_issuer()


@pytest.fixture
def verifier(issuer) -> AttestationVerifier:
    return AttestationVerifier(roots_pem=issuer.root_pem)


def now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def envelope(vm_id: str = VM_A, **extra: Any) -> dict[str, Any]:
    return {
        "schema": 1,
        "kind": "document",
        "vm": {"vm_id": vm_id, "name": "web_0"},
        "sequence": 7,
        "observed_at": "2026-11-24T10:00:00Z",
        "callback_key": {"id": "0123456789abcdef", "secret": "ab" * 32},
        "document": {"DocumentIncarnation": 2, "Events": []},
        **extra,
    }


def attest(
    env: dict[str, Any],
    issuer: sim_identity.Issuer,
    *,
    vm_id: str | None = None,
    subscription: str = SUB,
    nonce: str | None = None,
    signer: tuple[x509.Certificate, Any] | None = None,
    extra_certs: tuple[x509.Certificate, ...] = (),
    created: dt.datetime | None = None,
) -> bytes:
    """The body a relay on `vm_id` (default: the envelope's own) would send."""
    n32, _ = binding_nonces(env)
    content = sim_identity.attested_content(
        vm_id or env["vm"]["vm_id"], subscription, nonce or n32, now=created
    )
    cert, key = signer or (issuer.leaf, issuer.leaf_key)
    signature = sim_identity.sign(content, cert, key, extra_certs=extra_certs)
    return json.dumps({**env, "attestation": {"signature": signature, "nonce": n32}}).encode()


def with_signature(env: dict[str, Any], signature: str) -> bytes:
    return json.dumps({**env, "attestation": {"signature": signature, "nonce": "x"}}).encode()


def refused(verifier: AttestationVerifier, body: bytes | str, match: str) -> str:
    with pytest.raises(AttestationError, match=match) as info:
        verifier.verify(body, now())
    assert str(info.value).startswith("attestation: ")
    return str(info.value)


def self_signed(dns_name: str) -> tuple[x509.Certificate, Any]:
    key = sim_identity._key()
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, dns_name.lstrip("*."))])
    moment = now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(moment - dt.timedelta(days=1))
        .not_valid_after(moment + dt.timedelta(days=30))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(dns_name)]), critical=False)
        .sign(key, hashes.SHA256())
    )
    return cert, key


def hand_signed(
    content: bytes,
    cert: x509.Certificate,
    key: Any,
    *,
    sid: str = "issuer",
    attrs: bool = True,
    content_type_attr: str = "data",
    digest_of: bytes | None = None,
    bag: tuple[x509.Certificate, ...] = (),
    include_signer: bool = True,
) -> str:
    """A SignedData built field by field, for what cryptography's builder cannot make
    (a subject-key-identifier sid, odd attributes)."""
    asn_cert = asn1_x509.Certificate.load(cert.public_bytes(serialization.Encoding.DER))
    if sid == "ski":
        signer_id = cms.SignerIdentifier(
            name="subject_key_identifier", value=asn_cert.key_identifier
        )
    else:
        signer_id = cms.SignerIdentifier(
            name="issuer_and_serial_number",
            value=cms.IssuerAndSerialNumber(
                {"issuer": asn_cert.issuer, "serial_number": asn_cert.serial_number}
            ),
        )
    digest = hashes.Hash(hashes.SHA256())
    digest.update(content if digest_of is None else digest_of)
    signed_attrs: Any = None
    if attrs:
        signed_attrs = cms.CMSAttributes(
            [
                cms.CMSAttribute({"type": "content_type", "values": [content_type_attr]}),
                cms.CMSAttribute({"type": "message_digest", "values": [digest.finalize()]}),
            ]
        )
        to_sign = signed_attrs.dump()
    else:
        to_sign = content
    signature = key.sign(to_sign, padding.PKCS1v15(), hashes.SHA256())
    info = {
        "version": "v3" if sid == "ski" else "v1",
        "sid": signer_id,
        "digest_algorithm": algos.DigestAlgorithm({"algorithm": "sha256"}),
        "signature_algorithm": algos.SignedDigestAlgorithm({"algorithm": "rsassa_pkcs1v15"}),
        "signature": signature,
    }
    if signed_attrs is not None:
        info["signed_attrs"] = signed_attrs
    certs = [asn_cert] * include_signer + [
        asn1_x509.Certificate.load(c.public_bytes(serialization.Encoding.DER)) for c in bag
    ]
    signed = cms.SignedData(
        {
            "version": "v3" if sid == "ski" else "v1",
            "digest_algorithms": [algos.DigestAlgorithm({"algorithm": "sha256"})],
            "encap_content_info": {"content_type": "data", "content": content},
            "certificates": certs,
            "signer_infos": [cms.SignerInfo(info)],
        }
    )
    der = cms.ContentInfo({"content_type": "signed_data", "content": signed}).dump()
    return base64.b64encode(der).decode()


def leaf_with(
    parent: x509.Certificate, parent_key: Any, *extensions: x509.ExtensionType, ski: bool = False
) -> tuple[x509.Certificate, Any]:
    """An Azure-shaped leaf under `parent` with extra extensions (it has a subject key
    identifier already, as Azure's leaves do: `ski` only documents the test's intent)."""
    leaf, key = sim_identity.make_leaf(parent, parent_key)
    assert not ski or leaf.extensions.get_extension_for_class(x509.SubjectKeyIdentifier)
    builder = (
        x509.CertificateBuilder()
        .subject_name(leaf.subject)
        .issuer_name(parent.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(leaf.not_valid_before_utc)
        .not_valid_after(leaf.not_valid_after_utc)
    )
    replaced = {type(value) for value in extensions}
    for ext in leaf.extensions:
        if type(ext.value) not in replaced:
            builder = builder.add_extension(ext.value, ext.critical)
    for value in extensions:
        builder = builder.add_extension(value, critical=False)
    return builder.sign(parent_key, hashes.SHA256()), key


def content_for(env: dict[str, Any], vm_id: str = VM_A) -> bytes:
    n32, _ = binding_nonces(env)
    return json.dumps(sim_identity.attested_content(vm_id, SUB, n32)).encode()


# ---------------------------------------------------------------------- accepted


def test_a_genuine_message_is_accepted(verifier, issuer):
    env = envelope()
    result = verifier.verify(attest(env, issuer), now())
    assert result.vm_id == VM_A and result.subscription_id == SUB
    assert result.created_on <= now() < result.expires_on


def test_vm_id_compares_case_insensitively_and_str_bodies_work(verifier, issuer):
    env = envelope(vm_id=VM_A.upper())
    body = attest(env, issuer, vm_id=VM_A)
    assert verifier.verify(body.decode(), now()).vm_id == VM_A


def test_the_ten_digit_nonce_form_is_accepted(verifier, issuer):
    env = envelope()
    _, n10 = binding_nonces(env)
    assert len(n10) == 10 and n10.isdigit()
    assert verifier.verify(attest(env, issuer, nonce=n10), now()).vm_id == VM_A


def test_binding_nonce_is_the_contract_formula():
    env = envelope()
    import hashlib

    h = hashlib.sha256(canonical(env)).hexdigest()
    assert binding_nonces(env) == (h[:32], f"{int(h[:15], 16) % 10**10:010d}")
    assert binding_nonces({**env, "attestation": {"x": 1}}) == binding_nonces(env)


def test_a_subject_key_identifier_sid_and_no_signed_attributes_are_accepted(verifier, issuer):
    env = envelope()
    cert, key = leaf_with(issuer.root, issuer.root_key, ski=True)
    for sid, attrs in (("ski", True), ("issuer", False), ("ski", False)):
        signature = hand_signed(content_for(env), cert, key, sid=sid, attrs=attrs)
        assert verifier.verify(with_signature(env, signature), now()).vm_id == VM_A


def test_allowed_subscription_passes(issuer):
    verifier = AttestationVerifier(roots_pem=issuer.root_pem, allowed_subscriptions={SUB})
    assert verifier.verify(attest(envelope(), issuer), now()).subscription_id == SUB


# ---------------------------------------------------------------------- forged signers


def test_a_signer_from_another_root_beside_a_genuine_certificate_is_refused(verifier, issuer):
    # The forger signs with its own *.metadata.azure.com (its own root) and adds Azure's
    # genuine certificate to the bag: a verifier taking "a certificate from the bag" would
    # check the chain of Azure's and the signature of... whichever; ours follows the sid.
    other_root, other_key = sim_identity.make_root("Forger Root")
    forged = sim_identity.make_leaf(other_root, other_key)
    body = attest(envelope(), issuer, signer=forged, extra_certs=(issuer.leaf,))
    refused(verifier, body, "signer does not chain to a trusted root")


def test_a_sid_naming_the_genuine_certificate_with_a_forged_signature_is_refused(verifier, issuer):
    # The other way round: the sid names Azure's certificate, the forger's key signs.
    forged_cert, forged_key = self_signed("*.metadata.azure.com")
    env = envelope()
    signature = hand_signed(content_for(env), issuer.leaf, forged_key, bag=(forged_cert,))
    refused(verifier, with_signature(env, signature), "signature does not verify")


def test_a_self_signed_metadata_certificate_is_refused(verifier, issuer):
    body = attest(envelope(), issuer, signer=self_signed("*.metadata.azure.com"))
    refused(verifier, body, "signer does not chain to a trusted root")


def test_a_wrong_san_under_the_trusted_root_is_refused(verifier, issuer):
    evil = sim_identity.make_leaf(issuer.root, issuer.root_key, "*.evil.com")
    message = refused(verifier, attest(envelope(), issuer, signer=evil), "not Azure")
    assert "*.evil.com" in message


def test_a_suffix_not_configured_is_refused(issuer):
    gov = sim_identity.make_leaf(issuer.root, issuer.root_key, "*.metadata.azure.us")
    public_only = AttestationVerifier(
        roots_pem=issuer.root_pem, signer_suffixes=("metadata.azure.com",)
    )
    refused(public_only, attest(envelope(), issuer, signer=gov), "not Azure")
    everywhere = AttestationVerifier(roots_pem=issuer.root_pem)
    assert everywhere.verify(attest(envelope(), issuer, signer=gov), now()).vm_id == VM_A


def test_the_default_trust_store_refuses_the_simulators_root(issuer):
    public = AttestationVerifier(fetch_issuers=False)  # the shipped trust, as in production
    message = refused(public, attest(envelope(), issuer), "signer does not chain to a trusted")
    assert "Simulated" not in message  # the reason is ours, not the certificate's text


def test_an_expired_signer_certificate_is_refused_even_when_its_chain_was_cached(verifier, issuer):
    short = sim_identity.make_leaf(issuer.root, issuer.root_key, valid_days=2)
    env = envelope()
    assert verifier.verify(attest(env, issuer, signer=short), now()).vm_id == VM_A
    later = now() + dt.timedelta(days=3)
    body = attest(env, issuer, signer=short, created=later)
    with pytest.raises(AttestationError, match="chain not valid at") as cached:
        verifier.verify(body, later)
    assert cached.value.check == "time"
    fresh = AttestationVerifier(roots_pem=issuer.root_pem)
    with pytest.raises(AttestationError, match="signer certificate not valid at") as uncached:
        fresh.verify(body, later)
    assert uncached.value.check == "time"


# ---------------------------------------------------------------------- tampering


def test_tampered_content_is_refused(verifier, issuer):
    env = envelope()
    body = json.loads(attest(env, issuer))
    der = bytearray(base64.b64decode(body["attestation"]["signature"]))
    at = der.find(b"22_04-lts")
    # Same length: still parses, the signature no longer holds. (A changed vmId is refused
    # sooner, by the cheap check on the signed JSON: tests/security/test_message_budget.py.)
    der[at : at + 5] = b"22_05"
    body["attestation"]["signature"] = base64.b64encode(bytes(der)).decode()
    with pytest.raises(AttestationError, match="signature does not verify") as info:
        verifier.verify(json.dumps(body), now())
    assert info.value.check == "signature"


def test_tampered_content_without_signed_attributes_is_refused(verifier, issuer):
    env = envelope()
    content = content_for(env)
    signature = hand_signed(content, issuer.leaf, issuer.leaf_key, attrs=False)
    der = base64.b64decode(signature).replace(b"22_04-lts", b"22_05-lts", 1)
    body = with_signature(env, base64.b64encode(der).decode())
    refused(verifier, body, "signature does not verify")


def test_signed_attributes_must_say_data_and_hold_the_content_digest(verifier, issuer):
    env = envelope()
    content = content_for(env)
    wrong_type = hand_signed(content, issuer.leaf, issuer.leaf_key, content_type_attr="signed_data")
    refused(verifier, with_signature(env, wrong_type), "content-type attribute is not data")
    wrong_digest = hand_signed(content, issuer.leaf, issuer.leaf_key, digest_of=b"other")
    refused(verifier, with_signature(env, wrong_digest), "message digest does not match")


def test_a_body_changed_after_signing_fails_the_nonce(verifier, issuer):
    body = json.loads(attest(envelope(), issuer))
    body["document"]["Events"] = [{"EventId": "injected"}]
    refused(verifier, json.dumps(body), "nonce does not match this message")


def test_another_vms_document_replayed_under_a_changed_vm_id_is_refused(verifier, issuer):
    # Replay as is: VM B's genuine message with vm_id edited to A changes the body.
    body = json.loads(attest(envelope(vm_id=VM_B), issuer))
    body["vm"]["vm_id"] = VM_A
    refused(verifier, json.dumps(body), "nonce does not match")
    # A compromised VM B attesting a message that claims to be A: the nonce binds, but
    # Azure signed B's vmId.
    message = refused(
        verifier, attest(envelope(vm_id=VM_A), issuer, vm_id=VM_B), "does not match vm.vm_id"
    )
    assert VM_B in message and VM_A in message


def test_an_expired_document_is_refused(verifier, issuer):
    old = now() - sim_identity.DOCUMENT_LIFETIME - dt.timedelta(minutes=1)
    refused(verifier, attest(envelope(), issuer, created=old), "expired at")


def test_a_document_created_in_the_future_is_refused(verifier, issuer):
    ahead = now() + dt.timedelta(minutes=10)
    refused(verifier, attest(envelope(), issuer, created=ahead), "created in the future")
    # Within the 5-minute skew it passes.
    close = now() + dt.timedelta(minutes=4)
    assert verifier.verify(attest(envelope(), issuer, created=close), now()).vm_id == VM_A


def test_a_subscription_not_allowed_is_refused(issuer):
    verifier = AttestationVerifier(roots_pem=issuer.root_pem, allowed_subscriptions={SUB})
    message = refused(verifier, attest(envelope(), issuer, subscription=OTHER_SUB), "not allowed")
    assert OTHER_SUB in message


# ---------------------------------------------------------------------- garbage


@pytest.mark.parametrize(
    ("body", "match"),
    [
        (b"\xff\xfe not json", "message is not JSON"),
        (b"[1, 2]", "not a JSON object"),
        (b'{"vm": {"vm_id": "x"}}', "attestation: missing"),
        (b'{"attestation": "x", "vm": {"vm_id": "x"}}', "signature missing"),
        (b'{"attestation": {"signature": "QQ=="}}', "no vm.vm_id"),
        (b'{"a": 1, "a": 2, "attestation": {}}', "duplicate key"),
        (b'{"a": NaN}', "not JSON"),
    ],
)
def test_bodies_that_are_not_attested_envelopes(verifier, body, match):
    refused(verifier, body, match)


@pytest.mark.parametrize(
    ("signature", "match"),
    [
        ("not base64 !!", "not base64"),
        (base64.b64encode(b"\x30\x03\x02\x01\x01").decode(), "not PKCS#7"),
        (base64.b64encode(b"random bytes that are not DER").decode(), "not PKCS#7"),
        (
            base64.b64encode(
                cms.ContentInfo({"content_type": "data", "content": b"x"}).dump()
            ).decode(),
            "not SignedData",
        ),
        ("A" * 70_000, "too large"),
    ],
)
def test_signatures_that_are_not_pkcs7_signed_data(verifier, signature, match):
    refused(verifier, with_signature(envelope(), signature), match)


def test_signed_content_that_is_not_json_is_refused(verifier, issuer):
    signature = sim_identity.sign(b"<xml/>", issuer.leaf, issuer.leaf_key)
    refused(verifier, with_signature(envelope(), signature), "signed content is not JSON")


def test_truncated_pkcs7_is_refused(verifier, issuer):
    body = json.loads(attest(envelope(), issuer))
    der = base64.b64decode(body["attestation"]["signature"])
    for cut in (len(der) // 3, len(der) - 40):
        body["attestation"]["signature"] = base64.b64encode(der[:cut]).decode()
        refused(verifier, json.dumps(body), "PKCS#7")


def test_a_signer_missing_from_the_bag_is_refused(verifier, issuer):
    env = envelope()
    other = sim_identity.make_leaf(issuer.root, issuer.root_key)[0]
    signature = hand_signed(
        content_for(env), issuer.leaf, issuer.leaf_key, bag=(other,), include_signer=False
    )
    refused(verifier, with_signature(env, signature), "signer's certificate is not in")


def test_missing_intermediates_are_fetched_only_from_allowed_hosts(issuer):
    # Azure's bag holds only the leaf; its issuer is named by the AIA caIssuers URL.
    root, root_key = issuer.root, issuer.root_key
    inter, inter_key = sim_identity.make_root("Test Intermediate")
    inter = (
        x509.CertificateBuilder()
        .subject_name(inter.subject)
        .issuer_name(root.subject)
        .public_key(inter_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now() - dt.timedelta(days=1))
        .not_valid_after(now() + dt.timedelta(days=100))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(True, False, False, False, False, True, True, False, False),
            critical=True,
        )
        .add_extension(
            x509.SubjectKeyIdentifier.from_public_key(inter_key.public_key()), critical=False
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(root_key.public_key()),
            critical=False,
        )
        .sign(root_key, hashes.SHA256())
    )

    def leaf_with_aia(url: str) -> tuple[x509.Certificate, Any]:
        return leaf_with(
            inter,
            inter_key,
            x509.AuthorityInformationAccess(
                [
                    x509.AccessDescription(
                        x509.oid.AuthorityInformationAccessOID.CA_ISSUERS,
                        x509.UniformResourceIdentifier(url),
                    )
                ]
            ),
        )

    fetched: list[str] = []

    def fetcher(url: str, deadline: float = 5.0) -> bytes:
        fetched.append(url)
        return inter.public_bytes(serialization.Encoding.DER)

    good = leaf_with_aia("http://www.microsoft.com/pkiops/certs/test.crt")
    evil = leaf_with_aia("http://169.254.169.254/metadata/identity")
    env = envelope()
    no_fetch = AttestationVerifier(roots_pem=issuer.root_pem)
    refused(no_fetch, attest(env, issuer, signer=good), "signer does not chain")
    assert fetched == []
    verifier = AttestationVerifier(
        roots_pem=issuer.root_pem, fetch_issuers=True, issuer_fetcher=fetcher
    )
    assert verifier.verify(attest(env, issuer, signer=good), now()).vm_id == VM_A
    assert verifier.verify(attest(env, issuer, signer=good), now()).vm_id == VM_A
    assert fetched == ["http://www.microsoft.com/pkiops/certs/test.crt"]  # once, then cached
    refused(verifier, attest(env, issuer, signer=evil), "signer does not chain")
    assert len(fetched) == 1  # the metadata address was never requested
    # The intermediate in the bag (or pinned) needs no fetch at all.
    pinned = AttestationVerifier(
        roots_pem=issuer.root_pem,
        intermediates_pem=inter.public_bytes(serialization.Encoding.PEM).decode(),
    )
    assert pinned.verify(attest(env, issuer, signer=good), now()).vm_id == VM_A
    assert no_fetch.verify(attest(env, issuer, signer=good, extra_certs=(inter,)), now())


def test_a_naive_now_is_taken_as_utc(verifier, issuer):
    naive = now().replace(tzinfo=None)
    assert verifier.verify(attest(envelope(), issuer), naive).vm_id == VM_A
