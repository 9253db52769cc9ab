"""Azure's side of VM identity, played by a test issuer: IMDS attested documents.

In Azure, `GET /metadata/attested/document?nonce=N` answers a PKCS#7 SignedData whose
content is a JSON document (`nonce`, `vmId`, `subscriptionId`, `sku`, `timeStamp`) and whose
signer is a certificate for `*.metadata.azure.com` chaining to a public root. Here the same
structure is signed by a test CA made once per process (or loaded from `SIMULATOR_CA_DIR`, so
a demo's app and simulator agree across processes). The function app trusts this CA only
when told to (`ATTESTATION_CA_PEM`); in production it trusts the public roots alone.

`forge_*` helpers build the documents an attacker would try (a bag with a second, untrusted
signer first; a self-signed `*.metadata.azure.com`), so tests can show each is refused.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.hazmat.primitives.serialization import pkcs7
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

SIGNER_NAME = "*.metadata.azure.com"
# The published api-versions and the nonce bound live in simulator.instance (no cryptography
# needed to check a request); re-exported here.

DOCUMENT_LIFETIME = dt.timedelta(hours=6)
# Test certificates are valid from long ago: tests run on fixed clocks (2026-11-21 ...).
VALID_FROM = dt.datetime(2020, 1, 1, tzinfo=dt.UTC)


@dataclass(frozen=True)
class Issuer:
    """A root CA and the leaf that signs attested documents (a stand-in for Microsoft's)."""

    root: x509.Certificate
    root_key: rsa.RSAPrivateKey
    leaf: x509.Certificate
    leaf_key: rsa.RSAPrivateKey

    @property
    def root_pem(self) -> str:
        return self.root.public_bytes(serialization.Encoding.PEM).decode()


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def _key_usage(*, ca: bool) -> x509.KeyUsage:
    """A CA signs certificates; the leaf signs documents (and, like TLS leaves, enciphers)."""
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=not ca,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=ca,
        crl_sign=ca,
        encipher_only=False,
        decipher_only=False,
    )


def make_root(common_name: str = "Relay Simulator Test Root") -> tuple[x509.Certificate, Any]:
    key = _key()
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
        .issuer_name(_name(common_name))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(VALID_FROM)
        .not_valid_after(now + dt.timedelta(days=3650))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(_key_usage(ca=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return cert, key


def make_leaf(
    root: x509.Certificate,
    root_key: Any,
    dns_name: str = SIGNER_NAME,
    *,
    valid_days: int = 365,
    not_before_days: int | None = None,
) -> tuple[x509.Certificate, Any]:
    key = _key()
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(dns_name.lstrip("*.")))
        .issuer_name(root.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(
            VALID_FROM if not_before_days is None else now + dt.timedelta(days=not_before_days)
        )
        .not_valid_after(now + dt.timedelta(days=valid_days))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(dns_name)]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(ca=False), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(root_key.public_key()),
            critical=False,
        )
        .sign(root_key, hashes.SHA256())
    )
    return cert, key


def new_issuer() -> Issuer:
    root, root_key = make_root()
    leaf, leaf_key = make_leaf(root, root_key)
    return Issuer(root, root_key, leaf, leaf_key)


def _pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _key_pem(key: Any) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def save_issuer(issuer: Issuer, folder: Path) -> None:
    """Write the issuer so other processes (the demo's app, relays' simulator) share it."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in (
        ("root.pem", _pem(issuer.root)),
        ("root.key", _key_pem(issuer.root_key)),
        ("leaf.pem", _pem(issuer.leaf)),
        ("leaf.key", _key_pem(issuer.leaf_key)),
    ):
        path = folder / name
        path.write_bytes(data)
        if name.endswith(".key"):
            os.chmod(path, 0o600)


def load_issuer(folder: Path) -> Issuer:
    def cert(name: str) -> x509.Certificate:
        return x509.load_pem_x509_certificate((folder / name).read_bytes())

    def key(name: str) -> Any:
        return serialization.load_pem_private_key((folder / name).read_bytes(), password=None)

    return Issuer(cert("root.pem"), key("root.key"), cert("leaf.pem"), key("leaf.key"))


_lock = threading.Lock()
_issuer: Issuer | None = None


def test_issuer() -> Issuer:
    """The process's issuer: from `SIMULATOR_CA_DIR` if it holds one (made there if empty),
    else made once in memory. RSA key generation takes ~100 ms, so it is done once."""
    global _issuer
    with _lock:
        if _issuer is None:
            folder = os.environ.get("SIMULATOR_CA_DIR")
            if folder and (Path(folder) / "leaf.key").exists():
                _issuer = load_issuer(Path(folder))
            else:
                _issuer = new_issuer()
                if folder:
                    save_issuer(_issuer, Path(folder))
        return _issuer


def _stamp(moment: dt.datetime) -> str:
    """The attested document's time format: `11/28/18 00:16:17 -0000`."""
    return moment.astimezone(dt.UTC).strftime("%m/%d/%y %H:%M:%S -0000")


def attested_content(
    vm_id: str,
    subscription_id: str,
    nonce: str,
    *,
    now: dt.datetime | None = None,
    lifetime: dt.timedelta = DOCUMENT_LIFETIME,
    sku: str = "22_04-lts-gen2",
) -> dict[str, Any]:
    """The signed JSON, as Microsoft's page shows it."""
    created = now or dt.datetime.now(dt.UTC)
    return {
        "licenseType": "",
        "nonce": nonce,
        "plan": {"name": "", "product": "", "publisher": ""},
        "sku": sku,
        "subscriptionId": subscription_id,
        "timeStamp": {"createdOn": _stamp(created), "expiresOn": _stamp(created + lifetime)},
        "vmId": vm_id,
    }


def sign(
    content: dict[str, Any] | bytes,
    signer: x509.Certificate,
    signer_key: Any,
    *,
    extra_certs: tuple[x509.Certificate, ...] = (),
) -> str:
    """A base64 PKCS#7 SignedData over `content` (attached), as IMDS's `signature` field.

    `extra_certs` adds certificates to the bag: a forger adds a genuine Azure certificate
    beside its own signer, hoping the verifier takes a certificate from the bag (DER sorts
    the set, so its order is no signal) instead of the one the SignerInfo names."""
    data = content if isinstance(content, bytes) else json.dumps(content).encode()
    builder = pkcs7.PKCS7SignatureBuilder().set_data(data)
    builder = builder.add_signer(signer, signer_key, hashes.SHA256())
    for cert in extra_certs:
        builder = builder.add_certificate(cert)
    der = builder.sign(serialization.Encoding.DER, [pkcs7.PKCS7Options.Binary])
    return base64.b64encode(der).decode()


def attested_document(
    vm_id: str,
    subscription_id: str,
    nonce: str,
    issuer: Issuer | None = None,
    now: dt.datetime | None = None,
) -> dict[str, str]:
    """IMDS's answer: `{"encoding": "pkcs7", "signature": ...}`."""
    issuer = issuer or test_issuer()
    content = attested_content(vm_id, subscription_id, nonce, now=now)
    return {"encoding": "pkcs7", "signature": sign(content, issuer.leaf, issuer.leaf_key)}
