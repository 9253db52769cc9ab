"""How long attestation verification takes per message (not a test: run it).

    .venv/bin/python -m tests.identity.measure_attestation

Cached: the steady state (the signer's chain verified once per process, then one RSA
verify, one digest and the JSON parses per message). Uncached: the first message of a new
signer certificate (chain building added), measured on fresh verifiers. Both for the
simulator's G2 document (ATTESTATION_CA_PEM trust: roots, cross-sign, intermediate) and for
a genuine G2 document with the shipped trust (3 roots, 13 intermediates) at its own time.

2026-11-25 (shared 2 cores, load 4-5): before issue 26 (one test root, leaf signed by
it) cached 290-440 us, uncached 400-900 us; after: simulator G2 cached 440-510 us,
uncached 440-920 us; genuine G2 with the shipped trust cached 240-450 us, uncached
1.0-2.7 ms (docs/attestation.md)."""

from __future__ import annotations

import datetime as dt
import json
import logging
import statistics
import time

from functions.identity.attestation import AttestationVerifier, binding_nonces
from simulator import identity as sim_identity
from tests.identity.test_genuine import SAMPLES


def body_for(issuer: sim_identity.Issuer) -> bytes:
    envelope = {
        "schema": 1,
        "kind": "document",
        "vm": {"vm_id": "11111111-2222-3333-4444-555555555555", "name": "web_0"},
        "sequence": 7,
        "observed_at": "2026-11-24T10:00:00Z",
        "relay_version": "1.0.0",
        "callback_key": {"id": "0123456789abcdef", "secret": "ab" * 32},
        "document": {
            "DocumentIncarnation": 3,
            "Events": [
                {
                    "EventId": "602d9444-d2cd-49c7-8624-8643e7171297",
                    "EventType": "Reboot",
                    "ResourceType": "VirtualMachine",
                    "Resources": ["web_0", "web_1", "web_2"],
                    "EventStatus": "Scheduled",
                    "NotBefore": "Mon, 30 Nov 2026 10:00:00 GMT",
                    "Description": "Virtual machine is going to be restarted",
                    "EventSource": "Platform",
                    "DurationInSeconds": -1,
                }
            ],
        },
    }
    nonce, _ = binding_nonces(envelope)
    signature = sim_identity.attested_document(
        envelope["vm"]["vm_id"], "00000000-0000-0000-0000-000000000000", nonce, issuer
    )["signature"]
    return json.dumps(
        {**envelope, "attestation": {"signature": signature, "nonce": nonce}}
    ).encode()


def timed(verify, fresh_verifiers) -> tuple[float, float]:
    """(median cached us, uncached us) of `verify(verifier)`."""
    cached = fresh_verifiers(1)[0]
    verify(cached)
    runs = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(400):
            verify(cached)
        runs.append((time.perf_counter() - start) / 400 * 1e6)
    fresh = fresh_verifiers(100)
    start = time.perf_counter()
    for verifier in fresh:
        verify(verifier)
    return statistics.median(runs), (time.perf_counter() - start) / len(fresh) * 1e6


def main() -> None:
    logging.disable(logging.WARNING)
    issuer = sim_identity.test_issuer()
    body = body_for(issuer)
    now = dt.datetime.now(dt.UTC)
    cached, uncached = timed(
        lambda v: v.verify(body, now),
        lambda n: [AttestationVerifier(roots_pem=issuer.root_pem) for _ in range(n)],
    )
    print(
        f"simulator G2 message ({len(body)} bytes): cached {cached:.0f} us, "
        f"uncached {uncached:.0f} us"
    )
    sample = next(s for s in SAMPLES if "g2" in s.file)
    signature = sample.signature
    cached, uncached = timed(
        lambda v: v.verify_document(signature, sample.at),
        lambda n: [AttestationVerifier(fetch_issuers=False) for _ in range(n)],
    )
    print(f"genuine G2 document, shipped trust: cached {cached:.0f} us, uncached {uncached:.0f} us")


if __name__ == "__main__":
    main()
