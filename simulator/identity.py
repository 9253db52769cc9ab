"""Azure's side of VM identity, played by a test issuer: IMDS attested documents.

In Azure, `GET /metadata/attested/document?nonce=N` answers a PKCS#7 SignedData whose
content is a JSON document (`nonce`, `vmId`, `subscriptionId`, `sku`, `timeStamp`). This
module signs the same structure in Azure's exact shape, as the genuine documents in
tests/identity/genuine/ show it (tests/identity/test_shape.py holds both to one
description):

- SignedData v1, one SignerInfo naming its certificate by issuer and serial, the
  digestAlgorithm written as sha256WithRSAEncryption (1.2.840.113549.1.1.11), signature
  algorithm rsaEncryption, no signed attributes, compact JSON content;
- only the leaf in the bag; the leaf: CN and SAN `metadata.azure.com` +
  `<region>.metadata.azure.com`, key usage digitalSignature + keyEncipherment (critical),
  EKU serverAuth (G2; the G1 leaves add clientAuth), AIA caIssuers at Microsoft's URL;
- a leaf -> intermediate -> root chain: variant "g2" (current: "Microsoft TLS G2 RSA CA
  OCSP 02"-like under a "Microsoft TLS RSA Root G2"-like root, also cross-signed by a
  "DigiCert Global Root G2"-like root) or "g1" ("Microsoft Azure RSA TLS Issuing CA
  03"-like under the DigiCert-like root). Every name says "Simulated".

The verifier must find the intermediate itself: the function app trusts this issuer only
when told to (ATTESTATION_CA_PEM = `Issuer.root_pem`: the roots, the cross-sign and the
intermediate). The issuer is made once per process (or loaded from SIMULATOR_CA_DIR, so a
demo's app and simulator agree across processes).

`make_root`/`make_leaf`/`sign` let tests build what an attacker would try (a bag with a
second, untrusted signer; a self-signed `metadata.azure.com`).
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from asn1crypto import cms, core
from asn1crypto import x509 as asn1_x509
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa
from cryptography.x509.oid import AuthorityInformationAccessOID, ExtendedKeyUsageOID, NameOID

SIGNER_NAME = "metadata.azure.com"
REGION = "eastus"
SHA256_WITH_RSA = "1.2.840.113549.1.1.11"  # the digestAlgorithm OID Azure writes
DOCUMENT_LIFETIME = dt.timedelta(hours=6)
# Test certificates are valid from long ago: tests run on fixed clocks (2026-11-21 ...).
VALID_FROM = dt.datetime(2020, 1, 1, tzinfo=dt.UTC)
PKI = "http://www.microsoft.com/pkiops/certs/"
VARIANTS = {
    # variant: (intermediate CN, its root CN, leaf EKU)
    "g2": ("Simulated Microsoft TLS G2 RSA CA OCSP 02", "Simulated Microsoft TLS RSA Root G2"),
    "g1": ("Simulated Microsoft Azure RSA TLS Issuing CA 03", "Simulated DigiCert Global Root G2"),
}
ANCHOR = "Simulated DigiCert Global Root G2"


def _pem(cert: x509.Certificate) -> str:
    return cert.public_bytes(serialization.Encoding.PEM).decode()


@dataclass(frozen=True)
class Issuer:
    """Azure's attestation PKI, simulated: `root` anchors `intermediate`, which signed
    `leaf`; `links` are further CA certificates a chain may use (the G2 cross-sign)."""

    root: x509.Certificate
    root_key: rsa.RSAPrivateKey
    leaf: x509.Certificate
    leaf_key: rsa.RSAPrivateKey
    intermediate: x509.Certificate | None = None
    intermediate_key: rsa.RSAPrivateKey | None = None
    links: tuple[x509.Certificate, ...] = field(default=())
    variant: str = "g2"

    @property
    def root_pem(self) -> str:
        """What a deployment trusting this issuer configures (ATTESTATION_CA_PEM): the
        roots, the cross-sign and the intermediate; the bag holds only the leaf."""
        certs = [self.root, *self.links]
        if self.intermediate is not None:
            certs.append(self.intermediate)
        return "".join(_pem(c) for c in certs)

    @property
    def anchor_pem(self) -> str:
        """The root alone: a verifier given only this must fetch the intermediate."""
        return _pem(self.root)


def _name(common_name: str, *, leaf: bool = False) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.COUNTRY_NAME, "US")]
    if leaf:
        attrs += [
            x509.NameAttribute(NameOID.STATE_OR_PROVINCE_NAME, "WA"),
            x509.NameAttribute(NameOID.LOCALITY_NAME, "Redmond"),
        ]
    org = "DigiCert Inc" if "DigiCert" in common_name else "Microsoft Corporation"
    attrs += [
        x509.NameAttribute(NameOID.ORGANIZATION_NAME, org),
        x509.NameAttribute(NameOID.COMMON_NAME, common_name),
    ]
    return x509.Name(attrs)


def _key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def _key_usage(*, ca: bool) -> x509.KeyUsage:
    """A CA signs certificates (and CRLs); the leaf signs documents and, like the TLS
    leaves it is, enciphers keys: digitalSignature + keyEncipherment, as Azure's."""
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


