"""Verify the IMDS attested document a relay attaches to every message (contract §1).

The message body is an envelope carrying `attestation: {"signature", "nonce"}`. The
signature is the PKCS#7 SignedData IMDS answered for `nonce` = a hash of the envelope
without its `attestation` key, so Azure's signature binds *this* body to *this* VM:

1. base64 -> PKCS#7 SignedData with attached JSON content (functions.identity.pkcs7).
2. The signer is the certificate the SignerInfo's `sid` names, never "the first
   certificate in the bag". Its RSA signature must hold with a SHA-256/384/512 digest,
   written as Azure writes it (sha256WithRSAEncryption) or as the plain hash OID.
3. The signer's DNS names include `metadata.azure.<com|us|cn>` (the configured suffixes)
   or a subdomain of one (`eastus.metadata.azure.com`; a `*.` wildcard counts as a
   subdomain form). Any public CA issues certificates for other names; only Microsoft
   holds these. The chain is then built for a name the leaf holds, to the shipped roots
   (functions/identity/trust: DigiCert Global Root G2, Microsoft RSA Root CA 2017,
   Microsoft TLS RSA Root G2) through the shipped intermediates, with webpki rules
   (cryptography.x509.verification: the leaf's serverAuth EKU, key sizes, validity).
4. The signed nonce equals the binding nonce recomputed from the received body.
5. The signed vmId equals the envelope's `vm.vm_id`; subscription allow-list if set.
6. The document is current (createdOn not in the future, expiresOn not past).

Each refusal is an AttestationError naming its `check` (attestation_errors.CHECKS).

Cheap checks first (issue 32: what one message may cost does not depend on what it
holds). The signed JSON is plain bytes inside the PKCS#7, readable before anything is
verified, so checks 4-6 run on it right after parsing: a document whose nonce, vmId,
subscription or times are wrong is refused before any RSA operation or chain building
(it would be refused anyway, genuine signature or not). Then the signature (one RSA
verify), then the chain.

Chain verification is cached per signer-certificate fingerprint (bounded LRU, still
re-checked against the chain's validity window on every use), so the steady-state cost per
message is one RSA verify, one digest and the JSON parses.

Only the leaf is in Azure's bag. An intermediate the shipped trust lacks (Microsoft adds
them without notice) is fetched from the leaf's AIA caIssuers URLs under the rules of
functions.identity.issuers (allowed hosts as the connection parses them, ports 80/443)
and the budget of functions.identity.issuer_cache (at most 2 URLs a leaf, else refused;
ONE 5 s deadline for every fetch of the message; bounded caches with a TTL); a fetch
that fails for the network raises AttestationUnavailable (retry). A fetched certificate
is trusted for nothing: the chain still has to end at a root of the trust.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from cryptography import x509
from cryptography.x509.oid import AuthorityInformationAccessOID, NameOID
from cryptography.x509.verification import DNSName, PolicyBuilder, Store, VerificationError

from functions.identity import issuer_cache, issuers, pkcs7, trust
from functions.identity.attestation_errors import CHECKS, AttestationError, AttestationUnavailable

__all__ = [
    "CHECKS",
    "AttestationError",
    "AttestationUnavailable",
    "AttestationVerifier",
    "Attested",
    "Signed",
    "binding_nonces",
    "canonical",
]

log = logging.getLogger(__name__)

DEFAULT_SIGNER_SUFFIXES = ("metadata.azure.com", "metadata.azure.us", "metadata.azure.cn")
TIME_FORMAT = "%m/%d/%y %H:%M:%S -0000"
CLOCK_SKEW = timedelta(minutes=5)
CHAIN_CACHE_SIZE = 64  # signer certificates: Azure has a handful per cloud at a time
MAX_SIGNATURE_CHARS = 64 * 1024  # an IMDS signature is ~3-4 KB of base64
FAILURE_TTL = issuer_cache.FAILURE_TTL  # seconds a failed issuer fetch is not retried
_LABEL = set("abcdefghijklmnopqrstuvwxyz0123456789-")


@dataclass(frozen=True)
class Attested:
    """What Azure signed about the sender, after every check held."""

    vm_id: str
    subscription_id: str
    created_on: datetime
    expires_on: datetime


@dataclass(frozen=True)
class Signed:
    """A signature that holds: its content, the signer's DNS names, the chain built
    (subject common names, leaf first)."""

    content: bytes
    signer_names: tuple[str, ...]
    chain: tuple[str, ...]


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


def signer_name(names: Iterable[str], suffixes: Iterable[str]) -> str | None:
    """The DNS name to build the chain for: an allowed suffix itself, else a subdomain of
    one (letters, digits, hyphens), else a wildcard over one (checked as `attest.<suffix>`,
    a name the wildcard covers). None: the certificate is not Azure's attestation signer."""
    names = [n.lower().rstrip(".") for n in names]
    for suffix in suffixes:
        if suffix in names:
            return suffix
    for suffix in suffixes:
        for name in names:
            head = name[: -len(suffix) - 1]
            if name.endswith("." + suffix) and all(
                label and set(label) <= _LABEL for label in head.split(".")
            ):
                return name
    for suffix in suffixes:
        if f"*.{suffix}" in names:
            return f"attest.{suffix}"
    return None


