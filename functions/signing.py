"""HMAC request signing shared by the relay callback, the functions that call it, and webhooks.

The scheme (v1): `X-Relay-Timestamp: <unix seconds>` and
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


def read_key_file(path: str) -> bytes:
    """The shared key is the file's text with surrounding white space stripped."""
    with open(path, encoding="utf-8") as handle:
        key = handle.read().strip()
    if len(key) < 16:
        raise ValueError(f"key in {path} is shorter than 16 characters")
    return key.encode()
