"""Refresh the shipped trust material: `python -m functions.identity.trust.refresh`.

    python -m functions.identity.trust.refresh --source "URL or repo/path@commit" FILE_OR_URL...
    python -m functions.identity.trust.refresh --list

Each argument is a certificate (DER, PEM, or a PKCS#7 bag of them), from a file or an
http(s) URL (Microsoft's "Azure Certificate Authority details" page links every one). Each
certificate is written as PEM into this folder, named after its subject (and its issuer
for a cross-sign), and recorded in `manifest.json` with its subject, issuer, role, SHA-256
fingerprint, validity and where it came from. The verifier reads only what the manifest
lists (functions.identity.trust.shipped), so a PEM dropped here by hand is not trusted.

Why a script: Microsoft adds intermediates without notice and they expire (the Azure RSA
TLS "xsign" ones did on 2026-08-25). Half a year ahead `settings check` and the app's log
at start say so (`expiry_notice`); the procedure is in docs/attestation.md."""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
import urllib.request
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.serialization import pkcs7
from cryptography.x509.oid import NameOID

FOLDER = Path(__file__).resolve().parent
MANIFEST = "manifest.json"
MAX_BYTES = 256 * 1024


def load_certificates(data: bytes) -> list[x509.Certificate]:
    """DER certificate, PEM (one or more), or a DER/PEM PKCS#7 bag: what CA pages serve."""
    if b"-----BEGIN CERTIFICATE-----" in data:
        return x509.load_pem_x509_certificates(data)
    if b"-----BEGIN PKCS7-----" in data:
        return list(pkcs7.load_pem_pkcs7_certificates(data))
    try:
        return [x509.load_der_x509_certificate(data)]
    except ValueError:
        return list(pkcs7.load_der_pkcs7_certificates(data))


def common_name(name: x509.Name) -> str:
    values = name.get_attributes_for_oid(NameOID.COMMON_NAME)
    return str(values[0].value) if values else name.rfc4514_string()


def is_self_signed(cert: x509.Certificate) -> bool:
    """A root names itself as its issuer. Its self-signature is not checked: an anchor is
    trusted because it was chosen, and old roots (Baltimore) are signed with SHA-1."""
    return cert.issuer == cert.subject


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def file_name(cert: x509.Certificate) -> str:
    """`<subject>.pem`, or `<subject>--by-<issuer>.pem` for a certificate another CA issued
    (a root cross-signed by another root keeps both names apart)."""
    name = _slug(common_name(cert.subject))
    if not is_self_signed(cert):
        name += "--by-" + _slug(common_name(cert.issuer))
    return name + ".pem"


def fingerprint(cert: x509.Certificate) -> str:
    return hashlib.sha256(cert.public_bytes(serialization.Encoding.DER)).hexdigest()


def entry(cert: x509.Certificate, source: str) -> dict[str, Any]:
    return {
        "file": file_name(cert),
        "subject": cert.subject.rfc4514_string(),
        "issuer": cert.issuer.rfc4514_string(),
        "role": "root" if is_self_signed(cert) else "intermediate",
        "sha256": fingerprint(cert),
        "not_before": cert.not_valid_before_utc.isoformat(),
        "not_after": cert.not_valid_after_utc.isoformat(),
        "source": source,
    }


def read_manifest(folder: Path = FOLDER) -> dict[str, Any]:
    path = folder / MANIFEST
    if not path.exists():
        return {"certificates": [], "not_found": []}
    return json.loads(path.read_text(encoding="utf-8"))


def write_manifest(manifest: dict[str, Any], folder: Path = FOLDER) -> None:
    manifest["certificates"] = sorted(
        manifest["certificates"], key=lambda e: (e["role"] != "root", e["file"])
    )
    text = json.dumps(manifest, indent=2, ensure_ascii=False) + "\n"
    (folder / MANIFEST).write_text(text, encoding="utf-8")


