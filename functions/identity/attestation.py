"""Verify the IMDS attested document a relay attaches to every message (contract §1).

The message body is an envelope carrying `attestation: {"signature", "nonce"}`. The
signature is the PKCS#7 SignedData IMDS answered for `nonce` = a hash of the envelope
without its `attestation` key, so Azure's signature binds *this* body to *this* VM:

1. base64 -> PKCS#7 SignedData with attached JSON content (asn1crypto parses; pyca has no
   public PKCS#7 verify API).
2. The signer is the certificate the SignerInfo's `sid` names (issuer+serial or SKI), never
   "the first certificate in the bag": the bag is an unordered SET a forger fills (SPIRE's
   2026 fix, commit 58f420c). Its RSA signature must hold over the signed attributes (whose
   messageDigest must equal the content's digest, content-type `data`) or the content.
3. That certificate chains to a trusted root (cryptography.x509.verification, webpki rules)
   and its DNS SAN is `*.<suffix>` for an allowed suffix (`metadata.azure.com` ...): any
   public CA issues certificates for other names; only Azure holds this one.
4. The signed nonce equals the binding nonce recomputed from the received body: a document
   signed for one message cannot vouch for another (edited or replayed) one.
5. The signed vmId equals the envelope's `vm.vm_id`: a VM can only get documents about
   itself, so it can only speak as itself. Subscription allow-list when configured.
6. The document is current (createdOn not in the future, expiresOn not past).

Chain verification is cached per signer-certificate fingerprint (bounded LRU, still
re-checked against the chain's validity window on every use), so the steady-state cost per
message is one RSA verify, one digest and the JSON parses.

Azure puts only the leaf in the bag; its intermediate ("Microsoft Azure RSA TLS Issuing CA
0x", "Microsoft TLS G2 RSA CA OCSP xx") is named by the leaf's AIA caIssuers URL. Where the
bag does not complete the chain, the verifier fetches that URL, but only from Microsoft's and
DigiCert's certificate hosts (no request to a host a forger names), or uses pinned
`intermediates_pem`. A fetched intermediate is trusted for nothing: the chain still has to
end at a configured root.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

from asn1crypto import cms, core
from asn1crypto import x509 as asn1_x509
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import padding, rsa
from cryptography.x509.oid import AuthorityInformationAccessOID, ExtensionOID
from cryptography.x509.verification import DNSName, PolicyBuilder, Store, VerificationError

log = logging.getLogger(__name__)

DEFAULT_SIGNER_SUFFIXES = ("metadata.azure.com", "metadata.azure.us", "metadata.azure.cn")
TIME_FORMAT = "%m/%d/%y %H:%M:%S -0000"
CLOCK_SKEW = timedelta(minutes=5)
CHAIN_CACHE_SIZE = 64  # signer certificates: Azure has a handful per cloud at a time
MAX_SIGNATURE_CHARS = 64 * 1024  # an IMDS signature is ~3-4 KB of base64
MAX_BAG_CERTIFICATES = 8
# Where Azure's attestation leaves point for their issuer (AIA caIssuers). Only these are
# fetched: a forged leaf must not make the app request a URL of the forger's choosing.
ISSUER_HOSTS = frozenset(
    {
        "www.microsoft.com",
        "caissuers.microsoft.com",
        "cacerts.digicert.com",
        "cacerts.digicert.cn",
        "cacerts.geotrust.com",
    }
)
ISSUER_FETCH_TIMEOUT = 5.0
ISSUER_MAX_BYTES = 64 * 1024

_HASHES: dict[str, type[hashes.HashAlgorithm]] = {
    "sha1": hashes.SHA1,
    "sha256": hashes.SHA256,
    "sha384": hashes.SHA384,
    "sha512": hashes.SHA512,
}


class AttestationError(ValueError):
    """The message's attestation does not hold. The message is safe to record: it starts
    with "attestation: " and holds no secret (only ids, times and our own reasons).

    `check` names the check that failed, one of CHECKS, so a report-mode rollout and the
    operator's `attestation check` can say exactly which rule Azure's document broke."""

    def __init__(self, reason: str, check: str = "format") -> None:
        super().__init__(f"attestation: {reason}"[:1000])
        self.check = check


# The checks an AttestationError can name (its `check`).
CHECKS = (
    "format",  # not JSON / not PKCS#7 / no signature / missing fields
    "signature",  # digest or signature algorithm, signed attributes, RSA signature
    "signer_name",  # the signer certificate's DNS names are not Azure's attestation names
    "chain",  # the signer does not chain to a shipped (or configured) root
    "nonce",  # the signed nonce is not this message's
    "vm_id",  # the signed vmId is not the one the message claims
    "subscription",  # the signed subscription is not in the allow-list
    "time",  # createdOn in the future / expiresOn past / chain not valid now
)


class AttestationUnavailable(RuntimeError):
    """The document could not be checked *now* (an unknown intermediate could not be
    fetched): the message must be retried, never rejected for good, because a genuine
    Terminate would otherwise be lost to a network blip."""


@dataclass(frozen=True)
class Attested:
    """What Azure signed about the sender, after every check held."""

    vm_id: str
    subscription_id: str
    created_on: datetime
    expires_on: datetime


def canonical(obj: Any) -> bytes:
    """The contract's canonical JSON (sorted keys, no spaces, UTF-8)."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode(
        "utf-8"
    )


