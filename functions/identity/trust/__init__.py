"""The trust material the verifier ships with: Azure's roots and published intermediates.

`manifest.json` lists each PEM of this folder with its source and SHA-256 fingerprint
(`refresh.py` writes both). Only listed files are loaded, and each is checked against its
fingerprint, so the default trust is exactly what was reviewed: a document signed on any
chain Microsoft publishes verifies with no network. Roots are the self-signed entries
(DigiCert Global Root G2 and Global Root CA, Microsoft RSA Root CA 2017, Microsoft TLS RSA
Root G2); everything else (Microsoft TLS RSA Root G2 cross-signed by DigiCert, the Azure
RSA TLS issuing CAs, Microsoft TLS G2 RSA CA OCSP 02-16) is an intermediate: trusted for
nothing by itself, only as a link to a root."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import serialization

FOLDER = Path(__file__).resolve().parent


@dataclass(frozen=True)
class TrustMaterial:
    """Anchors (`roots`) and candidate links (`intermediates`) for chain building."""

    roots: tuple[x509.Certificate, ...]
    intermediates: tuple[x509.Certificate, ...] = ()

    def __add__(self, other: TrustMaterial) -> TrustMaterial:
        return TrustMaterial(self.roots + other.roots, self.intermediates + other.intermediates)


def self_signed(cert: x509.Certificate) -> bool:
    """A root names itself as its issuer (its self-signature proves nothing: an anchor is
    trusted because it was chosen; old roots such as Baltimore are signed with SHA-1)."""
    return cert.issuer == cert.subject


def from_pem(pem: str | bytes) -> TrustMaterial:
    """A PEM bundle split into roots (self-signed) and intermediates (the rest): what
    ATTESTATION_CA_PEM and `attestation check --ca-pem` hold."""
    data = pem.encode() if isinstance(pem, str) else pem
    certs = x509.load_pem_x509_certificates(data) if b"-----BEGIN" in data else []
    if not certs:
        raise ValueError("the PEM holds no certificate")
    roots = tuple(c for c in certs if self_signed(c))
    return TrustMaterial(roots, tuple(c for c in certs if not self_signed(c)))


def manifest(folder: Path = FOLDER) -> dict[str, Any]:
    result: dict[str, Any] = json.loads((folder / "manifest.json").read_text(encoding="utf-8"))
    return result


@lru_cache(maxsize=1)
def shipped() -> TrustMaterial:
    """The package's trust, each certificate checked against the manifest's fingerprint."""
    return load(FOLDER)


def load(folder: Path) -> TrustMaterial:
    roots: list[x509.Certificate] = []
    intermediates: list[x509.Certificate] = []
    for record in manifest(folder)["certificates"]:
        cert = x509.load_pem_x509_certificate((folder / record["file"]).read_bytes())
        digest = hashlib.sha256(cert.public_bytes(serialization.Encoding.DER)).hexdigest()
        if digest != record["sha256"]:
            raise ValueError(f"{record['file']}: fingerprint {digest} is not the manifest's")
        (roots if record["role"] == "root" else intermediates).append(cert)
    return TrustMaterial(tuple(roots), tuple(intermediates))
