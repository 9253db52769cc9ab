"""The approval form's protection against cross-site requests and replays.

Three independent checks, so one browser quirk never leaves the Approve button open:
- the request's `Origin` (or, without it, `Referer`) is the app's own origin, and
  `Sec-Fetch-Site`, when the browser sends it, says `same-origin`;
- the form carries a token signed with the page-token key, HMAC-SHA256(APP_SECRET,
  b"page-token/v1") (contract §6: the app's own secret, never a relay's), binding the user,
  the event, the time it was issued and a random nonce to the browser's own cookie
  (`__Host-`, `SameSite=Strict`, `HttpOnly`: a cross-site form post does not carry it, and
  another site cannot read or set it): a token for one user, event or browser is useless
  for another, and it expires after TOKEN_TTL_SECONDS;
- each token is spent once (a fleet-wide "first one wins" row), so a replayed form does
  nothing, whatever its fate the first time.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from collections.abc import Mapping
from urllib.parse import urlsplit

COOKIE_NAME = "__Host-sebridge-approve"
TOKEN_TTL_SECONDS = 30 * 60  # long enough to read the page and decide


class TokenInvalid(ValueError):
    """The form may not be acted on; the message is safe to show to the user."""


def new_browser_id() -> str:
    return secrets.token_urlsafe(24)


def _mac(key: bytes, user_id: str, event_id: str, issued: int, nonce: str, browser: str) -> str:
    message = "\n".join(("approve", user_id, event_id, str(issued), nonce, browser)).encode()
    digest = hmac.new(key, message, hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).decode().rstrip("=")


def issue_token(key: bytes, user_id: str, event_id: str, browser: str, now: float) -> str:
    issued = int(now)
    nonce = secrets.token_urlsafe(16)
    return f"{issued}.{nonce}.{_mac(key, user_id, event_id, issued, nonce, browser)}"


def check_token(
    key: bytes | tuple[bytes, ...],
    token: str,
    *,
    user_id: str,
    event_id: str,
    browser: str | None,
    now: float,
) -> str:
    """The token's nonce (to spend it) if it is this user's, for this event, from this
    browser and fresh; TokenInvalid otherwise. `key` may be several keys (APP_SECRET's,
    then APP_SECRET_PREVIOUS's during a rotation): a token signed with any of them holds."""
    if not browser:
        raise TokenInvalid("the form's cookie is missing: open the page again from its link")
    parts = token.split(".")
    if len(parts) != 3 or not parts[0].isdigit():
        raise TokenInvalid("the form's token is malformed: open the page again")
    issued, nonce, given = int(parts[0]), parts[1], parts[2]
    keys = (key,) if isinstance(key, bytes) else key
    signed = [
        hmac.compare_digest(
            _mac(k, user_id, event_id, issued, nonce, browser).encode(), given.encode()
        )
        for k in keys
    ]
    if not any(signed):
        raise TokenInvalid("the form's token is not valid for you, this event and this browser")
    age = now - issued
    if age < -60 or age > TOKEN_TTL_SECONDS:
        raise TokenInvalid("the form has expired: open the page again")
    return nonce


def check_origin(headers: Mapping[str, str], base_url: str) -> None:
    """Refuse a POST that a browser says came from another site (or will not say where)."""
    lowered = {k.lower(): v for k, v in headers.items()}
    expected = _origin(base_url)
    site = lowered.get("sec-fetch-site")
    if site is not None and site != "same-origin":
        raise TokenInvalid(f"cross-site request refused (Sec-Fetch-Site: {site})")
    origin = lowered.get("origin")
    if origin is not None:
        if origin.rstrip("/") != expected:
            raise TokenInvalid(f"cross-site request refused (Origin: {origin[:100]})")
        return
    referer = lowered.get("referer")
    if referer is None:
        raise TokenInvalid("the request says neither Origin nor Referer: refused")
    if _origin(referer) != expected:
        raise TokenInvalid("cross-site request refused (Referer is another site)")


def _origin(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}".lower()


def read_cookie(headers: Mapping[str, str], name: str = COOKIE_NAME) -> str | None:
    lowered = {k.lower(): v for k, v in headers.items()}
    for part in lowered.get("cookie", "").split(";"):
        key, _, value = part.strip().partition("=")
        if key == name and value:
            return value
    return None


def cookie_header(value: str) -> str:
    """`__Host-` demands Secure, Path=/ and no Domain: the cookie stays this host's own."""
    return (
        f"{COOKIE_NAME}={value}; Path=/; Secure; HttpOnly; SameSite=Strict; "
        f"Max-Age={TOKEN_TTL_SECONDS * 4}"
    )
