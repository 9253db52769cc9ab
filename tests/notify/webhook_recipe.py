"""The README's 5-line webhook verification recipe, verbatim, so tests prove it works."""

from __future__ import annotations

import hashlib
import hmac
import time


def readme_verify(secret: bytes, headers: dict[str, str], path: str, body: bytes) -> bool:
    """The README's recipe, line for line."""
    ts, sig = headers["X-Bridge-Timestamp"], headers["X-Bridge-Signature"]
    msg = f"{ts}\nPOST\n{path}\n".encode() + body
    good = "v1=" + hmac.new(secret, msg, hashlib.sha256).hexdigest()
    return hmac.compare_digest(sig, good) and abs(time.time() - int(ts)) < 300
