"""The digest and signature algorithms a SignerInfo may name: SHA-256/384/512 written as
the hash OID or as sha*WithRSAEncryption (what Azure writes), signature rsaEncryption or
the matching sha*WithRSAEncryption; nothing weaker than SHA-256."""

from __future__ import annotations

import base64
import datetime as dt

import pytest
from asn1crypto import cms, core
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import padding

from functions.identity.attestation import AttestationError, AttestationVerifier
from simulator import identity as sim_identity

HASHES = {"sha1": hashes.SHA1, "sha224": hashes.SHA224, "md5": hashes.MD5}
HASHES |= {"sha256": hashes.SHA256, "sha384": hashes.SHA384, "sha512": hashes.SHA512}


def signed_with(digest_oid: str, signature_oid: str, hash_name: str) -> str:
    """Azure's shape, with these algorithm OIDs and the signature made with `hash_name`."""
    issuer = sim_identity.issuer_for("g2")
    now = dt.datetime.now(dt.UTC)
    content = sim_identity.attested_content("vm", "sub", "n", now=now)
    info = cms.ContentInfo.load(
        base64.b64decode(sim_identity.sign(content, issuer.leaf, issuer.leaf_key))
    )
    data = info["content"]
    signed = data["encap_content_info"]["content"].native
    signer = data["signer_infos"][0]
    algorithm = {"algorithm": digest_oid, "parameters": core.Null()}
    signer["digest_algorithm"] = algorithm
    signer["signature_algorithm"] = {"algorithm": signature_oid, "parameters": core.Null()}
    signer["signature"] = issuer.leaf_key.sign(signed, padding.PKCS1v15(), HASHES[hash_name]())
    data["digest_algorithms"] = [algorithm]
    out = cms.ContentInfo({"content_type": "signed_data", "content": data}).dump(force=True)
    return base64.b64encode(out).decode()


def verify(signature: str) -> str:
    issuer = sim_identity.issuer_for("g2")
    now = dt.datetime.now(dt.UTC)
    return AttestationVerifier(roots_pem=issuer.root_pem).verify_document(signature, now).vm_id


RSA = "1.2.840.113549.1.1.1"


@pytest.mark.parametrize(
    ("digest", "signature", "hash_name"),
    [
        ("1.2.840.113549.1.1.11", RSA, "sha256"),  # Azure's
        ("2.16.840.1.101.3.4.2.1", RSA, "sha256"),
        ("2.16.840.1.101.3.4.2.1", "1.2.840.113549.1.1.11", "sha256"),
        ("1.2.840.113549.1.1.12", RSA, "sha384"),
        ("2.16.840.1.101.3.4.2.2", "1.2.840.113549.1.1.12", "sha384"),
        ("1.2.840.113549.1.1.13", RSA, "sha512"),
        ("2.16.840.1.101.3.4.2.3", RSA, "sha512"),
    ],
)
def test_sha2_in_either_oid_form_is_accepted(digest: str, signature: str, hash_name: str) -> None:
    assert verify(signed_with(digest, signature, hash_name)) == "vm"


@pytest.mark.parametrize(
    ("digest", "hash_name", "named"),
    [
        ("1.3.14.3.2.26", "sha1", "sha1"),
        ("1.2.840.113549.1.1.5", "sha1", "sha1WithRSAEncryption"),
        ("1.2.840.113549.2.5", "md5", "md5"),
        ("1.2.840.113549.1.1.4", "md5", "md5WithRSAEncryption"),
        ("2.16.840.1.101.3.4.2.4", "sha224", "sha224"),
    ],
)
def test_anything_weaker_than_sha256_is_refused_by_name(
    digest: str, hash_name: str, named: str
) -> None:
    with pytest.raises(AttestationError, match=f"{named} .* is weaker than SHA-256") as info:
        verify(signed_with(digest, RSA, hash_name))
    assert info.value.check == "signature"


@pytest.mark.parametrize(
    ("digest", "signature", "reason"),
    [
        ("1.2.840.113549.1.1.11", "1.2.840.113549.1.1.12", "disagree"),
        ("1.2.840.113549.1.1.11", "1.2.840.113549.1.1.14", "not accepted"),  # sha224WithRSA
        ("1.2.3.4", RSA, "digest algorithm 1.2.3.4 not accepted"),
    ],
)
def test_odd_algorithm_pairs_are_refused(digest: str, signature: str, reason: str) -> None:
    with pytest.raises(AttestationError, match=reason) as info:
        verify(signed_with(digest, signature, "sha256"))
    assert info.value.check == "signature"


def test_a_signature_made_with_another_hash_than_named_is_refused() -> None:
    with pytest.raises(AttestationError, match="does not verify"):
        verify(signed_with("1.2.840.113549.1.1.11", RSA, "sha384"))
