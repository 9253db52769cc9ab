"""The AIA fallback (functions.identity.issuers) against real local servers: the host
allow-list holds for the URL as the connection uses it, ports are 80/443 only, one total
deadline cuts a slow drip, and a failed fetch makes the message retry (cached briefly)
instead of rejecting it."""

from __future__ import annotations

import datetime as dt
import json
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from cryptography.hazmat.primitives import serialization

from functions.identity import issuers
from functions.identity.attestation import (
    AttestationError,
    AttestationUnavailable,
    AttestationVerifier,
    binding_nonces,
)
from simulator import identity as sim_identity

LOOPBACK = "127.0.0.1"


class Recorder(BaseHTTPRequestHandler):
    hits: list[str]
    status = 200
    body = b""

    def do_GET(self) -> None:
        self.server.hits.append(self.path)  # type: ignore[attr-defined]
        self.send_response(self.server.status)  # type: ignore[attr-defined]
        self.send_header("Content-Length", str(len(self.server.body)))  # type: ignore[attr-defined]
        self.end_headers()
        self.wfile.write(self.server.body)  # type: ignore[attr-defined]

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[ThreadingHTTPServer]:
    httpd = ThreadingHTTPServer((LOOPBACK, 0), Recorder)
    httpd.hits = []  # type: ignore[attr-defined]
    httpd.status = 200  # type: ignore[attr-defined]
    httpd.body = b""  # type: ignore[attr-defined]
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture
def dripper() -> Iterator[int]:
    """A server that answers a byte every 0.2 s, forever (a worker-holding attack)."""
    listener = socket.socket()
    listener.bind((LOOPBACK, 0))
    listener.listen()
    stop = threading.Event()

    def serve() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                continue
            with conn:
                conn.recv(4096)
                try:
                    for byte in b"HTTP/1.0 200 OK\r\nX-Slow: " + b"a" * 10_000:
                        if stop.is_set():
                            break
                        conn.sendall(bytes([byte]))
                        time.sleep(0.2)
                except OSError:
                    pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield listener.getsockname()[1]
    stop.set()
    listener.close()


def port_of(server: ThreadingHTTPServer) -> int:
    return server.server_address[1]


# ---------------------------------------------------------------------- URL rules


def test_the_backslash_url_never_reaches_loopback(server: ThreadingHTTPServer) -> None:
    url = f"http://{LOOPBACK}:{port_of(server)}\\@www.microsoft.com/pkiops/certs/x.crt"
    with pytest.raises(issuers.IssuerRefused):
        issuers.fetch_issuer(url)
    # Even with loopback allowed, the two parsers' disagreement alone refuses it.
    with pytest.raises(issuers.IssuerRefused):
        issuers.fetch_issuer(url, hosts={LOOPBACK, "www.microsoft.com"}, ports={port_of(server)})
    assert server.hits == []  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    "url",
    [
        "http://www.microsoft.com:8080/pkiops/certs/x.crt",  # a port other than 80/443
        "http://user@www.microsoft.com/x.crt",  # userinfo
        "http://www.microsoft.com@127.0.0.1/x.crt",
        "ftp://www.microsoft.com/x.crt",
        "http://www.microsoft.com.evil.example/x.crt",
        "http://169.254.169.254/metadata/identity",
        "http://www.microsoft.com/x y.crt",
        "http://www.microsoft.com\t/x.crt",
        "",
    ],
)
def test_urls_outside_the_rules_are_refused(url: str) -> None:
    with pytest.raises(issuers.IssuerRefused):
        issuers.checked_url(url)


def test_microsofts_real_urls_pass_the_rules() -> None:
    for url in (
        "http://www.microsoft.com/pkiops/certs/Microsoft%20TLS%20G2%20RSA%20CA%20OCSP%2002.crt",
        "http://caissuers.microsoft.com/pkiops/certs/Microsoft%20TLS%20RSA%20Root%20G2%20-%20xsign.crt",
        "https://www.microsoft.com:443/pkiops/certs/x.crt",
        "http://cacerts.digicert.com:80/DigiCertGlobalRootG2.crt",
    ):
        assert issuers.checked_url(url)[1] in issuers.ISSUER_HOSTS


def test_a_port_not_allowed_is_refused_before_any_connection(server: ThreadingHTTPServer) -> None:
    with pytest.raises(issuers.IssuerRefused, match="port"):
        issuers.fetch_issuer(f"http://{LOOPBACK}:{port_of(server)}/x.crt", hosts={LOOPBACK})
    assert server.hits == []  # type: ignore[attr-defined]


# ---------------------------------------------------------------------- the fetch


def fetch_local(server: ThreadingHTTPServer, path: str = "/x.crt", **kw: object) -> bytes:
    port = port_of(server)
    return issuers.fetch_issuer(
        f"http://{LOOPBACK}:{port}{path}", hosts={LOOPBACK}, ports={port}, **kw
    )


def test_a_certificate_is_fetched(server: ThreadingHTTPServer) -> None:
    server.body = b"\x30\x82certificate bytes"  # type: ignore[attr-defined]
    assert fetch_local(server) == b"\x30\x82certificate bytes"
    assert server.hits == ["/x.crt"]  # type: ignore[attr-defined]


