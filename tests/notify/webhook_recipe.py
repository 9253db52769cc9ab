"""The README's webhook verification recipe (standard library only), verbatim, so tests
prove it works; the README also shows the standardwebhooks library, tested beside it."""

from __future__ import annotations

import base64
import hashlib
import hmac
import time


def readme_verify(secret: str, headers: dict[str, str], body: bytes) -> bool:
    """The README's recipe, line for line (secret: the "whsec_..." string)."""
    key = base64.b64decode(secret.removeprefix("whsec_"))
    msg_id, ts = headers["webhook-id"], headers["webhook-timestamp"]
    mac = hmac.new(key, f"{msg_id}.{ts}.".encode() + body, hashlib.sha256).digest()
    good = "v1," + base64.b64encode(mac).decode()
    given = headers["webhook-signature"].split()
    return any(hmac.compare_digest(s, good) for s in given) and abs(time.time() - int(ts)) < 300
