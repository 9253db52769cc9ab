"""The simulator signs in Azure's exact shape: its documents and the genuine ones
(tests/identity/genuine/) reduce to one structural description: OIDs, signer identifier,
signed attributes, bag size, the leaf's names, key usage, EKU, basic constraints, key,
AIA host, and the depth of the chain the verifier builds."""

from __future__ import annotations

import base64
import datetime as dt
import re
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from asn1crypto import cms
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import AuthorityInformationAccessOID, ExtendedKeyUsageOID

from functions.identity.attestation import AttestationError, AttestationVerifier
from simulator import identity as sim_identity
from tests.identity.test_genuine import CURRENT, Sample

SERVER, CLIENT = ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH


def _form(name: str) -> str:
    """`eastus.metadata.azure.com` -> `<region>.metadata.azure.<tld>`."""
    name = re.sub(r"metadata\.azure\.(com|us|cn)$", "metadata.azure.<tld>", name)
    return re.sub(r"^[a-z0-9-]+\.metadata", "<region>.metadata", name)


def describe(signature: str, verifier: AttestationVerifier, at: dt.datetime) -> dict[str, Any]:
    data = cms.ContentInfo.load(base64.b64decode(signature))["content"]
    (info,) = data["signer_infos"]
    leaf = x509.load_der_x509_certificate(data["certificates"][0].chosen.dump())
    ext = leaf.extensions
    ku = ext.get_extension_for_class(x509.KeyUsage)
    bc = ext.get_extension_for_class(x509.BasicConstraints)
    aia = ext.get_extension_for_class(x509.AuthorityInformationAccess).value
    key = leaf.public_key()
    assert isinstance(key, rsa.RSAPublicKey)
    return {
        "version": data["version"].native,
        "digest_algorithms": [a["algorithm"].dotted for a in data["digest_algorithms"]],
        "sid": info["sid"].name,
        "digest_algorithm": info["digest_algorithm"]["algorithm"].dotted,
        "signature_algorithm": info["signature_algorithm"]["algorithm"].dotted,
        "signed_attributes": info["signed_attrs"].native is not None,
        "bag": len(data["certificates"]),
        "subject_cn": _form(leaf.subject.get_attributes_for_oid(x509.NameOID.COMMON_NAME)[0].value),
        "san": sorted(
            _form(n)
            for n in ext.get_extension_for_class(
                x509.SubjectAlternativeName
            ).value.get_values_for_type(x509.DNSName)
        ),
        "key_usage": (ku.critical, ku.value.digital_signature, ku.value.key_encipherment),
        "key_cert_sign": ku.value.key_cert_sign,
        "eku": sorted(
            o.dotted_string for o in ext.get_extension_for_class(x509.ExtendedKeyUsage).value
        ),
        "basic_constraints": (bc.critical, bc.value.ca),
        "key": key.key_size,
        "aia_hosts": sorted(
            {
                urlsplit(a.access_location.value).hostname
                for a in aia
                if a.access_method == AuthorityInformationAccessOID.CA_ISSUERS
            }
        ),
        "chain_depth": len(verifier.inspect(signature, at).chain),
    }


def simulated(variant: str) -> tuple[str, AttestationVerifier, dt.datetime]:
    issuer = sim_identity.issuer_for(variant)
    now = dt.datetime.now(dt.UTC)
    content = sim_identity.attested_content("vm", "sub", "nonce", now=now)
    signature = sim_identity.sign(content, issuer.leaf, issuer.leaf_key)
    return signature, AttestationVerifier(roots_pem=issuer.root_pem), now


def genuine(sample: Sample) -> dict[str, Any]:
    return describe(sample.signature, AttestationVerifier(fetch_issuers=False), sample.at)


G2 = [s for s in CURRENT if "g2" in s.file]
G1 = [s for s in CURRENT if "g2" not in s.file]


@pytest.mark.parametrize(("variant", "samples"), [("g2", G2), ("g1", G1)], ids=["g2", "g1"])
def test_the_simulator_and_azure_sign_the_same_shape(variant: str, samples: list[Sample]) -> None:
    ours = describe(*simulated(variant))
    our_hosts = set(ours.pop("aia_hosts"))
    for sample in samples:
        theirs = genuine(sample)
        # Azure's G2 leaves name caissuers.microsoft.com beside www.microsoft.com.
        assert our_hosts <= set(theirs.pop("aia_hosts")), sample.file
        assert ours == theirs, sample.file


def test_the_described_shape_is_azures() -> None:
    """The description itself, spelled out once (what SOURCES.md states in words)."""
    shape = genuine(G2[0])
    assert shape == {
        "version": "v1",
        "digest_algorithms": ["1.2.840.113549.1.1.11"],
        "sid": "issuer_and_serial_number",
        "digest_algorithm": "1.2.840.113549.1.1.11",
        "signature_algorithm": "1.2.840.113549.1.1.1",
        "signed_attributes": False,
        "bag": 1,
        "subject_cn": "metadata.azure.<tld>",
        "san": ["<region>.metadata.azure.<tld>", "metadata.azure.<tld>"],
        "key_usage": (True, True, True),
        "key_cert_sign": False,
        "eku": [SERVER.dotted_string],
        "basic_constraints": (True, False),
        "key": 2048,
        "aia_hosts": ["caissuers.microsoft.com", "www.microsoft.com"],
        "chain_depth": 3,
    }
    assert genuine(G1[0])["eku"] == sorted([SERVER.dotted_string, CLIENT.dotted_string])


@pytest.mark.parametrize("variant", ["g2", "g1"])
def test_the_verifier_must_find_the_intermediate_itself(variant: str) -> None:
    """Only the leaf is in the bag: trusting the root alone (no fetch) is not enough; the
    trust a test configures (Issuer.root_pem: roots, cross-sign, intermediate) is."""
    signature, verifier, now = simulated(variant)
    issuer = sim_identity.issuer_for(variant)
    root_only = AttestationVerifier(roots_pem=issuer.anchor_pem, fetch_issuers=False)
    with pytest.raises(AttestationError, match="does not chain") as info:
        root_only.inspect(signature, now)
    assert info.value.check == "chain"
    expected = {
        "g2": ["Simulated Microsoft TLS G2 RSA CA OCSP 02", "Simulated Microsoft TLS RSA Root G2"],
        "g1": [
            "Simulated Microsoft Azure RSA TLS Issuing CA 03",
            "Simulated DigiCert Global Root G2",
        ],
    }[variant]
    assert list(verifier.inspect(signature, now).chain[1:]) == expected


def test_a_saved_issuer_loads_and_signs_the_same_shape(tmp_path: Path) -> None:
    """SIMULATOR_CA_DIR: the demo's and the bench's processes share one issuer."""
    issuer = sim_identity.issuer_for("g2")
    sim_identity.save_issuer(issuer, tmp_path)
    loaded = sim_identity.load_issuer(tmp_path)
    assert loaded.root_pem == issuer.root_pem and loaded.variant == "g2"
    now = dt.datetime.now(dt.UTC)
    content = sim_identity.attested_content("vm", "sub", "n", now=now)
    signature = sim_identity.sign(content, loaded.leaf, loaded.leaf_key)
    assert (
        AttestationVerifier(roots_pem=issuer.root_pem).verify_document(signature, now).vm_id == "vm"
    )
