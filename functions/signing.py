"""HMAC request signing shared by the relay callback, the functions that call it, and webhooks.

Two schemes. v2 (below, issue 22) is the only one the relay's callback accepts; v1 stays
for the webhooks that use it. v1: `X-Relay-Timestamp: <unix seconds>` and
`X-Relay-Signature: v1=<hex HMAC-SHA256(key, TIMESTAMP "\\n" METHOD "\\n" PATH "\\n" BODY)>`.
Binding method and path stops a signature for one endpoint being replayed on another;
the timestamp bounds how long a captured request stays usable, and the relay also refuses
a signature it has already seen inside that window.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from collections.abc import Mapping

TIMESTAMP_HEADER = "X-Relay-Timestamp"
SIGNATURE_HEADER = "X-Relay-Signature"
SCHEME = "v1"
MAX_SKEW_SECONDS = 300


class SignatureError(Exception):
    """A request whose signature or timestamp does not hold; the message is safe to return."""


class MalformedSignature(SignatureError):
    """Signature headers that are not even well-formed (a 400, not a 401)."""


def signature(key: bytes, timestamp: int | str, method: str, path: str, body: bytes) -> str:
    message = f"{timestamp}\n{method.upper()}\n{path}\n".encode() + body
    return f"{SCHEME}=" + hmac.new(key, message, hashlib.sha256).hexdigest()


def sign_headers(
    key: bytes, method: str, path: str, body: bytes, now: float | None = None
) -> dict[str, str]:
    """Headers that authenticate one request; `now` is injectable for tests."""
    timestamp = int(time.time() if now is None else now)
    return {
        TIMESTAMP_HEADER: str(timestamp),
        SIGNATURE_HEADER: signature(key, timestamp, method, path, body),
    }


def verify(
    key: bytes,
    headers: Mapping[str, str],
    method: str,
    path: str,
    body: bytes,
    now: float | None = None,
    max_skew: int = MAX_SKEW_SECONDS,
) -> str:
    """Check a signed request; return its signature (for replay tracking) or raise."""
    lowered = {k.lower(): v for k, v in headers.items()}
    stamp = lowered.get(TIMESTAMP_HEADER.lower())
    given = lowered.get(SIGNATURE_HEADER.lower())
    if not stamp or not given:
        raise SignatureError("missing signature headers")
    if not (stamp.isascii() and stamp.isdigit()):
        raise SignatureError("malformed timestamp")
    current = time.time() if now is None else now
    if abs(current - int(stamp)) > max_skew:
        raise SignatureError("stale timestamp")
    expected = signature(key, stamp, method, path, body)
    if not hmac.compare_digest(expected.encode(), given.encode()):
        raise SignatureError("bad signature")
    return given


# --------------------------------------------------------------------------- v2 (issue 22)
# Per-VM keys naming their target: `X-Relay-Timestamp`, `X-Relay-Target` (the callee's
# vmId, lower-case), `X-Relay-Key-Id` (KID = sha256(secret).hexdigest()[:16]) and
# `X-Relay-Signature: v2=<hex HMAC-SHA256(secret, TS "\n" METHOD "\n" PATH "\n" TARGET
# "\n" BODY)>`. A signature made for one VM is refused by every other VM (WrongTarget, a
# 403), and a relay accepts only its own current or previous key.

TARGET_HEADER = "X-Relay-Target"
KEY_ID_HEADER = "X-Relay-Key-Id"
SCHEME_V2 = "v2"


class WrongTarget(SignatureError):
    """A request signed for another VM (a 403, not a 401)."""


def key_id(secret: bytes) -> str:
    """KID: the first 16 hex characters of SHA-256 of the secret's bytes."""
    return _sha256_hex(secret)[:16]


def signature_v2(
    secret: bytes, timestamp: int | str, method: str, path: str, target: str, body: bytes
) -> str:
    message = f"{timestamp}\n{method.upper()}\n{path}\n{target}\n".encode() + body
    return f"{SCHEME_V2}=" + _hmac_hex(secret, message)


def sign_headers_v2(
    secret: bytes,
    key_id: str,
    target: str,
    method: str,
    path: str,
    body: bytes,
    now: float | None = None,
) -> dict[str, str]:
    """Headers that authenticate one request to the VM `target` (its vmId)."""
    timestamp = int(time.time() if now is None else now)
    target = target.lower()
    return {
        TIMESTAMP_HEADER: str(timestamp),
        TARGET_HEADER: target,
        KEY_ID_HEADER: key_id,
        SIGNATURE_HEADER: signature_v2(secret, timestamp, method, path, target, body),
    }


def verify_v2(
    keys: Mapping[str, bytes],
    own_target: str,
    headers: Mapping[str, str],
    method: str,
    path: str,
    body: bytes,
    now: float | None = None,
    max_skew: int = MAX_SKEW_SECONDS,
) -> str:
    """Check a v2 request: scheme, target (= `own_target`), key id (a key of `keys`, KID ->
    secret), freshness, HMAC. Return the signature (for replay tracking) or raise
    MalformedSignature (400), WrongTarget (403) or SignatureError (401)."""
    lowered = {k.lower(): v for k, v in headers.items()}
    stamp = lowered.get(TIMESTAMP_HEADER.lower())
    given = lowered.get(SIGNATURE_HEADER.lower())
    target = lowered.get(TARGET_HEADER.lower())
    kid = lowered.get(KEY_ID_HEADER.lower())
    if not stamp or not given:
        raise SignatureError("missing signature headers")
    if not given.startswith(f"{SCHEME_V2}="):
        raise SignatureError("only v2 signatures are accepted")
    if not target or not kid:
        raise SignatureError("missing X-Relay-Target or X-Relay-Key-Id")
    if not (stamp.isascii() and stamp.isdigit()) or len(stamp) > 20:
        raise MalformedSignature("malformed timestamp")
    if target.lower() != own_target.lower():
        raise WrongTarget("signed for another VM")
    secret = keys.get(kid)
    if secret is None:
        raise SignatureError("unknown key id")
    current = time.time() if now is None else now
    if abs(current - int(stamp)) > max_skew:
        raise SignatureError("stale timestamp")
    expected = signature_v2(secret, stamp, method, path, target, body)
    if not _digest_equal(expected.encode(), given.encode("utf-8", "replace")):
        raise SignatureError("bad signature")
    return given


def _sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _hmac_hex(key: bytes, message: bytes) -> str:
    return hmac.new(key, message, hashlib.sha256).hexdigest()


def _digest_equal(a: bytes, b: bytes) -> bool:
    return hmac.compare_digest(a, b)