def binding_nonces(envelope: dict[str, Any]) -> tuple[str, str]:
    """(32-hex form, 10-digit form) of the nonce that binds `envelope` (its `attestation`
    key, if any, left out). The relay uses the first; the second only if IMDS refuses 32
    characters (the public page documents 10 digits, the REST spec up to 32)."""
    body = {k: v for k, v in envelope.items() if k != "attestation"}
    h = hashlib.sha256(canonical(body)).hexdigest()
    return h[:32], f"{int(h[:15], 16) % 10**10:010d}"


def parse_time(value: object, field: str) -> datetime:
    if not isinstance(value, str):
        raise AttestationError(f"timeStamp.{field} missing")
    try:
        return datetime.strptime(value, TIME_FORMAT).replace(tzinfo=UTC)
    except ValueError:
        raise AttestationError(f"timeStamp.{field} {value[:40]!r} is not a time") from None


def _utc(moment: datetime) -> datetime:
    """`now` as an aware UTC time (a naive one is taken as UTC, as the clock module's)."""
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


def _strict_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """JSON objects with a key twice are refused: two parsers could read different values
    while the nonce is computed from one of them."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {key[:40]!r}")
        out[key] = value
    return out


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def strict_json(data: bytes | str) -> Any:
    return json.loads(data, object_pairs_hook=_strict_object, parse_constant=_no_constants)


def load_pem_certificates(pem: str) -> list[x509.Certificate]:
    return x509.load_pem_x509_certificates(pem.encode())


def _default_roots() -> list[x509.Certificate]:
    """certifi's bundle, one certificate at a time: a root that cryptography refuses (or
    warns about, like a non-positive serial) is skipped, not fatal for all the others."""
    import warnings

    import certifi

    roots = []
    for block in certifi.contents().split("-----END CERTIFICATE-----"):
        if "-----BEGIN CERTIFICATE-----" not in block:
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                roots.append(
                    x509.load_pem_x509_certificate((block + "-----END CERTIFICATE-----").encode())
                )
            except ValueError:
                continue
    return roots


def fetch_issuer(url: str) -> bytes:
    """GET an AIA caIssuers URL (only ISSUER_HOSTS; no redirects; size-bounded)."""
    import requests

    with requests.get(
        url, timeout=ISSUER_FETCH_TIMEOUT, allow_redirects=False, stream=True
    ) as answer:
        answer.raise_for_status()
        data = answer.raw.read(ISSUER_MAX_BYTES + 1, decode_content=True)
    if len(data) > ISSUER_MAX_BYTES:
        raise ValueError("issuer certificate too large")
    return data


def _load_any_certificates(data: bytes) -> list[x509.Certificate]:
    """A caIssuers answer: DER certificate, PEM, or a degenerate PKCS#7 of certificates."""
    if b"-----BEGIN" in data:
        return x509.load_pem_x509_certificates(data)
    try:
        return [x509.load_der_x509_certificate(data)]
    except ValueError:
        from cryptography.hazmat.primitives.serialization import pkcs7

        return list(pkcs7.load_der_pkcs7_certificates(data))


@dataclass(frozen=True)
class _Chain:
    """A verified signer: valid for chaining while `not_before <= now < not_after` (the
    intersection of every certificate's validity in the chain)."""

    not_before: datetime
    not_after: datetime
    key: Any  # the signer's public key, so a cached signer is not parsed again


