"""The PKCS#7 SignedData an IMDS attested document is: parse it, find its signer, check the
signature. pyca/cryptography has no public PKCS#7 verify API, so asn1crypto parses and
cryptography verifies.

What Azure writes (genuine documents in tests/identity/genuine/, 2018-2026): one
SignerInfo naming its certificate by issuer and serial, digestAlgorithm written as
sha256WithRSAEncryption (1.2.840.113549.1.1.11, not the plain sha256 OID), signature
algorithm rsaEncryption, no signed attributes (the RSA signature covers the content), only
the leaf in the certificate bag. Accepted digests: SHA-256/384/512 under either OID form;
anything weaker (SHA-1, MD5, SHA-224) is refused by name."""

from __future__ import annotations

from typing import Any

from asn1crypto import cms, core
from asn1crypto import x509 as asn1_x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import padding, rsa

from functions.identity.attestation_errors import AttestationError

MAX_BAG_CERTIFICATES = 8

# digestAlgorithm OIDs: the hash OIDs and the sha*WithRSAEncryption OIDs Azure writes.
DIGESTS: dict[str, tuple[str, type[hashes.HashAlgorithm]]] = {
    "2.16.840.1.101.3.4.2.1": ("sha256", hashes.SHA256),
    "2.16.840.1.101.3.4.2.2": ("sha384", hashes.SHA384),
    "2.16.840.1.101.3.4.2.3": ("sha512", hashes.SHA512),
    "1.2.840.113549.1.1.11": ("sha256", hashes.SHA256),
    "1.2.840.113549.1.1.12": ("sha384", hashes.SHA384),
    "1.2.840.113549.1.1.13": ("sha512", hashes.SHA512),
}
WEAK_DIGESTS = {
    "1.3.14.3.2.26": "sha1",
    "1.2.840.113549.2.5": "md5",
    "2.16.840.1.101.3.4.2.4": "sha224",
    "1.2.840.113549.1.1.4": "md5WithRSAEncryption",
    "1.2.840.113549.1.1.5": "sha1WithRSAEncryption",
    "1.2.840.113549.1.1.14": "sha224WithRSAEncryption",
}
RSA_ENCRYPTION = "1.2.840.113549.1.1.1"
# signatureAlgorithm OIDs: rsaEncryption (the digest algorithm names the hash) or an RSA
# PKCS#1 v1.5 OID whose hash must be the digest algorithm's.
SIGNATURES = {
    RSA_ENCRYPTION: None,
    "1.2.840.113549.1.1.11": "sha256",
    "1.2.840.113549.1.1.12": "sha384",
    "1.2.840.113549.1.1.13": "sha512",
}


def signed_data(der: bytes) -> cms.SignedData:
    try:
        info = cms.ContentInfo.load(der, strict=True)
        kind = info["content_type"].native
    except Exception:  # asn1crypto raises ValueError, TypeError, KeyError... on garbage
        raise AttestationError("signature is not PKCS#7") from None
    if kind != "signed_data":
        raise AttestationError(f"signature is PKCS#7 {str(kind)[:40]}, not SignedData")
    return info["content"]


def content(data: cms.SignedData) -> bytes:
    encap = data["encap_content_info"]
    if encap["content_type"].native != "data":
        raise AttestationError("signed content type is not data")
    value = encap["content"].native
    if not isinstance(value, bytes) or not value:
        raise AttestationError("signed content is not attached")
    return value


