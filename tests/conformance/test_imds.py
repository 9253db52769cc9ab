"""IMDS, held to Microsoft's published examples (tests/conformance/SOURCES.md).

- Scheduled Events: the four documents of "Example responses" on the Learn page
  (a live migration: empty, Scheduled, Started with NotBefore "", empty), and the
  StartRequests body and headers the page documents for approving an event.
- Compute metadata, the attested document and a managed identity token: the examples of
  Azure/azure-rest-api-specs' IMDS specification, served as IMDS would answer them.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from functions.model.envelope import parse_document as app_parse
from relay.imds import COMPUTE_API_VERSION, ImdsClient
from relay.models import SCHEDULED_EVENTS_API_VERSION
from relay.models import parse_document as relay_parse
from tests.conformance.imds_server import serve

SAMPLES = Path(__file__).with_name("samples")


def sample(name: str) -> Any:
    return json.loads((SAMPLES / name).read_text())


LEARN_DOCUMENTS = sample("imds-scheduledevents-learn.json")


@pytest.mark.parametrize(
    "document", LEARN_DOCUMENTS, ids=lambda d: f"incarnation-{d['DocumentIncarnation']}"
)
def test_the_learn_pages_documents_parse_alike_in_the_relay_and_the_app(document) -> None:
    app, relay = app_parse(document), relay_parse(document)
    assert app.document_incarnation == relay.document_incarnation
    assert [e.event_id for e in app.events] == [e.event_id for e in relay.events]
    for ours, theirs in zip(app.events, relay.events, strict=True):
        assert ours.not_before == theirs.not_before
        assert (ours.event_type, ours.event_status) == (theirs.event_type, theirs.event_status)
        assert tuple(ours.resources) == tuple(theirs.resources)


def test_the_documented_fields_mean_what_the_page_says() -> None:
    scheduled = app_parse(LEARN_DOCUMENTS[1]).events[0]
    assert scheduled.not_before == datetime(2026, 4, 11, 22, 26, 58, tzinfo=UTC)  # RFC 1123
    assert scheduled.affects("westno_0") and scheduled.affects("WestNO_1")  # any case
    assert (scheduled.event_source, scheduled.duration_in_seconds) == ("Platform", 5)
    started = app_parse(LEARN_DOCUMENTS[2]).events[0]
    assert started.is_started and started.not_before is None  # "" once Started


def test_approving_posts_the_documented_start_requests() -> None:
    """POST /metadata/scheduledevents?api-version=2020-07-01, header Metadata: true, body
    {"StartRequests": [{"EventId": ...}]}; IMDS answers 200 (the page's "Start an event")."""
    with serve({"/metadata/scheduledevents": (200, {})}) as (url, answers):
        status, _ = ImdsClient(url, 2.0).start_events(["C7061BAC-AFDC-4513-B24B-AA5F13A16123"])
    assert status == 200
    (seen,) = answers.seen
    assert (seen.method, seen.path) == ("POST", "/metadata/scheduledevents")
    assert seen.query["api-version"] == [SCHEDULED_EVENTS_API_VERSION] == ["2020-07-01"]
    assert seen.headers["metadata"] == "true"
    assert json.loads(seen.body) == {
        "StartRequests": [{"EventId": "C7061BAC-AFDC-4513-B24B-AA5F13A16123"}]
    }


def test_the_relay_knows_itself_from_the_specs_compute_example() -> None:
    from relay.__main__ import resolve_vm

    example = sample("GetInstanceMetadata.2021-02-01.json")
    assert example["parameters"]["api-version"] == COMPUTE_API_VERSION
    compute = example["responses"]["200"]["body"]["compute"]
    settings = SimpleNamespace(
        imds_first_timeout=2.0,
        imds_max_backoff=0.1,
        vm_name=None,
        advertised_callback_url=None,
        availability_set=None,
    )
    import threading

    with serve({"/metadata/instance/compute": (200, compute)}) as (url, answers):
        vm = resolve_vm(ImdsClient(url, 2.0), settings, threading.Event())
    assert answers.seen[0].query["api-version"] == ["2021-02-01"]
    assert answers.seen[0].headers["metadata"] == "true"
    assert vm is not None
    assert (vm.name, vm.vm_id) == ("examplevmname", "02aab8a4-74ef-476e-8182-f6d2ba4166a6")
    assert vm.scale_set == "crpteste9vflji9"
    assert vm.subscription_id == "8d10da13-8125-4ba9-a717-bf7490507b3d"
    assert vm.resource_group == "macikgo-test-may-23"
    assert vm.resource_id == compute["resourceId"]


def test_the_relay_takes_the_signature_from_the_specs_attested_example() -> None:
    from relay.attest import Attester

    body = sample("GetAttestedData.2021-02-01.json")["responses"]["200"]["body"]
    envelope = {"schema": 1, "kind": "heartbeat", "vm": {"name": "examplevmname"}}
    with serve({"/metadata/attested/document": (200, body)}) as (url, answers):
        attestation = Attester(ImdsClient(url, 2.0)).attestation(envelope)
    assert attestation["signature"] == body["signature"]
    (seen,) = answers.seen
    assert seen.query["nonce"] == [attestation["nonce"]] and seen.headers["metadata"] == "true"


def test_the_app_refuses_the_specs_attested_example_a_test_certificate() -> None:
    """The specification's example is signed by a self-signed test certificate
    (testsubdomain.metadata.azure.com, MD5, expired 2018): never a trusted signer."""
    from functions.identity.attestation import AttestationError, AttestationVerifier

    body = sample("GetAttestedData.2021-02-01.json")["responses"]["200"]["body"]
    with pytest.raises(AttestationError):
        AttestationVerifier(fetch_issuers=False).verify_signature(
            body["signature"], datetime(2018, 11, 20, tzinfo=UTC)
        )


def test_the_managed_identity_token_example_is_read_as_documented() -> None:
    """access_token, expires_on as a string of epoch seconds (api-version 2018-02-01)."""
    from relay.identity import ManagedIdentityTokenProvider

    example = sample("getIdentityToken.2018-02-01.json")
    body = example["responses"]["200"]["body"]
    path = "/metadata/identity/oauth2/token"
    with serve({path: (200, body)}) as (url, answers):
        tokens = ManagedIdentityTokenProvider(
            url, None, resource="https://servicebus.azure.net", clock=lambda: 1541700000.0
        )
        assert tokens.authorization() == "Bearer dummytoken"
    (seen,) = answers.seen
    assert seen.query["api-version"] == [example["parameters"]["api-version"]]
    assert seen.headers["metadata"] == "true"


@pytest.mark.parametrize("status", [400, 404, 429, 500])
def test_the_token_errors_the_spec_lists_are_send_errors(status: int) -> None:
    from relay.identity import ManagedIdentityTokenProvider
    from relay.sendbase import SendError

    body = sample("getIdentityToken.2018-02-01.json")["responses"][str(status)]["body"]
    with serve({"/metadata/identity/oauth2/token": (status, body)}) as (url, _):
        tokens = ManagedIdentityTokenProvider(url, None)
        with pytest.raises(SendError) as raised:
            tokens.authorization()
    assert raised.value.slow == (status in (400, 404))  # a missing identity will not heal