class AttestationVerifier:
    """Verifies messages; thread-safe; build one per process and keep it (the chain cache)."""

    def __init__(
        self,
        roots_pem: str | None = None,
        signer_suffixes: Iterable[str] = DEFAULT_SIGNER_SUFFIXES,
        allowed_subscriptions: frozenset[str] = frozenset(),
        *,
        intermediates_pem: str | None = None,
        issuer_fetcher: Callable[[str], bytes] | None = None,
        fetch_issuers: bool | None = None,
        cache_size: int = CHAIN_CACHE_SIZE,
    ) -> None:
        """`roots_pem` replaces the public roots (tests, the simulator: ATTESTATION_CA_PEM).
        `intermediates_pem` pins intermediates where the app cannot reach the caIssuers
        hosts; `fetch_issuers` (default: on with the public roots, off with `roots_pem`)
        fetches a missing intermediate from the leaf's AIA URL through `issuer_fetcher`."""
        if roots_pem is not None:
            roots = load_pem_certificates(roots_pem)
            if not roots:
                raise ValueError("roots_pem holds no certificate")
            log.warning(
                "attestation: trusting %d configured root(s) instead of the public roots "
                "(ATTESTATION_CA_PEM): for tests and the simulator only",
                len(roots),
            )
        else:
            roots = _default_roots()
        self._store = Store(roots)
        self.suffixes = tuple(s.strip().strip(".").lower() for s in signer_suffixes if s.strip())
        if not self.suffixes:
            raise ValueError("no attestation signer suffix")
        self.allowed_subscriptions = frozenset(s.lower() for s in allowed_subscriptions)
        self._pinned = load_pem_certificates(intermediates_pem) if intermediates_pem else []
        self._fetch_issuers = roots_pem is None if fetch_issuers is None else fetch_issuers
        self._issuer_fetcher = issuer_fetcher or fetch_issuer
        self._issuers: OrderedDict[str, list[x509.Certificate]] = OrderedDict()
        self._chains: OrderedDict[bytes, _Chain] = OrderedDict()  # by SHA-256 of the DER
        self._cache_size = max(1, cache_size)
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ the message

    def verify(self, body: bytes | str, now: datetime) -> Attested:
        """Check the whole message body (bytes as received); raise AttestationError."""
        now = _utc(now)
        try:
            envelope = strict_json(body)
        except (ValueError, UnicodeDecodeError) as exc:
            raise AttestationError(f"message is not JSON ({str(exc)[:80]})") from None
        if not isinstance(envelope, dict):
            raise AttestationError("message is not a JSON object")
        attestation = envelope.get("attestation")
        if attestation is None:
            raise AttestationError("missing")
        if not isinstance(attestation, dict) or not isinstance(attestation.get("signature"), str):
            raise AttestationError("attestation.signature missing")
        vm = envelope.get("vm")
        claimed = vm.get("vm_id") if isinstance(vm, dict) else None
        if not isinstance(claimed, str) or not claimed:
            raise AttestationError("envelope has no vm.vm_id")

        content = self.verify_signature(attestation["signature"], now)
        document = self._document(content)

        if document["nonce"] not in binding_nonces(envelope):
            raise AttestationError("nonce does not match this message")
        vm_id = document["vmId"]
        if vm_id.lower() != claimed.lower():
            raise AttestationError(f"vmId {vm_id[:40]} does not match vm.vm_id {claimed[:40]!r}")
        subscription = document["subscriptionId"]
        if self.allowed_subscriptions and subscription.lower() not in self.allowed_subscriptions:
            raise AttestationError(f"subscription {subscription[:40]} not allowed")
        stamp = document["timeStamp"]
        created = parse_time(stamp.get("createdOn"), "createdOn")
        expires = parse_time(stamp.get("expiresOn"), "expiresOn")
        if created > now + CLOCK_SKEW:
            raise AttestationError(f"created in the future at {created.isoformat()}")
        if expires <= now:
            raise AttestationError(f"expired at {expires.isoformat()}")
        return Attested(vm_id.lower(), subscription.lower(), created, expires)

    @staticmethod
    def _document(content: bytes) -> dict[str, Any]:
        try:
            document = strict_json(content)
        except (ValueError, UnicodeDecodeError):
            raise AttestationError("signed content is not JSON") from None
        if not isinstance(document, dict):
            raise AttestationError("signed content is not a JSON object")
        for key in ("nonce", "vmId", "subscriptionId"):
            if not isinstance(document.get(key), str):
                raise AttestationError(f"signed content has no {key}")
        if not isinstance(document.get("timeStamp"), dict):
            raise AttestationError("signed content has no timeStamp")
        return document

    # ------------------------------------------------------------------ PKCS#7

    def verify_signature(self, signature: str, now: datetime) -> bytes:
        """Checks 1-3: the signed content (bytes) if Azure signed it, else AttestationError."""
        now = _utc(now)
        if len(signature) > MAX_SIGNATURE_CHARS:
            raise AttestationError("signature too large")
        try:
            der = base64.b64decode(signature, validate=True)
        except (binascii.Error, ValueError):
            raise AttestationError("signature is not base64") from None
        try:
            signed_data = _signed_data(der)
            content = _content(signed_data)
            signer_info, signer, others = _signer(signed_data)
            signer_der = signer.dump()
        except AttestationError:
            raise
        except Exception:  # asn1crypto parses lazily: garbage fails wherever it is read
            raise AttestationError("signature is not well-formed PKCS#7 SignedData") from None
        fingerprint = hashlib.sha256(signer_der).digest()
        with self._lock:
            known = self._chains.get(fingerprint)
            if known is not None:
                self._chains.move_to_end(fingerprint)
        if known is None:
            leaf = x509.load_der_x509_certificate(signer_der)
            key = leaf.public_key()
        else:
            key = known.key
        if not isinstance(key, rsa.RSAPublicKey):
            raise AttestationError("signer key is not RSA")
        _check_signature(signer_info, key, content)
        if known is None:
            bag = [x509.load_der_x509_certificate(c.dump()) for c in others]
            self._remember(fingerprint, self._verify_chain(leaf, bag, now), key)
        elif not known.not_before <= now < known.not_after:
            raise AttestationError(
                f"signer certificate chain not valid at {now.isoformat()} (valid "
                f"{known.not_before.isoformat()} to {known.not_after.isoformat()})"
            )
        return content

    # ------------------------------------------------------------------ chain

    def _suffix_of(self, leaf: x509.Certificate) -> str:
        """The allowed suffix whose wildcard the leaf's DNS SAN holds."""
        try:
            san = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        except (x509.ExtensionNotFound, ValueError):
            raise AttestationError("signer certificate has no subjectAltName") from None
        names = {n.lower() for n in san.get_values_for_type(x509.DNSName)}
        for suffix in self.suffixes:
            if f"*.{suffix}" in names:
                return suffix
        shown = ", ".join(sorted(names))[:120]
        raise AttestationError(f"signer certificate is for {shown or 'no DNS name'}, not Azure")

    def _verify_chain(
        self, leaf: x509.Certificate, bag: list[x509.Certificate], now: datetime
    ) -> tuple[datetime, datetime]:
        """Check 3 for a signer not seen yet: (not before, not after) of the verified chain."""
        suffix = self._suffix_of(leaf)
        verifier = (
            PolicyBuilder()
            .store(self._store)
            .time(now.replace(tzinfo=None))
            .build_server_verifier(DNSName(f"attest.{suffix}"))
        )
        intermediates = [*bag, *self._pinned]
        try:
            chain = verifier.verify(leaf, intermediates)
        except VerificationError as first:
            fetched = self._fetched_issuers(leaf) if self._fetch_issuers else []
            if not fetched:
                raise self._chain_error(first) from None
            try:
                chain = verifier.verify(leaf, [*intermediates, *fetched])
            except VerificationError as second:
                raise self._chain_error(second) from None
        return (
            max(c.not_valid_before_utc for c in chain),
            min(c.not_valid_after_utc for c in chain),
        )

    def _remember(self, fingerprint: bytes, window: tuple[datetime, datetime], key: Any) -> None:
        with self._lock:
            self._chains[fingerprint] = _Chain(window[0], window[1], key)
            while len(self._chains) > self._cache_size:
                self._chains.popitem(last=False)

    @staticmethod
    def _chain_error(exc: VerificationError) -> AttestationError:
        detail = str(exc).split(" (encountered", 1)[0][:160]
        return AttestationError(
            f"signer does not chain to a trusted root ({detail})", check="chain"
        )

    def _fetched_issuers(self, leaf: x509.Certificate) -> list[x509.Certificate]:
        """The leaf's caIssuers certificates, from allowed hosts only, cached per URL."""
        try:
            aia = leaf.extensions.get_extension_for_oid(
                ExtensionOID.AUTHORITY_INFORMATION_ACCESS
            ).value
        except (x509.ExtensionNotFound, ValueError):
            return []
        found: list[x509.Certificate] = []
        for desc in aia:
            if desc.access_method != AuthorityInformationAccessOID.CA_ISSUERS:
                continue
            if not isinstance(desc.access_location, x509.UniformResourceIdentifier):
                continue
            url = desc.access_location.value
            parts = urlsplit(url)
            if parts.scheme not in ("http", "https") or parts.hostname not in ISSUER_HOSTS:
                log.info("attestation: not fetching issuer from %s", url[:200])
                continue
            with self._lock:
                cached = self._issuers.get(url)
            if cached is None:
                try:
                    cached = _load_any_certificates(self._issuer_fetcher(url))
                except Exception as exc:  # network, HTTP, parse: the chain just stays short
                    log.warning("attestation: issuer %s not fetched: %r", url[:200], exc)
                    continue
                with self._lock:
                    self._issuers[url] = cached
                    while len(self._issuers) > self._cache_size:
                        self._issuers.popitem(last=False)
            found.extend(cached)
        return found


