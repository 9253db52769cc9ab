"""Why a post failed, in words an operator can act on, naming no secret.

`InvalidSchema` or `ConnectionError` alone says nothing about what to fix; requests' own
message says too much (it quotes the URL, and a Teams, Slack or webhook URL is itself the
secret: its path and query carry the signature). So each failure is named from what
requests and urllib3 found (a scheme that is not http(s), a name that does not resolve, a
refused connection, TLS, a proxy, a timeout, the receiver's HTTP status) with only the
scheme, host and port of the URL, and any text that echoes the URL's secret parts
redacted.
"""

from __future__ import annotations

import socket
import ssl
from collections.abc import Iterator
from urllib.parse import urlsplit

import requests
import urllib3.exceptions

REDACTED = "[redacted]"
MIN_SECRET_CHARS = 8  # shorter URL parts (a path "/", "v2") are no secret worth hiding


def where(url: str) -> str:
    """The scheme, host and port of `url`: what a log may say of it."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or "?"
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return "an unparseable URL"
    return f"{parts.scheme or '(no scheme)'}://{host}{port}"


def redact(text: str, url: str) -> str:
    """`text` with the URL and its path, query and each of their parts taken out."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return text.replace(url, REDACTED) if url else text
    secrets = [url, parts.path + ("?" + parts.query if parts.query else ""), parts.query]
    secrets += parts.path.split("/") + [p.split("=", 1)[-1] for p in parts.query.split("&")]
    for secret in sorted({s for s in secrets if len(s) >= MIN_SECRET_CHARS}, key=len, reverse=True):
        text = text.replace(secret, REDACTED)
    return text


def failure(exc: requests.RequestException, url: str, timeouts: tuple[float, float]) -> str:
    """The reason one attempt failed, from the exception requests raised."""
    at = where(url)
    host = at.split("://", 1)[-1]
    if isinstance(exc, requests.exceptions.MissingSchema):
        return "the URL has no scheme: it must start with https://"
    if isinstance(exc, requests.exceptions.InvalidSchema):
        scheme = at.split("://", 1)[0]
        return f"the URL's scheme {scheme!r} is not http or https"
    if isinstance(exc, requests.exceptions.InvalidURL):
        return f"the URL is not valid ({at})"
    if isinstance(exc, requests.exceptions.ProxyError):
        return f"the proxy failed the connection to {at} ({_cause(exc)})"
    if isinstance(exc, requests.exceptions.SSLError):
        return f"TLS with {at} failed: {_tls(exc)}"
    if isinstance(exc, requests.exceptions.ConnectTimeout):
        return f"no connection to {at} within {timeouts[0]:g} s"
    if isinstance(exc, requests.exceptions.ReadTimeout):
        return f"{at} did not answer within {timeouts[1]:g} s"
    if isinstance(exc, requests.ConnectionError):
        return _connection(exc, at, host)
    return f"{type(exc).__name__} for {at}"


def http_status(status: int, detail: str, url: str) -> str:
    """A receiver's refusal: its status and its own words, the URL's secrets redacted."""
    return f"HTTP {status} from {where(url)}: {redact(detail, url)}"


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """`exc` and what it wraps: requests keeps urllib3's error in args, urllib3 its
    reason, Python the cause and context."""
    seen: set[int] = set()
    todo: list[BaseException] = [exc]
    while todo and len(seen) < 20:
        current = todo.pop(0)
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        linked = [current.__cause__, current.__context__, getattr(current, "reason", None)]
        linked += [a for a in getattr(current, "args", ()) if isinstance(a, BaseException)]
        todo += [e for e in linked if isinstance(e, BaseException)]


def _connection(exc: requests.ConnectionError, at: str, host: str) -> str:
    for inner in _chain(exc):
        if isinstance(inner, urllib3.exceptions.NameResolutionError | socket.gaierror):
            return f"the name {host.rsplit(':', 1)[0]!r} does not resolve ({at})"
        if isinstance(inner, ConnectionRefusedError):
            return f"{at} refused the connection"
        if isinstance(inner, ConnectionResetError):
            return f"{at} reset the connection"
        if isinstance(inner, urllib3.exceptions.ProtocolError | ConnectionAbortedError):
            return f"{at} closed the connection without an answer"
        if isinstance(inner, OSError) and inner.errno is not None and inner.strerror:
            return f"no connection to {at}: {inner.strerror}"
    return f"no connection to {at}"


def _tls(exc: requests.exceptions.SSLError) -> str:
    for inner in _chain(exc):
        if isinstance(inner, ssl.SSLCertVerificationError):
            return f"certificate not accepted ({inner.verify_message or inner.reason})"
        if isinstance(inner, ssl.SSLError) and inner.reason:
            return str(inner.reason)
    return "handshake failed"


def _cause(exc: BaseException) -> str:
    for inner in _chain(exc):
        if isinstance(inner, OSError) and inner.strerror:
            return inner.strerror
    return type(exc).__name__