def _common_name(cert: x509.Certificate) -> str:
    values = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    return str(values[0].value) if values else cert.subject.rfc4514_string()


@dataclass(frozen=True)
class _Chain:
    """A verified signer: valid for chaining while `not_before <= now < not_after` (the
    intersection of every certificate's validity in the chain)."""

    not_before: datetime
    not_after: datetime
    key: Any  # the signer's public key, so a cached signer is not parsed again
    names: tuple[str, ...]
    path: tuple[str, ...]


class AttestationVerifier:
    """Verifies messages; thread-safe; build one per process and keep it (the chain cache)."""

    def __init__(
        self,
        roots_pem: str | None = None,
        signer_suffixes: Iterable[str] = DEFAULT_SIGNER_SUFFIXES,
        allowed_subscriptions: frozenset[str] = frozenset(),
        *,
        extra_pem: str | None = None,
        intermediates_pem: str | None = None,
        issuer_fetcher: issuer_cache.Fetcher | None = None,
        fetch_issuers: bool | None = None,
        cache_size: int = CHAIN_CACHE_SIZE,
    ) -> None:
        """Trust: the shipped roots and intermediates (functions/identity/trust), unless
        `roots_pem` replaces them (tests, the simulator: ATTESTATION_CA_PEM; self-signed
        certificates in it are roots, the others intermediates). `extra_pem` adds to the
        trust (`attestation check --ca-pem`, a chain since retired), `intermediates_pem`
        adds intermediates only. `fetch_issuers` (default: on with the shipped trust, off
        with `roots_pem`) fetches a missing intermediate through `issuer_fetcher`
        (called as `issuer_fetcher(url, deadline=seconds)`)."""
        if roots_pem is not None:
            material = trust.from_pem(roots_pem)
            if not material.roots:
                raise ValueError("roots_pem holds no self-signed (root) certificate")
            log.warning(
                "attestation: trusting %d configured root(s) instead of the shipped ones "
                "(ATTESTATION_CA_PEM): for tests and the simulator only",
                len(material.roots),
            )
        else:
            material = trust.shipped()
        if extra_pem:
            material = material + trust.from_pem(extra_pem)
        if intermediates_pem:
            material = material + trust.TrustMaterial(
                (), tuple(load_pem_certificates(intermediates_pem))
            )
        self._store = Store(list(material.roots))
        self._roots = list(material.roots)
        self._intermediates = list(material.intermediates)
        self.suffixes = tuple(s.strip().strip(".").lower() for s in signer_suffixes if s.strip())
        if not self.suffixes:
            raise ValueError("no attestation signer suffix")
        self.allowed_subscriptions = frozenset(s.lower() for s in allowed_subscriptions)
        self._fetch_issuers = roots_pem is None if fetch_issuers is None else fetch_issuers
        self.issuers = issuer_cache.IssuerCache(issuer_fetcher, time.monotonic, cache_size)
        self._chains: OrderedDict[bytes, _Chain] = OrderedDict()  # by SHA-256 of the DER
        self._cache_size = max(1, cache_size)
        self._lock = threading.Lock()

    @property
    def clock(self) -> Callable[[], float]:
        """The monotonic clock of the issuer fetches' deadline and caches (tests move it)."""
        return self.issuers.clock

    @clock.setter
    def clock(self, value: Callable[[], float]) -> None:
        self.issuers.clock = value

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
        nonces = binding_nonces(envelope)
        return self.verify_document(attestation["signature"], now, nonces=nonces, vm_id=claimed)

    def verify_document(
        self,
        signature: str,
        now: datetime,
        *,
        nonces: Iterable[str] | None = None,
        vm_id: str | None = None,
    ) -> Attested:
        """Checks 1-6 on IMDS's `signature`; the nonce and vmId only when given. The signed
        JSON's checks (4-6) run first, before any RSA operation or chain building."""
        now = _utc(now)
        parsed = self._parse(signature)
        document = self._document(parsed[1])
        attested = self._check_content(document, now, nonces, vm_id)
        self._check_signer(parsed, now)
        return attested

    def _check_content(
        self,
        document: dict[str, Any],
        now: datetime,
        nonces: Iterable[str] | None,
        vm_id: str | None,
    ) -> Attested:
        """Checks 4-6 on the signed JSON (not yet known to be Azure's: a refusal here holds
        whoever signed it, an acceptance means nothing until the signature holds)."""
        if nonces is not None and document["nonce"] not in tuple(nonces):
            raise AttestationError("nonce does not match this message", check="nonce")
        signed_vm = document["vmId"]
        if vm_id is not None and signed_vm.lower() != vm_id.lower():
            raise AttestationError(
                f"vmId {signed_vm[:40]} does not match vm.vm_id {vm_id[:40]!r}", check="vm_id"
            )
        subscription = document["subscriptionId"]
        if self.allowed_subscriptions and subscription.lower() not in self.allowed_subscriptions:
            raise AttestationError(f"subscription {subscription[:40]} not allowed", "subscription")
        stamp = document["timeStamp"]
        created = parse_time(stamp.get("createdOn"), "createdOn")
        expires = parse_time(stamp.get("expiresOn"), "expiresOn")
        if created > now + CLOCK_SKEW:
            raise AttestationError(f"created in the future at {created.isoformat()}", "time")
        if expires <= now:
            raise AttestationError(f"expired at {expires.isoformat()}", check="time")
        return Attested(signed_vm.lower(), subscription.lower(), created, expires)

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
        return self.inspect(signature, now).content

    def inspect(self, signature: str, now: datetime) -> Signed:
        """Checks 1-3, with what they found (the operator's `attestation check` prints it)."""
        now = _utc(now)
        parsed = self._parse(signature)
        known = self._check_signer(parsed, now)
        return Signed(parsed[1], known.names, known.path)

    @staticmethod
    def _parse(signature: str) -> tuple[Any, bytes, Any, Any]:
        """Check 1: (SignerInfo, content, signer certificate, other bag certificates)."""
        if len(signature) > MAX_SIGNATURE_CHARS:
            raise AttestationError("signature too large")
        try:
            der = base64.b64decode(signature, validate=True)
        except (binascii.Error, ValueError):
            raise AttestationError("signature is not base64") from None
        try:
            data = pkcs7.signed_data(der)
            content = pkcs7.content(data)
            info, signer, others = pkcs7.signer(data)
        except AttestationError:
            raise
        except Exception:  # asn1crypto parses lazily: garbage fails wherever it is read
            raise AttestationError("signature is not well-formed PKCS#7 SignedData") from None
        return info, content, signer, others

    def _check_signer(self, parsed: tuple[Any, bytes, Any, Any], now: datetime) -> _Chain:
        """Checks 2-3: the signature holds and the signer chains to the trust."""
        info, content, signer, others = parsed
        try:
            signer_der = signer.dump()
        except Exception:
            raise AttestationError("signature is not well-formed PKCS#7 SignedData") from None
        fingerprint = hashlib.sha256(signer_der).digest()
        with self._lock:
            known = self._chains.get(fingerprint)
            if known is not None:
                self._chains.move_to_end(fingerprint)
        if known is None:
            try:
                leaf = x509.load_der_x509_certificate(signer_der)
                key = leaf.public_key()
            except ValueError:
                raise AttestationError("signer certificate does not parse", "signature") from None
        else:
            key = known.key
        pkcs7.check_signature(info, key, content)
        if known is None:
            try:
                bag = [x509.load_der_x509_certificate(c.dump()) for c in others]
            except ValueError:
                raise AttestationError("a bag certificate does not parse", "signature") from None
            known = self._verify_chain(leaf, bag, now, key)
            self._remember(fingerprint, known)
        elif not known.not_before <= now < known.not_after:
            raise AttestationError(
                f"signer certificate chain not valid at {now.isoformat()} (valid "
                f"{known.not_before.isoformat()} to {known.not_after.isoformat()})",
                check="time",
            )
        return known

    # ------------------------------------------------------------------ chain

    def _names_of(self, leaf: x509.Certificate) -> tuple[tuple[str, ...], str]:
        """The leaf's DNS names and the one the chain is built for (signer_name)."""
        try:
            san = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
            names = tuple(n.lower() for n in san.get_values_for_type(x509.DNSName))
        except (x509.ExtensionNotFound, ValueError):
            raise AttestationError(
                "signer certificate has no subjectAltName", "signer_name"
            ) from None
        name = signer_name(names, self.suffixes)
        if name is None:
            shown = ", ".join(sorted(names))[:120]
            raise AttestationError(
                f"signer certificate is for {shown or 'no DNS name'}, not Azure's "
                f"{' / '.join(self.suffixes)} or a subdomain",
                check="signer_name",
            )
        return names, name

    def _verify_chain(
        self, leaf: x509.Certificate, bag: list[x509.Certificate], now: datetime, key: Any
    ) -> _Chain:
        """Check 3 for a signer not seen yet."""
        names, name = self._names_of(leaf)
        verifier = (
            PolicyBuilder()
            .store(self._store)
            .time(now.replace(tzinfo=None))
            .build_server_verifier(DNSName(name))
        )
        intermediates = [*bag, *self._intermediates]
        try:
            chain = verifier.verify(leaf, intermediates)
        except VerificationError as first:
            if not self._fetch_issuers:
                raise self._chain_error(first, leaf, now) from None
            chain = self._chain_with_fetched(
                leaf, lambda extra: verifier.verify(leaf, [*intermediates, *extra]), first, now
            )
        return _Chain(
            max(c.not_valid_before_utc for c in chain),
            min(c.not_valid_after_utc for c in chain),
            key,
            names,
            tuple(_common_name(c) for c in chain),
        )

    def _remember(self, fingerprint: bytes, chain: _Chain) -> None:
        with self._lock:
            self._chains[fingerprint] = chain
            while len(self._chains) > self._cache_size:
                self._chains.popitem(last=False)

    def unknown_issuer(self, signature: str) -> x509.Certificate | None:
        """For the operator's `attestation check` (the app's own reasons never carry a
        certificate's text): the certificate of the document's chain whose issuer the app
        has no certificate of (not shipped, configured, in the document or given with
        `--ca-pem`), the signer's or one above it; None when every issuer up to a trusted
        root is known, or the document does not parse."""
        try:
            _, _, signer, others = self._parse(signature)
            leaf = x509.load_der_x509_certificate(signer.dump())
            bag = [x509.load_der_x509_certificate(c.dump()) for c in others]
        except (AttestationError, ValueError):
            return None
        known = {c.subject: c for c in [*bag, *self._intermediates]}
        roots = {c.subject for c in self._roots}
        current = leaf
        for _ in range(8):  # longer chains than Azure's (3) are refused anyway
            if current.issuer in roots:
                return None
            parent = known.get(current.issuer)
            if parent is None or parent.subject == current.subject:
                return current
            current = parent
        return None

    @staticmethod
    def _chain_error(
        exc: VerificationError, leaf: x509.Certificate, now: datetime
    ) -> AttestationError:
        detail = str(exc).split(" (encountered", 1)[0][:160]
        if not leaf.not_valid_before_utc <= now <= leaf.not_valid_after_utc:
            return AttestationError(
                f"signer certificate not valid at {now.isoformat()} ({detail})", check="time"
            )
        return AttestationError(f"signer does not chain to a trusted root ({detail})", "chain")

    def _chain_with_fetched(
        self,
        leaf: x509.Certificate,
        build: Callable[[list[x509.Certificate]], list[x509.Certificate]],
        first: VerificationError,
        now: datetime,
    ) -> list[x509.Certificate]:
        """The chain built with the leaf's caIssuers certificates, within the message's
        budget (functions.identity.issuer_cache): more than MAX_ISSUER_URLS URLs is a
        refusal; the URLs are tried in order under one deadline and the first that lets
        the chain build ends the search. Raises AttestationUnavailable when an allowed URL
        could not be fetched (now or in the last FAILURE_TTL seconds) and none helped."""
        urls = _ca_issuer_urls(leaf)
        if len(urls) > issuer_cache.MAX_ISSUER_URLS:
            raise AttestationError(
                f"signer certificate names {len(urls)} caIssuers URLs; at most "
                f"{issuer_cache.MAX_ISSUER_URLS} are fetched, and its chain does not build "
                "without them",
                check="chain",
            )
        end = self.clock() + issuer_cache.MESSAGE_DEADLINE
        unavailable: list[str] = []
        last = first
        for url in urls:
            try:
                certs = self.issuers.get(url, end - self.clock())
            except issuers.IssuerRefused as exc:
                log.info("attestation: issuer %s not used: %s", url[:200], exc)
                continue
            except issuers.IssuerUnavailable as exc:
                unavailable.append(str(exc)[:160])
                continue
            try:
                return build(certs)
            except VerificationError as exc:
                last = exc
        if unavailable:
            raise AttestationUnavailable(
                f"attestation: the signer's issuer could not be fetched ({unavailable[0]}); "
                "retry later"
            )
        raise self._chain_error(last, leaf, now) from None


