"""The attestation's issuer fetch is no way into the app's network (issue 27).

An attested document's leaf is a certificate anyone can mint. The attacker signs its
message with a leaf of its own CA whose AIA caIssuers URL is
`http://127.0.0.1:PORT\\@www.microsoft.com/...`: urllib.parse sees www.microsoft.com (an
allowed issuer host), an HTTP client may connect to 127.0.0.1. Nothing may reach the
loopback server behind it, and the worker is not held: the message is rejected at once.
"""

from __future__ import annotations

import json
import logging
import time

import pytest

from functions.identity.attestation import AttestationVerifier, binding_nonces
from simulator import identity as azure
from tests.security.conftest import Fleet
from tests.security.test_one_vm import Listener


def test_a_backslash_issuer_url_never_reaches_a_loopback_server(
    fleet: Fleet, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
):
    # The verifier as deployed fetches a missing intermediate (the suite's trusts the
    # simulator's root, which turns the fetch off unless asked).
    fleet.pipeline.admission.verifier = AttestationVerifier(
        roots_pem=azure.test_issuer().root_pem, fetch_issuers=True
    )
    caplog.set_level(logging.INFO, logger="functions.identity.attestation")
    internal = Listener()
    try:
        port = internal.server.server_address[1]
        monkeypatch.setattr(azure, "PKI", f"http://127.0.0.1:{port}\\@www.microsoft.com/x/")
        root, root_key = azure.make_root("Attacker Issuing CA")
        leaf, leaf_key = azure.make_leaf(root, root_key)
        data = json.loads(fleet.vms["attacker"].message([]))
        data.pop("attestation", None)
        nonce = binding_nonces(data)[0]
        vm_id = data["vm"]["vm_id"]
        content = azure.attested_content(vm_id, "00000000-0000-0000-0000-000000000000", nonce)
        signature = azure.sign(content, leaf, leaf_key)
        forged = json.dumps({**data, "attestation": {"signature": signature, "nonce": nonce}})

        began = time.monotonic()
        result = fleet.deliver(forged)

        assert internal.paths == []  # never reached
        assert f"127.0.0.1:{port}" in caplog.text  # the URL was looked at, and refused
        assert time.monotonic() - began < 5.0  # no held worker
        assert result.outcome == "rejected" and result.reason.startswith("attestation:")
        # Legitimate: the attacker's genuine message is admitted.
        assert fleet.deliver(fleet.vms["attacker"].message([])).outcome == "processed"
    finally:
        internal.close()