def test_a_slow_drip_is_cut_at_the_total_deadline(dripper: int) -> None:
    start = time.monotonic()
    with pytest.raises(issuers.IssuerUnavailable, match="no answer within"):
        issuers.fetch_issuer(
            f"http://{LOOPBACK}:{dripper}/x.crt", hosts={LOOPBACK}, ports={dripper}, deadline=1.0
        )
    assert time.monotonic() - start < 2.0  # each byte came in time; the total did not


@pytest.mark.parametrize(
    ("status", "error"),
    [(404, issuers.IssuerRefused), (302, issuers.IssuerRefused), (503, issuers.IssuerUnavailable)],
)
def test_http_errors_are_refusals_or_unavailability(
    server: ThreadingHTTPServer, status: int, error: type[Exception]
) -> None:
    server.status = status  # type: ignore[attr-defined]
    with pytest.raises(error):
        fetch_local(server)


def test_an_oversized_answer_is_refused(server: ThreadingHTTPServer) -> None:
    server.body = b"x" * (issuers.MAX_BYTES + 1)  # type: ignore[attr-defined]
    with pytest.raises(issuers.IssuerRefused, match="larger"):
        fetch_local(server)


def test_nothing_listening_is_unavailable() -> None:
    probe = socket.socket()
    probe.bind((LOOPBACK, 0))
    port = probe.getsockname()[1]
    probe.close()
    with pytest.raises(issuers.IssuerUnavailable):
        issuers.fetch_issuer(f"http://{LOOPBACK}:{port}/x.crt", hosts={LOOPBACK}, ports={port})


# ---------------------------------------------------------------------- in the verifier


def test_an_unfetchable_intermediate_makes_the_message_retry_then_it_verifies(
    server: ThreadingHTTPServer,
) -> None:
    """Azure's bag holds only the leaf; with only the root configured the verifier fetches
    the intermediate by the leaf's AIA URL (www.microsoft.com, served here by a local
    server). Down: AttestationUnavailable (retry, never reject), not retried for 60 s;
    up again: the document verifies."""
    issuer = sim_identity.issuer_for("g1")
    calls: list[str] = []

    def fetcher(url: str, deadline: float = 5.0) -> bytes:
        assert url.startswith("http://www.microsoft.com/pkiops/certs/")
        calls.append(url)
        return fetch_local(server, "/" + url.rsplit("/", 1)[1])

    verifier = AttestationVerifier(
        roots_pem=issuer.anchor_pem, fetch_issuers=True, issuer_fetcher=fetcher
    )
    clock = [1000.0]
    verifier.clock = lambda: clock[0]
    envelope = {"kind": "document", "vm": {"vm_id": "vm-1"}, "document": {}}
    nonce, _ = binding_nonces(envelope)
    content = sim_identity.attested_content("vm-1", "sub", nonce)
    body = json.dumps(
        {
            **envelope,
            "attestation": {
                "signature": sim_identity.sign(content, issuer.leaf, issuer.leaf_key),
                "nonce": nonce,
            },
        }
    )
    now = dt.datetime.now(dt.UTC)
    server.status = 503  # type: ignore[attr-defined]
    with pytest.raises(AttestationUnavailable, match="retry"):
        verifier.verify(body, now)
    assert len(calls) == 1
    with pytest.raises(AttestationUnavailable, match="cached failure"):
        verifier.verify(body, now)
    assert len(calls) == 1  # the failure is cached: no request for FAILURE_TTL
    server.status = 200  # type: ignore[attr-defined]
    server.body = issuer.intermediate.public_bytes(serialization.Encoding.DER)  # type: ignore[attr-defined, union-attr]
    clock[0] += 61
    assert verifier.verify(body, now).vm_id == "vm-1"
    assert len(calls) == 2
    server.status = 404  # type: ignore[attr-defined]
    assert verifier.verify(body, now).vm_id == "vm-1"  # cached chain: no fetch at all
    assert len(calls) == 2


def test_a_definitive_answer_rejects_instead_of_retrying(server: ThreadingHTTPServer) -> None:
    """A forged leaf pointing at a real Microsoft URL that answers 404 is rejected with the
    reason, not retried until it dead-letters."""
    issuer = sim_identity.issuer_for("g1")
    forger = sim_identity.new_issuer("g1")
    server.status = 404  # type: ignore[attr-defined]
    verifier = AttestationVerifier(
        roots_pem=issuer.anchor_pem,
        fetch_issuers=True,
        issuer_fetcher=lambda url, deadline: fetch_local(server),
    )
    content = sim_identity.attested_content("vm-1", "sub", "n")
    signature = sim_identity.sign(content, forger.leaf, forger.leaf_key)
    with pytest.raises(AttestationError, match="does not chain") as info:
        verifier.verify_document(signature, dt.datetime.now(dt.UTC))
    assert info.value.check == "chain"
    assert server.hits == ["/x.crt"]  # type: ignore[attr-defined]


def test_a_name_resolving_to_a_private_address_is_refused(
    server: ThreadingHTTPServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DNS rebinding: an allowed name whose answer is loopback (or the metadata address)
    is refused, and the connection would go to the checked address, not a second lookup."""
    port = port_of(server)

    def fake_lookup(host: str, port: int, **_: object) -> list[tuple]:
        assert host == "www.microsoft.com"
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (LOOPBACK, port))]

    monkeypatch.setattr(socket, "getaddrinfo", fake_lookup)
    with pytest.raises(issuers.IssuerRefused, match="not a public address"):
        issuers.fetch_issuer("http://www.microsoft.com/x.crt", ports={80, port})
    assert server.hits == []  # type: ignore[attr-defined]