def signer(
    data: cms.SignedData,
) -> tuple[cms.SignerInfo, asn1_x509.Certificate, list[asn1_x509.Certificate]]:
    """The one SignerInfo, the bag certificate its `sid` names (exactly one), and the other
    certificates of the bag (candidate intermediates, trusted for nothing). Never "the
    first certificate of the bag": the bag is a SET a forger fills (SPIRE's 2026 fix)."""
    infos = list(data["signer_infos"])
    if len(infos) != 1:
        raise AttestationError(f"{len(infos)} signers, expected 1", check="signature")
    info = infos[0]
    sid = info["sid"]
    certs = [c.chosen for c in data["certificates"] or () if c.name == "certificate"]
    if len(certs) > MAX_BAG_CERTIFICATES:
        raise AttestationError(f"{len(certs)} certificates in the bag")
    if sid.name == "issuer_and_serial_number":
        issuer = sid.chosen["issuer"]
        serial = sid.chosen["serial_number"].native
        # Same DER first (what every signer writes); RFC 5280 name matching otherwise.
        issuer_der = issuer.dump()
        matches = [
            c
            for c in certs
            if c.serial_number == serial and (c.issuer.dump() == issuer_der or c.issuer == issuer)
        ]
    elif sid.name == "subject_key_identifier":
        ski = sid.chosen.native
        matches = [c for c in certs if c.key_identifier is not None and c.key_identifier == ski]
    else:  # pragma: no cover - the CHOICE has only these two
        raise AttestationError("unknown signer identifier")
    if not matches:
        raise AttestationError("the signer's certificate is not in the signature", "signature")
    if len(matches) > 1:
        raise AttestationError("more than one certificate matches the signer", "signature")
    others = [c for c in certs if c is not matches[0]]
    return info, matches[0], others


def digest_of(info: cms.SignerInfo) -> tuple[str, type[hashes.HashAlgorithm]]:
    """(name, hash) of the SignerInfo's digestAlgorithm; a weak or unknown one refused."""
    oid = info["digest_algorithm"]["algorithm"].dotted
    if oid in WEAK_DIGESTS:
        raise AttestationError(
            f"digest algorithm {WEAK_DIGESTS[oid]} ({oid}) is weaker than SHA-256: refused",
            check="signature",
        )
    if oid not in DIGESTS:
        raise AttestationError(f"digest algorithm {oid} not accepted", check="signature")
    return DIGESTS[oid]


def check_signature(info: cms.SignerInfo, key: Any, signed: bytes) -> None:
    """The RSA PKCS#1 v1.5 signature over the signed attributes (if any, whose
    messageDigest must be the content's) or over the content itself (what Azure does)."""
    if not isinstance(key, rsa.RSAPublicKey):
        raise AttestationError("signer key is not RSA", check="signature")
    name, hash_type = digest_of(info)
    sig_oid = info["signature_algorithm"]["algorithm"].dotted
    if sig_oid not in SIGNATURES:
        raise AttestationError(f"signature algorithm {sig_oid} not accepted", "signature")
    if SIGNATURES[sig_oid] not in (None, name):
        raise AttestationError("signature and digest algorithms disagree", "signature")
    attrs = info["signed_attrs"]
    if not isinstance(attrs, core.Void):
        _check_signed_attributes(attrs, hash_type, signed)
        # CMS: the signature covers the attributes' DER with the SET OF tag (0x31), not the
        # [0] IMPLICIT tag they travel with; the bytes are the received ones.
        raw = attrs.dump()
        message = b"\x31" + raw[1:]
    else:
        message = signed
    try:
        key.verify(info["signature"].native, message, padding.PKCS1v15(), hash_type())
    except InvalidSignature:
        raise AttestationError("signature does not verify", check="signature") from None


def _check_signed_attributes(
    attrs: cms.CMSAttributes, hash_type: type[hashes.HashAlgorithm], signed: bytes
) -> None:
    values: dict[str, list[Any]] = {}
    for attr in attrs:
        name = attr["type"].native
        if name in values:
            raise AttestationError(f"signed attribute {name} repeated", check="signature")
        values[name] = list(attr["values"])
    kinds = values.get("content_type")
    if not kinds or len(kinds) != 1 or kinds[0].native != "data":
        raise AttestationError("signed content-type attribute is not data", "signature")
    digests = values.get("message_digest")
    if not digests or len(digests) != 1:
        raise AttestationError("signed attributes have no message digest", "signature")
    h = hashes.Hash(hash_type())
    h.update(signed)
    if digests[0].native != h.finalize():
        raise AttestationError("message digest does not match the content", "signature")