def add(data: bytes, source: str, folder: Path = FOLDER) -> list[dict[str, Any]]:
    """Write every certificate in `data` and record it (replacing an entry for the same
    file: a renewed intermediate keeps its name, its fingerprint and dates change)."""
    certs = load_certificates(data)
    if not certs:
        raise ValueError("no certificate found")
    manifest = read_manifest(folder)
    added = []
    for cert in certs:
        record = entry(cert, source)
        (folder / record["file"]).write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        manifest["certificates"] = [
            e for e in manifest["certificates"] if e["file"] != record["file"]
        ] + [record]
        added.append(record)
    write_manifest(manifest, folder)
    return added


def fetch(location: str) -> bytes:
    """A file, or an http(s) URL (an operator's refresh; the app itself never runs this)."""
    if location.startswith(("http://", "https://")):
        with urllib.request.urlopen(location, timeout=30) as answer:  # noqa: S310 - operator tool
            data: bytes = answer.read(MAX_BYTES + 1)
    else:
        data = Path(location).read_bytes()
    if len(data) > MAX_BYTES:
        raise ValueError(f"{location}: more than {MAX_BYTES} bytes")
    return data


def expiring(
    manifest: dict[str, Any], now: datetime, within_days: int
) -> list[tuple[str, datetime]]:
    """(file, notAfter) of every listed certificate that expires within `within_days`."""
    soon = []
    for record in manifest["certificates"]:
        not_after = datetime.fromisoformat(record["not_after"])
        if (not_after - now).days < within_days:
            soon.append((record["file"], not_after))
    return soon


# How far ahead the operator is told (settings check, the app's log at start): half a year,
# time for a release or a refresh to reach every deployment.
NOTICE_DAYS = 183
PROCEDURE = "docs/attestation.md, 'When shipped certificates near their end'"


def expiry_notice(manifest: dict[str, Any], now: datetime, within_days: int = NOTICE_DAYS) -> str:
    """One line for operators when shipped trust material expires within `within_days`
    (or has expired): what, when, what it means, what to do. "" when nothing is near.

    Why a notice and not a failing check: the date is Microsoft's, not a fault of the
    deployment, so it must never turn a deploy gate (`settings check --strict`) or CI red;
    but an operator has to hear of it months before attestations start being refused."""
    soon = expiring(manifest, now, within_days)
    if not soon:
        return ""
    first = min(not_after for _, not_after in soon)
    by_date: dict[str, int] = {}
    for _, not_after in soon:
        day = f"{not_after:%Y-%m-%d}"
        by_date[day] = by_date.get(day, 0) + 1
    when = ", ".join(f"{n} on {day}" for day, n in sorted(by_date.items()))
    days = (first - now).days
    lead = (
        f"{len(soon)} shipped trust certificate(s) EXPIRED ({when})"
        if days < 0
        else f"{len(soon)} shipped trust certificate(s) expire within {days} days ({when})"
    )
    return (
        f"{lead}: attested documents chained through them are refused from then unless the "
        "verifier's AIA fetch finds a renewed issuer; upgrade the app or refresh the trust "
        f"({PROCEDURE})"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m functions.identity.trust.refresh")
    parser.add_argument("locations", nargs="*", help="certificate files or http(s) URLs")
    parser.add_argument("--source", help="where it came from (URL, or repo/path@commit)")
    parser.add_argument("--folder", type=Path, default=FOLDER, help=argparse.SUPPRESS)
    parser.add_argument("--list", action="store_true", help="print the manifest's certificates")
    args = parser.parse_args(argv)
    if args.list or not args.locations:
        now = datetime.now(UTC)
        for record in read_manifest(args.folder)["certificates"]:
            days = (datetime.fromisoformat(record["not_after"]) - now).days
            print(f"{record['role']:12} {days:6d} days  {record['file']}")
        return 0
    for location in args.locations:
        try:
            records = add(fetch(location), args.source or location, args.folder)
        except (OSError, ValueError) as exc:
            print(f"{location}: {exc}", file=sys.stderr)
            return 1
        for record in records:
            print(f"{record['file']}: {record['subject']} (until {record['not_after']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
