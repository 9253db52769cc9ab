"""`python -m functions attestation check FILE [--at ISO-TIME] [--nonce N] [--ca-pem PEM]`.

Verifies the JSON IMDS returns (`{"encoding": "pkcs7", "signature": ...}`, e.g. saved by
the relay's preflight `check`) with the app's own trust and rules: the shipped roots and
intermediates (ATTESTATION_CA_PEM instead, if set, as the app would), the signer suffixes
and subscription allow-list of the app settings, issuer fetching as deployed. `--ca-pem`
adds roots and intermediates for this one check (a document signed under a chain since
retired; several files, as a shell glob gives them). A document past its expiresOn (6 h
after IMDS made it) is reported as `time` first, before any certificate is fetched: an
expired document is refused whatever its chain, and without network the fetch would
otherwise hide the real cause behind `unavailable`. Prints one JSON line and exits 0 when
every check holds, or prints the failing check and its reason and exits 1; a usage error
(unreadable file, not IMDS's JSON, a bad time or PEM) exits 2. Run it on a real VM's
document before rolling out: a mismatch with Azure shows here, not as a fleet of rejected
messages."""

from __future__ import annotations

import argparse
import base64
import json
import sys
from datetime import UTC, datetime
from pathlib import Path

from functions.identity.attestation import (
    AttestationError,
    AttestationUnavailable,
    AttestationVerifier,
    issuer_words,
)

UNKNOWN_ISSUER_HINT = (
    "attestation check: the app does not ship that intermediate. Fetch its certificate from "
    "the Azure URL named (curl -o issuer.crt URL; openssl x509 -inform der -in issuer.crt -out "
    "issuer.pem) and check again with --ca-pem issuer.pem; the app fetches it itself when "
    "it can reach that URL, or takes it in ATTESTATION_CA_PEM."
)


def add_parser(sub: argparse._SubParsersAction) -> None:
    attestation = sub.add_parser("attestation", help="check an IMDS attested document")
    what = attestation.add_subparsers(dest="attestation_command", required=True)
    check = what.add_parser(
        "check",
        help="verify an attested document as the app would; one JSON line; exit 0 or 1",
    )
    check.add_argument("file", help='IMDS\'s answer {"encoding": "pkcs7", ...}; - for stdin')
    check.add_argument("--at", help="ISO time to verify at (default: now)")
    check.add_argument("--nonce", help="the nonce the document must carry")
    check.add_argument(
        "--ca-pem",
        nargs="+",
        action="extend",
        metavar="PEM",
        help="PEM file(s) of extra roots and intermediates (e.g. retired/*.pem)",
    )
    check.add_argument("--offline", action="store_true", help="never fetch a missing intermediate")


def run(args: argparse.Namespace) -> int:
    try:
        raw = sys.stdin.read() if args.file == "-" else Path(args.file).read_text("utf-8")
        extra = "".join(Path(f).read_text("utf-8") for f in args.ca_pem or ()) or None
        at = datetime.fromisoformat(args.at) if args.at else datetime.now(UTC)
        signature = _signature(raw)
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        print(f"attestation check: {exc}", file=sys.stderr)
        return 2
    at = at.replace(tzinfo=UTC) if at.tzinfo is None else at
    try:
        verifier = _verifier(extra, offline=args.offline)
    except ValueError as exc:
        print(f"attestation check: {exc}", file=sys.stderr)
        return 2
    expired = _expired(signature, at)
    if expired is not None:
        print(json.dumps({"ok": False, "check": "time", "reason": expired}))
        return 1
    try:
        signed = verifier.inspect(signature, at)
        attested = verifier.verify_document(
            signature, at, nonces=(args.nonce,) if args.nonce is not None else None
        )
    except AttestationError as exc:
        reason = str(exc)
        if exc.check == "chain":  # which issuer, not cryptography's "candidates exhausted"
            lead = "signer does not chain to a trusted root:"
            reason = _unknown_issuer(verifier, signature, lead) or reason
        print(json.dumps({"ok": False, "check": exc.check, "reason": reason}))
        return 1
    except AttestationUnavailable as exc:
        # Not "retry later" alone: offline, no retry helps; name what is missing.
        fetch = str(exc).removeprefix("attestation: ").removesuffix("; retry later")
        reason = _unknown_issuer(verifier, signature, f"{fetch}:") or str(exc)
        print(json.dumps({"ok": False, "check": "unavailable", "reason": reason}))
        return 1
    line = {
        "ok": True,
        "vmId": attested.vm_id,
        "subscriptionId": attested.subscription_id,
        "createdOn": attested.created_on.isoformat(),
        "expiresOn": attested.expires_on.isoformat(),
        "signer": list(signed.signer_names),
        "chain": list(signed.chain),
    }
    print(json.dumps(line))
    return 0


def _unknown_issuer(verifier: AttestationVerifier, signature: str, lead: str) -> str | None:
    """The reason naming the issuer the app does not have (and how to add it), printed
    with a hint on stderr; None when every issuer is known (the failure is elsewhere)."""
    unknown = verifier.unknown_issuer(signature)
    if unknown is None:
        return None
    words = issuer_words(unknown)
    if "published at" in words:
        print(UNKNOWN_ISSUER_HINT, file=sys.stderr)
    return f"attestation: {lead} {words}"


def _signature(raw: str) -> str:
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("signature"), str):
        raise ValueError('not IMDS\'s attested document: {"encoding": "pkcs7", "signature": ...}')
    if data.get("encoding", "pkcs7") != "pkcs7":
        raise ValueError(f"encoding {str(data.get('encoding'))[:20]!r} is not pkcs7")
    return data["signature"]


def _expired(signature: str, at: datetime) -> str | None:
    """Why the document's own timeStamp rules it out at `at`, read before anything is
    verified or fetched (None: within its time, or unreadable here: the full check then
    names the problem)."""
    from functions.identity import pkcs7
    from functions.identity.attestation import parse_time, strict_json

    try:
        der = base64.b64decode(signature, validate=True)
        stamp = strict_json(pkcs7.content(pkcs7.signed_data(der)))["timeStamp"]
        created = parse_time(stamp.get("createdOn"), "createdOn")
        expires = parse_time(stamp.get("expiresOn"), "expiresOn")
    except Exception:  # anything unreadable is the full check's to name
        return None
    if expires > at:
        return None
    return (
        f"attestation: expired at {expires.isoformat()} (made {created.isoformat()}; an "
        "attested document is valid 6 h after IMDS makes it); refused whatever its "
        f"signature, which was not checked: --at {created.isoformat()} checks the rest"
    )


def _verifier(extra_pem: str | None, *, offline: bool) -> AttestationVerifier:
    """The app's verifier (functions.pipeline.admission builds the same from Settings)."""
    from functions.settings import SettingsInvalid, load_settings

    try:
        settings = load_settings()
    except SettingsInvalid as exc:
        raise ValueError(str(exc)) from None
    return AttestationVerifier(
        roots_pem=settings.attestation_ca_pem or None,
        signer_suffixes=settings.signer_suffixes,
        allowed_subscriptions=settings.subscription_allow_list,
        extra_pem=extra_pem,
        fetch_issuers=False if offline else None,
    )
