"""Fetching an intermediate Azure has not published yet, by the leaf's AIA caIssuers URL.

The shipped trust (functions/identity/trust) covers every chain Microsoft publishes, so
this is a fallback for an intermediate added without notice. The URL comes from a
certificate anyone can mint, so it is held to narrow rules:

- The host allow-list holds for the URL *as the connection uses it*: the URL is parsed by
  urllib.parse and by urllib3 and both must agree on scheme, host and port; a `\\`, any
  userinfo (`@`), whitespace or control character is refused outright (`urlsplit` and
  urllib3 disagree on `http://127.0.0.1:PORT\\@www.microsoft.com/x`: one sees
  www.microsoft.com, the other 127.0.0.1). The connection then goes to the host parsed
  here, by this module's own socket, not through another parser.
- Ports 80 and 443 only (the default for the scheme, or written explicitly).
- One total deadline across DNS, connect, TLS, headers and body (a server that drips a
  byte a second is cut at the deadline, not kept alive by per-read timeouts).
- No redirect, at most MAX_BYTES.

A definitive answer (a refused URL, an HTTP 4xx, an oversized or unreadable body) raises
IssuerRefused: the chain stays short and the document is rejected with the reason. A
network failure, a timeout or a 5xx raises IssuerUnavailable: the caller makes the message
retry (AttestationUnavailable), it never rejects a genuine document for a network blip."""

from __future__ import annotations

import ipaddress
import socket
import ssl
import string
import threading
import time
from collections.abc import Iterable
from urllib.parse import urlsplit

import urllib3.util

# Where Azure's leaves and intermediates point for their issuer (AIA caIssuers).
ISSUER_HOSTS = frozenset(
    {
        "www.microsoft.com",
        "caissuers.microsoft.com",
        "cacerts.digicert.com",
        "cacerts.digicert.cn",
        "cacerts.geotrust.com",
    }
)
ISSUER_PORTS = frozenset({80, 443})
FETCH_DEADLINE = 5.0  # seconds, everything included
MAX_BYTES = 64 * 1024
_SAFE = frozenset(string.ascii_letters + string.digits + "-._~:/?#[]!$&'()*+,;=%")


class IssuerRefused(ValueError):
    """This URL is not fetched, or its answer is definitively not a certificate."""


class IssuerUnavailable(RuntimeError):
    """The fetch failed now (network, timeout, 5xx): try again later."""


class HostUnavailable(IssuerUnavailable):
    """The host itself did not answer (DNS, connect, a timeout): every URL on it would
    fail the same way, so the caller stops asking that host for a while (a forged leaf can
    name any number of paths on an allowed host; a host that does not answer costs one
    deadline a minute, not one per path)."""


def checked_url(
    url: str, hosts: Iterable[str] = ISSUER_HOSTS, ports: Iterable[int] = ISSUER_PORTS
) -> tuple[str, str, int, str]:
    """(scheme, host, port, path-and-query) of an allowed URL, else IssuerRefused."""
    if not url or len(url) > 2000 or any(ch not in _SAFE for ch in url):
        raise IssuerRefused(f"URL has characters a URL parser may read two ways: {url[:120]!r}")
    if "@" in url.split("?", 1)[0]:
        raise IssuerRefused(f"URL has userinfo: {url[:120]!r}")
    try:
        parts = urlsplit(url)
        other = urllib3.util.parse_url(url)
        port_a = parts.port
    except ValueError as exc:
        raise IssuerRefused(f"URL does not parse: {exc}") from None
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        raise IssuerRefused(f"URL scheme {scheme!r} is not http(s)")
    host = (parts.hostname or "").lower()
    default = 443 if scheme == "https" else 80
    port = port_a if port_a is not None else default
    if (
        (other.scheme or "").lower() != scheme
        or (other.host or "").lower() != host
        or (other.port if other.port is not None else default) != port
        or other.auth
    ):
        raise IssuerRefused(f"URL parsers disagree on {url[:120]!r}")
    if host not in {h.lower() for h in hosts}:
        raise IssuerRefused(f"host {host!r} is not an issuer host")
    if port not in set(ports):
        raise IssuerRefused(f"port {port} is not 80 or 443")
    target = parts.path or "/"
    if parts.query:
        target += "?" + parts.query
    return scheme, host, port, target