# ---------------------------------------------------------------------- PKCS#7 helpers


def _signed_data(der: bytes) -> cms.SignedData:
    try:
        info = cms.ContentInfo.load(der, strict=True)
        kind = info["content_type"].native
    except Exception:  # asn1crypto raises ValueError, TypeError, KeyError... on garbage
        raise AttestationError("signature is not PKCS#7") from None
    if kind != "signed_data":
        raise AttestationError(f"signature is PKCS#7 {str(kind)[:40]}, not SignedData")
    return info["content"]


def _content(signed_data: cms.SignedData) -> bytes:
    encap = signed_data["encap_content_info"]
    if encap["content_type"].native != "data":
        raise AttestationError("signed content type is not data")
    content = encap["content"].native
    if not isinstance(content, bytes) or not content:
        raise AttestationError("signed content is not attached")
    return content


def _signer(
    signed_data: cms.SignedData,
) -> tuple[cms.SignerInfo, asn1_x509.Certificate, list[asn1_x509.Certificate]]:
    """The one SignerInfo, the bag certificate its `sid` names (exactly one), and the
    other certificates of the bag (candidate intermediates, trusted for nothing)."""
    infos = list(signed_data["signer_infos"])
    if len(infos) != 1:
        raise AttestationError(f"{len(infos)} signers, expected 1")
    info = infos[0]
    sid = info["sid"]
    certs = [c.chosen for c in signed_data["certificates"] or () if c.name == "certificate"]
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
        raise AttestationError("the signer's certificate is not in the signature")
    if len(matches) > 1:
        raise AttestationError("more than one certificate matches the signer")
    others = [c for c in certs if c is not matches[0]]
    return info, matches[0], others