def issuer_words(cert: x509.Certificate) -> str:
    """`cert`'s issuer named as an operator can look it up: its name, and where Azure
    publishes its certificate (the caIssuers URL `cert` carries)."""
    urls = _ca_issuer_urls(cert)
    if not urls:
        where = ", and no caIssuers URL names it"
    else:
        try:
            issuers.checked_url(urls[0])
            where = f", published at {urls[0][:200]}"
        except issuers.IssuerRefused as exc:  # a forged leaf's own URL is no lead to follow
            where = f"; its caIssuers URL is not one of Azure's issuer hosts ({exc})"
    return (
        f"its issuer {cert.issuer.rfc4514_string()[:200]!r} is not among the certificates "
        f"the app has (shipped, ATTESTATION_CA_PEM or given){where}"
    )


def _ca_issuer_urls(leaf: x509.Certificate) -> list[str]:
    """The leaf's caIssuers URLs, in order (none: no AIA extension)."""
    try:
        aia = leaf.extensions.get_extension_for_class(x509.AuthorityInformationAccess)
    except (x509.ExtensionNotFound, ValueError):
        return []
    return [
        desc.access_location.value
        for desc in aia.value
        if desc.access_method == AuthorityInformationAccessOID.CA_ISSUERS
        and isinstance(desc.access_location, x509.UniformResourceIdentifier)
    ]