def _ca(
    subject: str, key: Any, issuer: x509.Certificate | None, issuer_key: Any, *, path: int | None
) -> x509.Certificate:
    now = dt.datetime.now(dt.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(issuer.subject if issuer else _name(subject))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(VALID_FROM)
        .not_valid_after(now + dt.timedelta(days=3650))
        .add_extension(x509.BasicConstraints(ca=True, path_length=path), critical=True)
        .add_extension(_key_usage(ca=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
    )
    if issuer is not None:
        builder = builder.add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer_key.public_key()),
            critical=False,
        ).add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
    return builder.sign(issuer_key, hashes.SHA384() if issuer else hashes.SHA256())


def make_root(common_name: str = ANCHOR) -> tuple[x509.Certificate, Any]:
    key = _key()
    return _ca(common_name, key, None, key, path=None), key


def make_intermediate(
    common_name: str, issuer: x509.Certificate, issuer_key: Any, key: Any = None
) -> tuple[x509.Certificate, Any]:
    key = key or _key()
    return _ca(common_name, key, issuer, issuer_key, path=0), key


def make_leaf(
    root: x509.Certificate,
    root_key: Any,
    dns_name: str | tuple[str, ...] = (f"{REGION}.{SIGNER_NAME}", SIGNER_NAME),
    *,
    valid_days: int = 365,
    not_before_days: int | None = None,
    client_auth: bool = False,
    key: Any = None,
) -> tuple[x509.Certificate, Any]:
    """A leaf as Azure's, signed by `root` (any CA): SAN `dns_name` (one or several)."""
    names = (dns_name,) if isinstance(dns_name, str) else tuple(dns_name)
    key = key or _key()
    now = dt.datetime.now(dt.UTC)
    issuer_cn = root.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value
    url = PKI + str(issuer_cn).replace(" ", "%20") + ".crt"
    ekus = [ExtendedKeyUsageOID.SERVER_AUTH]
    if client_auth:
        ekus = [ExtendedKeyUsageOID.CLIENT_AUTH, ExtendedKeyUsageOID.SERVER_AUTH]
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(names[-1].removeprefix("*."), leaf=True))
        .issuer_name(root.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(
            VALID_FROM if not_before_days is None else now + dt.timedelta(days=not_before_days)
        )
        .not_valid_after(now + dt.timedelta(days=valid_days))
        .add_extension(
            x509.AuthorityInformationAccess(
                [
                    x509.AccessDescription(
                        AuthorityInformationAccessOID.CA_ISSUERS,
                        x509.UniformResourceIdentifier(url),
                    ),
                    x509.AccessDescription(
                        AuthorityInformationAccessOID.OCSP,
                        x509.UniformResourceIdentifier("http://oneocsp.microsoft.com/ocsp"),
                    ),
                ]
            ),
            critical=False,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(_key_usage(ca=False), critical=True)
        .add_extension(
            x509.SubjectAlternativeName([x509.DNSName(n) for n in names]), critical=False
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(root_key.public_key()),
            critical=False,
        )
        .add_extension(x509.ExtendedKeyUsage(ekus), critical=False)
        .sign(root_key, hashes.SHA384())
    )
    return cert, key


def new_issuer(variant: str = "g2") -> Issuer:
    """A fresh simulated PKI of `variant` ("g2": the chain Azure moved to from 2026-04-29;
    "g1": the Azure RSA TLS issuing CAs under DigiCert Global Root G2)."""
    inter_cn, root_cn = VARIANTS[variant]
    anchor, anchor_key = make_root(ANCHOR)
    links: tuple[x509.Certificate, ...] = ()
    if variant == "g2":
        g2_root, g2_key = make_root(root_cn)
        cross, _ = make_intermediate(root_cn, anchor, anchor_key, key=g2_key)
        links = (g2_root, cross)
        inter, inter_key = make_intermediate(inter_cn, g2_root, g2_key)
    else:
        inter, inter_key = make_intermediate(inter_cn, anchor, anchor_key)
    leaf, leaf_key = make_leaf(inter, inter_key, client_auth=variant == "g1")
    return Issuer(anchor, anchor_key, leaf, leaf_key, inter, inter_key, links, variant)


def _key_pem(key: Any) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def save_issuer(issuer: Issuer, folder: Path) -> None:
    """Write the issuer so other processes (the demo's app, relays' simulator) share it."""
    folder.mkdir(parents=True, exist_ok=True)
    assert issuer.intermediate is not None and issuer.intermediate_key is not None
    files = {
        "root.pem": _pem(issuer.root).encode(),
        "root.key": _key_pem(issuer.root_key),
        "intermediate.pem": _pem(issuer.intermediate).encode(),
        "intermediate.key": _key_pem(issuer.intermediate_key),
        "links.pem": "".join(_pem(c) for c in issuer.links).encode(),
        "leaf.pem": _pem(issuer.leaf).encode(),
        "leaf.key": _key_pem(issuer.leaf_key),
        "variant": issuer.variant.encode(),
    }
    for name, data in files.items():
        path = folder / name
        path.write_bytes(data)
        if name.endswith(".key"):
            os.chmod(path, 0o600)


def load_issuer(folder: Path) -> Issuer:
    def cert(name: str) -> x509.Certificate:
        return x509.load_pem_x509_certificate((folder / name).read_bytes())

    def key(name: str) -> Any:
        return serialization.load_pem_private_key((folder / name).read_bytes(), password=None)

    links_pem = (folder / "links.pem").read_bytes()
    links = tuple(x509.load_pem_x509_certificates(links_pem)) if links_pem.strip() else ()
    return Issuer(
        cert("root.pem"),
        key("root.key"),
        cert("leaf.pem"),
        key("leaf.key"),
        cert("intermediate.pem"),
        key("intermediate.key"),
        links,
        (folder / "variant").read_text().strip(),
    )


_lock = threading.Lock()
_issuers: dict[str, Issuer] = {}


def test_issuer() -> Issuer:
    """The process's G2 issuer (what Azure signs with since 2026-04-29): issuer_for("g2")."""
    return issuer_for("g2")


def issuer_for(variant: str) -> Issuer:
    """The process's issuer of `variant`: the G2 one from `SIMULATOR_CA_DIR` if that holds
    one (made there if empty or from an older layout), else made once in memory. RSA key
    generation takes ~100 ms a key, so it is done once."""
    with _lock:
        if variant not in _issuers:
            folder = os.environ.get("SIMULATOR_CA_DIR") if variant == "g2" else None
            if folder and (Path(folder) / "intermediate.key").exists():
                _issuers[variant] = load_issuer(Path(folder))
            else:
                _issuers[variant] = new_issuer(variant)
                if folder:
                    save_issuer(_issuers[variant], Path(folder))
        return _issuers[variant]


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
    """A base64 PKCS#7 SignedData over `content` (attached), as IMDS's `signature` field,
    in Azure's shape (see the module docstring). `extra_certs` adds certificates to the
    bag: a forger adds a genuine Azure certificate beside its own signer, hoping the
    verifier takes a certificate from the bag instead of the one the SignerInfo names."""
    if isinstance(content, bytes):
        data = content
    else:
        data = json.dumps(content, separators=(",", ":")).encode()
    leaf = asn1_x509.Certificate.load(signer.public_bytes(serialization.Encoding.DER))
    bag = [leaf] + [
        asn1_x509.Certificate.load(c.public_bytes(serialization.Encoding.DER)) for c in extra_certs
    ]
    digest = {"algorithm": SHA256_WITH_RSA, "parameters": core.Null()}
    signer_info = {
        "version": "v1",
        "sid": cms.SignerIdentifier(
            name="issuer_and_serial_number",
            value={"issuer": leaf.issuer, "serial_number": leaf.serial_number},
        ),
        "digest_algorithm": digest,
        "signature_algorithm": {"algorithm": "rsassa_pkcs1v15", "parameters": core.Null()},
        "signature": signer_key.sign(data, padding.PKCS1v15(), hashes.SHA256()),
    }
    signed = cms.SignedData(
        {
            "version": "v1",
            "digest_algorithms": [digest],
            "encap_content_info": {"content_type": "data", "content": data},
            "certificates": bag,
            "signer_infos": [signer_info],
        }
    )
    der = cms.ContentInfo({"content_type": "signed_data", "content": signed}).dump()
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