def _check_signature(info: cms.SignerInfo, key: rsa.RSAPublicKey, content: bytes) -> None:
    digest_name = info["digest_algorithm"]["algorithm"].native
    hash_type = _HASHES.get(digest_name)
    if hash_type is None:
        raise AttestationError(f"digest algorithm {digest_name} not accepted")
    sig_algo = info["signature_algorithm"]
    try:
        algo = sig_algo.signature_algo
    except ValueError:
        algo = None
    if algo != "rsassa_pkcs1v15":
        raise AttestationError(f"signature algorithm {sig_algo['algorithm'].dotted} not accepted")
    try:
        named_hash = sig_algo.hash_algo
    except ValueError:
        named_hash = None  # plain rsaEncryption names no hash: the digest algorithm rules
    if named_hash not in (None, digest_name):
        raise AttestationError("signature and digest algorithms disagree")
    signed_attrs = info["signed_attrs"]
    if not isinstance(signed_attrs, core.Void):
        _check_signed_attributes(signed_attrs, hash_type, content)
        # CMS: the signature covers the attributes' DER with the SET OF tag (0x31), not the
        # [0] IMPLICIT tag they travel with; the bytes are the received ones.
        raw = signed_attrs.dump()
        message = b"\x31" + raw[1:]
    else:
        message = content
    try:
        key.verify(info["signature"].native, message, padding.PKCS1v15(), hash_type())
    except InvalidSignature:
        raise AttestationError("signature does not verify") from None


def _check_signed_attributes(
    attrs: cms.CMSAttributes, hash_type: type[hashes.HashAlgorithm], content: bytes
) -> None:
    values: dict[str, list[Any]] = {}
    for attr in attrs:
        name = attr["type"].native
        if name in values:
            raise AttestationError(f"signed attribute {name} repeated")
        values[name] = list(attr["values"])
    kinds = values.get("content_type")
    if not kinds or len(kinds) != 1 or kinds[0].native != "data":
        raise AttestationError("signed content-type attribute is not data")
    digests = values.get("message_digest")
    if not digests or len(digests) != 1:
        raise AttestationError("signed attributes have no message digest")
    h = hashes.Hash(hash_type())
    h.update(content)
    if digests[0].native != h.finalize():
        raise AttestationError("message digest does not match the content")
