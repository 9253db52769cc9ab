"""What one VM's message can cost the app before it is admitted or rejected (issue 32).

Each hostile kind of message a VM with root can send to the documents queue, built with
the attacker's real relay code where it can be (tests/security/conftest.py), delivered to
the real admission and ingest (Azurite for tables, the simulator for Resource Graph), with
every issuer fetch going to a local issuer server on loopback that answers as slowly (or
as uselessly) as the kind asks. A `Meter` counts what the message cost:

- wall time, from delivery to the app's verdict (admitted, rejected, or "retry");
- issuer requests that reached the loopback issuer server;
- Resource Graph queries and Table reads/writes (every HTTP request the app's sessions
  and the Table SDK send, by URL);
- waits (the admission's `sleep`).

The stated budget per message is BUDGET; tests/security/test_message_budget.py asserts it
for every kind and the bench reports the worst wall time as `worst_message_cost_ms`.
"""

from __future__ import annotations

import datetime as dt
import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import requests
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.x509.oid import AuthorityInformationAccessOID, ExtendedKeyUsageOID

from functions.identity import issuers
from functions.identity.attestation import AttestationVerifier, binding_nonces
from functions.identity.facts import FactsUnavailable
from simulator import identity as azure
from tests.security.conftest import Fleet
from tests.tablecount import TableCounter

ISSUER_DEADLINE = 5.0  # seconds: every issuer fetch of one message, together


@dataclass(frozen=True)
class Budget:
    """What one message may cost, whatever it holds (docs/security.md states it)."""

    wall_seconds: float = ISSUER_DEADLINE + 1.5  # the one fetch deadline, plus CPU slack
    issuer_requests: int = 2
    resource_graph_queries: int = 0  # for a message that is not attested
    table_writes: int = 1  # its rejection row
    table_reads: int = 1  # report mode: the claimed VM's identity row
    waits: int = 0


BUDGET = Budget()


# ---------------------------------------------------------------------- the issuer


class SlowIssuer:
    """A caIssuers server on loopback: `mode` "hang" (answers nothing until closed), "drip"
    (a byte every half second), "404", "503". `hits` lists the paths asked."""

    def __init__(self, mode: str = "hang") -> None:
        self.mode = mode
        self.hits: list[str] = []
        self.closing = threading.Event()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                outer.hits.append(self.path)
                if outer.mode == "hang":
                    outer.closing.wait(60)
                    return
                if outer.mode == "drip":
                    self.wfile.write(b"HTTP/1.0 200 OK\r\n")
                    while not outer.closing.wait(0.5):
                        try:
                            self.wfile.write(b"x")
                            self.wfile.flush()
                        except OSError:
                            return
                    return
                self.send_response(int(outer.mode))
                self.send_header("Content-Length", "0")
                self.end_headers()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def fetcher(self, valve: int = 4) -> Callable[..., bytes]:
        """The app's own fetch (functions.identity.issuers.fetch_issuer, its deadline as
        the verifier passes it), sent to this server instead of the allowed host the URL
        names. After `valve` requests it answers "unavailable" at once, so code without a
        budget fails its test in seconds instead of hours."""

        def fetch(url: str, deadline: float = issuers.FETCH_DEADLINE) -> bytes:
            issuers.checked_url(url)  # the app's rule for the URL as the leaf wrote it
            if len(self.hits) >= valve:
                self.hits.append("(over the valve: not sent)")
                raise issuers.IssuerUnavailable("test valve: too many fetches for one message")
            path = "/" + url.split("://", 1)[1].split("/", 1)[1]
            local = f"http://127.0.0.1:{self.port}{path}"
            return issuers.fetch_issuer(
                local, deadline=deadline, hosts={"127.0.0.1"}, ports={self.port}
            )

        return fetch

    def close(self) -> None:
        self.closing.set()
        self.server.shutdown()
        self.server.server_close()


# ---------------------------------------------------------------------- forged leaves