def fetch_issuer(
    url: str,
    *,
    deadline: float = FETCH_DEADLINE,
    hosts: Iterable[str] = ISSUER_HOSTS,
    ports: Iterable[int] = ISSUER_PORTS,
    max_bytes: int = MAX_BYTES,
) -> bytes:
    """GET an allowed caIssuers URL within one total `deadline`; the body's bytes."""
    scheme, host, port, target = checked_url(url, hosts, ports)
    end = time.monotonic() + deadline

    def left() -> float:
        remaining = end - time.monotonic()
        if remaining <= 0:
            raise HostUnavailable(f"{host}: no answer within {deadline:g} s")
        return remaining

    address = _resolve(host, port, left())
    try:
        sock = socket.create_connection(address, timeout=left())
    except TimeoutError:
        raise HostUnavailable(f"{host}: no answer within {deadline:g} s") from None
    except OSError as exc:
        raise HostUnavailable(f"{host}:{port}: {exc}") from None
    try:
        if scheme == "https":
            sock.settimeout(left())
            sock = ssl.create_default_context().wrap_socket(sock, server_hostname=host)
        request = (
            f"GET {target} HTTP/1.0\r\nHost: {host}\r\nAccept: */*\r\n"
            "User-Agent: scheduled-events-bridge\r\nConnection: close\r\n\r\n"
        )
        sock.settimeout(left())
        sock.sendall(request.encode("ascii"))
        received = bytearray()
        while True:
            sock.settimeout(left())
            chunk = sock.recv(16384)
            if not chunk:
                break
            received += chunk
            if len(received) > max_bytes + 16384:
                raise IssuerRefused(f"{host}: answer larger than {max_bytes} bytes")
    except TimeoutError:
        raise HostUnavailable(f"{host}: no answer within {deadline:g} s") from None
    except (OSError, ssl.SSLError) as exc:
        raise HostUnavailable(f"{host}:{port}: {exc}") from None
    finally:
        sock.close()
    return _body(bytes(received), host, max_bytes)


def _resolve(host: str, port: int, timeout: float) -> tuple[str, int]:
    """The address to connect to, resolved within `timeout` (getaddrinfo has no timeout of
    its own: it runs in a daemon thread). A name must resolve to a public address: a DNS
    answer pointing at loopback, a private network or the metadata address is refused,
    and the connection goes to the address checked here (no second lookup to rebind). An
    allowed host written as an address (tests' loopback servers) is used as written."""
    try:
        ipaddress.ip_address(host)
        return host, port
    except ValueError:
        pass
    answer: list[object] = []

    def lookup() -> None:
        try:
            answer.append(socket.getaddrinfo(host, port, type=socket.SOCK_STREAM))
        except OSError as exc:
            answer.append(exc)

    worker = threading.Thread(target=lookup, daemon=True)
    worker.start()
    worker.join(timeout)
    if not answer:
        raise HostUnavailable(f"{host}: no DNS answer within the deadline")
    if isinstance(answer[0], OSError):
        raise HostUnavailable(f"{host}: {answer[0]}")
    infos = answer[0]
    assert isinstance(infos, list)
    for _family, _type, _proto, _name, sockaddr in infos:
        if not ipaddress.ip_address(sockaddr[0]).is_global:
            raise IssuerRefused(f"{host} resolves to {sockaddr[0]}, not a public address")
    if not infos:
        raise HostUnavailable(f"{host}: no address")
    return infos[0][4][0], port


def _body(answer: bytes, host: str, max_bytes: int) -> bytes:
    head, sep, body = answer.partition(b"\r\n\r\n")
    status_line = head.split(b"\r\n", 1)[0].decode("latin-1")
    fields = status_line.split(" ", 2)
    if not sep or len(fields) < 2 or not fields[1].isdigit():
        raise IssuerUnavailable(f"{host}: not an HTTP answer")
    status = int(fields[1])
    if status >= 500:
        raise IssuerUnavailable(f"{host}: HTTP {status}")
    if status != 200:  # 3xx included: no redirect is followed
        raise IssuerRefused(f"{host}: HTTP {status}")
    if len(body) > max_bytes:
        raise IssuerRefused(f"{host}: answer larger than {max_bytes} bytes")
    return body
