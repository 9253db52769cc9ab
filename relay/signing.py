"""The relay's side of request signing: it verifies scheme v2 (below, issue 22), the only
one its callback accepts, and keeps the HMAC and SHA-256 the rest of the relay uses.
Signing lives with the caller, functions/signing.py (the app; v1 stays there for the
webhooks that use it): the relay never signs, and every byte of it travels in a VM's
customData (tests/test_signing.py proves the relay verifies what the app signs).
Binding method, path and target stops a signature for one endpoint or VM being replayed
on another; the timestamp bounds how long a captured request stays usable, and the relay
also refuses a signature it has already seen inside that window.
"""

from __future__ import annotations

import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

TIMESTAMP_HEADER = "X-Relay-Timestamp"
SIGNATURE_HEADER = "X-Relay-Signature"
MAX_SKEW_SECONDS = 300


class SignatureError(Exception):
    """A request whose signature or timestamp does not hold; the message is safe to return."""


class MalformedSignature(SignatureError):
    """Signature headers that are not even well-formed (a 400, not a 401)."""


def _sha256_constructor():
    """Python's built-in SHA-256 where it has one, else OpenSSL's (hashlib).

    hashlib and hmac load OpenSSL's libcrypto, a third of the relay's memory, for hashing
    that the interpreter can do itself. Builds without the built-in (RHEL's, for FIPS)
    fall back to hashlib, so the result is the same everywhere.
    """
    for name in ("_sha256", "_sha2"):  # 3.9-3.11, 3.12+
        try:
            return __import__(name).sha256
        except (ImportError, AttributeError):
            continue
    import hashlib

    return hashlib.sha256


sha256 = _sha256_constructor()
_INNER = bytes(b ^ 0x36 for b in range(256))
_OUTER = bytes(b ^ 0x5C for b in range(256))


def hmac_sha256(key: bytes, message: bytes) -> bytes:
    """HMAC-SHA256 (RFC 2104) on `sha256`; tests hold it equal to the hmac module's."""
    if len(key) > 64:
        key = sha256(key).digest()
    key = key.ljust(64, b"\0")
    inner = sha256(key.translate(_INNER) + message).digest()
    return sha256(key.translate(_OUTER) + inner).digest()


def compare_digest(a: bytes, b: bytes) -> bool:
    """Constant-time comparison (hmac.compare_digest, without importing hmac)."""
    try:
        import _operator
    except ImportError:  # pragma: no cover - every CPython has it; hmac as a fallback
        import hmac

        return hmac.compare_digest(a, b)
    return _operator._compare_digest(a, b)


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
    return sha256(data).hexdigest()


def _hmac_hex(key: bytes, message: bytes) -> str:
    return hmac_sha256(key, message).hex()


def _digest_equal(a: bytes, b: bytes) -> bool:
    return compare_digest(a, b)