_KEYS: dict[str, Any] = {}


def _key(name: str) -> Any:
    if name not in _KEYS:
        _KEYS[name] = azure._key()
    return _KEYS[name]


def forged_leaf(urls: list[str], *, ca: str = "ca") -> tuple[Any, Any]:
    """A leaf in Azure's shape (SAN metadata.azure.com, serverAuth) signed by a CA the app
    does not trust (named "Attacker Issuing CA", key `ca`), naming `urls` as its
    caIssuers."""
    ca_key, key = _key(ca), _key("leaf")
    now = dt.datetime.now(dt.UTC)
    access = [
        x509.AccessDescription(
            AuthorityInformationAccessOID.CA_ISSUERS, x509.UniformResourceIdentifier(u)
        )
        for u in urls
    ]
    builder = (
        x509.CertificateBuilder()
        .subject_name(azure._name(azure.SIGNER_NAME, leaf=True))
        .issuer_name(azure._name("Attacker Issuing CA"))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(azure.VALID_FROM)
        .not_valid_after(now + dt.timedelta(days=30))
        .add_extension(
            x509.SubjectAlternativeName([x509.DNSName(azure.SIGNER_NAME)]), critical=False
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
    )
    builder = builder.add_extension(
        x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
    )
    if access:
        builder = builder.add_extension(x509.AuthorityInformationAccess(access), critical=False)
    return builder.sign(ca_key, hashes.SHA256()), key


def mesh_bag(size: int = 7) -> list[x509.Certificate]:
    """`size` CA certificates (with the leaf, the 8 a bag may hold), one name and one key,
    each issued by that name: every one may sign every other, the worst case for path
    building."""
    key = _key("mesh")
    now = dt.datetime.now(dt.UTC)
    ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
    aki = x509.AuthorityKeyIdentifier.from_issuer_public_key(key.public_key())
    return [
        x509.CertificateBuilder()
        .subject_name(azure._name("Attacker Issuing CA"))
        .issuer_name(azure._name("Attacker Issuing CA"))
        .public_key(key.public_key())
        .serial_number(1000 + n)
        .not_valid_before(azure.VALID_FROM)
        .not_valid_after(now + dt.timedelta(days=30))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(azure._key_usage(ca=True), critical=True)
        .add_extension(ski, critical=False)
        .add_extension(aki, critical=False)
        .sign(key, hashes.SHA256())
        for n in range(size)
    ]


def signed_as(
    body: str,
    leaf: Any,
    leaf_key: Any,
    *,
    vm_id: str | None = None,
    nonce: str | None = None,
    bag: tuple[x509.Certificate, ...] = (),
    subscription: str = "00000000-0000-0000-0000-000000000000",
) -> str:
    """`body` (a relay's message) re-attested by the attacker's own signer: the signed
    vmId is the message's claim unless `vm_id` is given, the nonce its own unless `nonce`."""
    data = json.loads(body)
    data.pop("attestation", None)
    own = binding_nonces(data)[0]
    content = azure.attested_content(vm_id or data["vm"]["vm_id"], subscription, nonce or own)
    signature = azure.sign(content, leaf, leaf_key, extra_certs=bag)
    return json.dumps({**data, "attestation": {"signature": signature, "nonce": own}})


def claiming(body: str, **vm: Any) -> dict[str, Any]:
    data = json.loads(body)
    data["vm"].update(vm)
    return data


# ---------------------------------------------------------------------- the kinds

PKI = "http://www.microsoft.com/pkiops/certs/"


def hostile_messages(fleet: Fleet) -> list[tuple[str, str, str]]:
    """(kind, ATTESTATION_MODE, body) for every hostile kind one VM can send. The issuer
    server's mode for each kind is in ISSUER_MODE."""
    attacker, victim = fleet.vms["attacker"], fleet.vms["victim"]
    own = attacker.message([])
    run = uuid.uuid4().hex[:6]  # fresh URLs: nothing cached from an earlier run
    # 400 URLs on an allowed host: about as many as the envelope's 32,768 characters of
    # signature hold (the red team's leaf had ~500, with shorter URLs).
    fan_out, key = forged_leaf([f"http://www.microsoft.com/{run}{n}" for n in range(400)])
    two, _ = forged_leaf([f"{PKI}{run}a.crt", f"{PKI}{run}b.crt"])
    one, _ = forged_leaf([f"http://cacerts.digicert.com/{run}.crt"])
    meshed, _ = forged_leaf([], ca="mesh")  # signed by the mesh's key: every path verifies
    bare, _ = forged_leaf([])  # no caIssuers: refused for its chain, nothing fetched
    random_ids = json.dumps(claiming(own, vm_id=str(uuid.uuid4()), name=f"vm-{uuid.uuid4().hex}"))
    victims = json.dumps(claiming(own, vm_id=victim.vm_id, name="victim"))
    victims_genuine = attacker.message([], claims={"vm_id": victim.vm_id, "name": "victim"})
    huge = json.loads(own)
    huge["relay_version"] = "x" * 200_000
    return [
        ("aia_fan_out_400_urls", "enforce", signed_as(own, fan_out, key)),
        ("aia_two_urls_issuer_hangs", "enforce", signed_as(own, two, key)),
        ("aia_one_url_issuer_drips", "enforce", signed_as(own, one, key)),
        ("aia_two_urls_issuer_404", "enforce", signed_as(own, two, key)),
        (
            "mesh_bag_of_8_certificates",
            "enforce",
            signed_as(own, meshed, key, bag=tuple(mesh_bag())),
        ),
        ("bogus_nonce", "enforce", signed_as(own, two, key, nonce="0" * 32)),
        (
            "wrong_vm_id_genuine_document",
            "enforce",
            attacker.message([], claims={"vm_id": victim.vm_id}),
        ),
        ("random_vm_id_forged_leaf", "enforce", signed_as(random_ids, two, key)),
        ("random_vm_id_report_mode", "report", signed_as(random_ids, bare, key)),
        ("victims_vm_id_report_mode", "report", signed_as(victims, bare, key)),
        ("victims_vm_id_genuine_document_report_mode", "report", victims_genuine),
        ("oversize_body", "enforce", json.dumps(huge)),
        ("oversize_signature", "enforce", _oversize_signature(own)),
    ]


ISSUER_MODE = {
    "aia_two_urls_issuer_hangs": "hang",
    "aia_one_url_issuer_drips": "drip",
    "aia_two_urls_issuer_404": "404",
}


def _oversize_signature(body: str) -> str:
    data = json.loads(body)
    data["attestation"]["signature"] = "A" * 200_000
    return json.dumps(data)


# ---------------------------------------------------------------------- measuring


@dataclass
class Cost:
    kind: str
    verdict: str  # "admitted", "rejected: <reason>", or "retry: <reason>"
    seconds: float
    issuer_requests: int
    resource_graph_queries: int
    table_reads: int
    table_writes: int
    waits: int

    def over(self, budget: Budget = BUDGET) -> list[str]:
        """What this message spent beyond `budget` (empty: within it)."""
        out = []
        if self.seconds > budget.wall_seconds:
            out.append(f"{self.seconds:.2f} s > {budget.wall_seconds} s")
        if self.issuer_requests > budget.issuer_requests:
            out.append(f"{self.issuer_requests} issuer requests")
        if self.resource_graph_queries > budget.resource_graph_queries:
            out.append(f"{self.resource_graph_queries} Resource Graph queries")
        if self.table_writes > budget.table_writes:
            out.append(f"{self.table_writes} Table writes")
        if self.table_reads > budget.table_reads:
            out.append(f"{self.table_reads} Table reads")
        if self.waits > budget.waits:
            out.append(f"{self.waits} waits")
        return out


@dataclass
class Meter:
    """Counts the HTTP requests of every requests.Session while `counting()` is open (the
    app's Resource Graph session; Table requests are counted on the wire by
    tests/tablecount.TableCounter, a proxy in front of Azurite)."""

    requests: list[tuple[str, str]] = field(default_factory=list)

    @contextmanager
    def counting(self) -> Iterator[None]:
        original = requests.Session.send

        def send(session: requests.Session, request: Any, **kwargs: Any) -> Any:
            self.requests.append((request.method or "", request.url or ""))
            return original(session, request, **kwargs)

        requests.Session.send = send  # type: ignore[method-assign]
        try:
            yield
        finally:
            requests.Session.send = original  # type: ignore[method-assign]

    def resource_graph(self) -> int:
        return sum("Microsoft.ResourceGraph" in url for _, url in self.requests)


READS = ("get", "query")
WRITES = ("insert", "upsert", "update", "delete", "batch")


def measure(
    fleet: Fleet, kind: str, mode: str, body: str, issuer: SlowIssuer, tables: TableCounter
) -> Cost:
    """Deliver `body` once with ATTESTATION_MODE `mode`; what it cost (`tables` counts
    the fleet's Table requests)."""
    admission = fleet.pipeline.admission
    admission.mode = mode
    waits: list[float] = []
    admission.sleep = waits.append
    hits = len(issuer.hits)
    meter = Meter()
    tables.reset()
    began = time.perf_counter()
    with meter.counting():
        try:
            result = fleet.deliver(body)
            verdict = (
                result.outcome if result.outcome != "rejected" else f"rejected: {result.reason}"
            )
        except FactsUnavailable as exc:
            verdict = f"retry: {exc}"
    seconds = time.perf_counter() - began
    kinds = tables.by_kind()
    return Cost(
        kind,
        verdict[:300],
        seconds,
        len([h for h in issuer.hits[hits:] if not h.startswith("(")]),
        meter.resource_graph(),
        sum(kinds.get(k, 0) for k in READS),
        sum(kinds.get(k, 0) for k in WRITES),
        len(waits),
    )


def deployed_verifier(issuer: SlowIssuer) -> AttestationVerifier:
    """The verifier as deployed (issuer fetches on), trusting the simulator's issuer,
    fetching from the loopback issuer server."""
    return AttestationVerifier(
        roots_pem=azure.test_issuer().root_pem,
        fetch_issuers=True,
        issuer_fetcher=issuer.fetcher(),
    )


def run_all(fleet: Fleet, tables: TableCounter) -> list[Cost]:
    """Every hostile kind, each on a fresh verifier (nothing cached from the kind before)
    and its own issuer server; the victim and attacker enrolled first by genuine messages."""
    for vm in ("victim", "attacker"):
        fleet.deliver(fleet.vms[vm].message([]))
    costs = []
    for kind, mode, body in hostile_messages(fleet):
        issuer = SlowIssuer(ISSUER_MODE.get(kind, "503"))
        try:
            fleet.pipeline.admission.verifier = deployed_verifier(issuer)
            costs.append(measure(fleet, kind, mode, body, issuer, tables))
        finally:
            issuer.close()
    fleet.pipeline.admission.mode = "enforce"
    return costs


def worst_message_cost_ms(connection_string: str) -> dict[str, Any]:
    """The bench's key: the worst wall time (ms) of any hostile kind, and each kind's."""
    import tempfile
    from pathlib import Path

    from tests.security.conftest import open_fleet

    with (
        tempfile.TemporaryDirectory() as tmp,
        TableCounter(connection_string) as tables,
        open_fleet(tables.connection_string, Path(tmp)) as fleet,
    ):
        costs = run_all(fleet, tables)
    return {
        "worst_message_cost_ms": round(max(c.seconds for c in costs) * 1000, 1),
        "message_costs_ms": {c.kind: round(c.seconds * 1000, 1) for c in costs},
        "message_costs_over_budget": {c.kind: c.over() for c in costs if c.over()},
    }
