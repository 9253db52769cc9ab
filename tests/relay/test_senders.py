"""Senders against the local Service Bus stand-in (which checks what Azure checks)."""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from relay.models import Envelope, VmRef
from relay.outbox import Outbox
from relay.senders import FileSender, SendError, SendLoop, build_sender
from relay.servicebus import (
    ManagedIdentityTokenProvider,
    SasTokenProvider,
    ServiceBusSender,
    sas_token,
)
from relay.settings import load_settings
from tests.relay.conftest import wait_for
from tests.relay.servicebus_standin import ServiceBusStandIn

VM = VmRef(name="vm0", scale_set="web")


def document(incarnation: int, sequence: int = 1) -> Envelope:
    return Envelope(
        kind="document",
        vm=VM,
        sequence=sequence,
        observed_at=datetime.now(UTC),
        document={"DocumentIncarnation": incarnation, "Events": []},
    )


def sas_sender(standin: ServiceBusStandIn, **overrides: Any) -> ServiceBusSender:
    connection = overrides.pop("connection_string", standin.connection_string)
    tokens = SasTokenProvider(connection, f"https://{standin.namespace}/{standin.queue}")
    return ServiceBusSender(
        standin.namespace,
        standin.queue,
        tokens,
        ttl_seconds=3600,
        timeout=5,
        endpoint=standin.endpoint,
        **overrides,
    )


def test_sas_send_sets_broker_properties(standin: ServiceBusStandIn) -> None:
    envelope = document(7)
    sas_sender(standin).send(envelope, envelope.to_json())
    [received] = standin.messages
    assert received.properties["MessageId"] == envelope.message_id()
    assert received.properties["SessionId"] == "vm0"
    assert received.properties["TimeToLive"] == 3600
    assert received.content_type == "application/json"
    assert received.envelope["document"]["DocumentIncarnation"] == 7


def test_the_sas_token_follows_azures_documented_scheme() -> None:
    # Microsoft's published Python sample, computed independently.
    import base64
    import hashlib
    import hmac
    import urllib.parse

    uri = urllib.parse.quote_plus("https://ns.servicebus.windows.net/q")
    digest = hmac.new(b"key", f"{uri}\n1700000000".encode(), hashlib.sha256).digest()
    sig = urllib.parse.quote(base64.b64encode(digest))
    assert sas_token("https://ns.servicebus.windows.net/q", "send", "key", 1700000000) == (
        f"SharedAccessSignature sr={uri}&sig={sig}&se=1700000000&skn=send"
    )


def test_sas_tokens_are_renewed_before_they_expire() -> None:
    now = [1000.0]
    provider = SasTokenProvider(
        "Endpoint=sb://ns/;SharedAccessKeyName=n;SharedAccessKey=k",
        "https://ns/q",
        validity=3600,
        clock=lambda: now[0],
    )
    first = provider.authorization()
    now[0] += 60
    assert provider.authorization() == first
    now[0] += 3600 * 0.8
    assert provider.authorization() != first


def test_a_connection_string_for_another_queue_is_refused() -> None:
    with pytest.raises(ValueError, match="not queue"):
        SasTokenProvider(
            "Endpoint=sb://ns/;SharedAccessKeyName=n;SharedAccessKey=k;EntityPath=other",
            "https://ns/documents",
        )
    with pytest.raises(ValueError, match="SharedAccessKey"):
        SasTokenProvider("Endpoint=sb://ns/", "https://ns/documents")


@pytest.mark.parametrize(
    ("status", "cause"),
    [(401, "unauthorized"), (403, "quota"), (404, "does not exist"), (410, "does not exist")],
)
def test_configuration_failures_are_slow_and_name_the_cause(
    standin: ServiceBusStandIn, status: int, cause: str
) -> None:
    standin.fail(status)
    with pytest.raises(SendError) as info:
        sas_sender(standin).send(document(1), document(1).to_json())
    assert info.value.slow
    assert info.value.kind == f"http-{status}"
    assert cause in str(info.value)


def test_a_wrong_key_is_a_401_from_the_standin(standin: ServiceBusStandIn) -> None:
    wrong = standin.connection_string.replace(standin.key, "d3Jvbmc=")
    with pytest.raises(SendError, match="401") as info:
        sas_sender(standin, connection_string=wrong).send(document(1), document(1).to_json())
    assert info.value.slow
    assert standin.rejections == ["SAS signature does not match"]
    assert standin.messages == []


@pytest.mark.parametrize("status", [429, 500, 503])
def test_busy_and_unavailable_are_retried_fast(standin: ServiceBusStandIn, status: int) -> None:
    standin.fail(status, retry_after="7")
    with pytest.raises(SendError) as info:
        sas_sender(standin).send(document(1), document(1).to_json())
    assert not info.value.slow
    assert info.value.retry_after == 7


def test_timeouts_and_refused_connections_are_transient() -> None:
    tokens = SasTokenProvider("SharedAccessKeyName=n;SharedAccessKey=k", "https://ns/q")
    from tests.conftest import free_port

    sender = ServiceBusSender(
        "ns", "q", tokens, 60, timeout=1, endpoint=f"http://127.0.0.1:{free_port()}"
    )
    with pytest.raises(SendError) as info:
        sender.send(document(1), document(1).to_json())
    assert info.value.kind == "connection" and not info.value.slow


def test_managed_identity_bearer_token_from_imds(
    simulator: Any, standin: ServiceBusStandIn
) -> None:
    simulator.sim.add_vm("vm0")
    tokens = ManagedIdentityTokenProvider(simulator.vm_url("vm0"))
    sender = ServiceBusSender(
        standin.namespace, standin.queue, tokens, 60, endpoint=standin.endpoint
    )
    for incarnation in (1, 2):
        sender.send(document(incarnation), document(incarnation).to_json())
    assert len(standin.messages) == 2
    assert simulator.sim.request_count("vm0", "token") == 1  # cached, not fetched per send


def test_managed_identity_token_is_refreshed_before_expiry(simulator: Any) -> None:
    simulator.sim.add_vm("vm0")
    now = [datetime.now(UTC).timestamp()]
    tokens = ManagedIdentityTokenProvider(simulator.vm_url("vm0"), clock=lambda: now[0])
    first = tokens.authorization()
    assert tokens._refresh_at <= tokens._expires - 300  # at least 5 minutes early
    now[0] = tokens._refresh_at - 1
    assert tokens.authorization() == first
    now[0] = tokens._refresh_at + 1
    tokens.authorization()
    assert simulator.sim.request_count("vm0", "token") == 2


def test_managed_identity_failure_is_a_send_error(simulator: Any) -> None:
    simulator.sim.add_vm("vm0")
    simulator.sim.inject_fault("status", vm="vm0", status=500, endpoint="token")
    with pytest.raises(SendError, match="managed identity token"):
        ManagedIdentityTokenProvider(simulator.vm_url("vm0")).authorization()


def test_service_bus_down_then_back_delivers_everything_in_order(
    tmp_path: Path, standin: ServiceBusStandIn, caplog: pytest.LogCaptureFixture
) -> None:
    outbox = Outbox(tmp_path)
    for incarnation in range(1, 6):
        outbox.append(document(incarnation))
    standin.fail(503, count=None)
    loop = SendLoop(outbox, sas_sender(standin), max_backoff=0.05)
    with caplog.at_level(logging.INFO, logger="relay.sender"):
        loop.start()
        try:
            wait_for(lambda: len(standin.statuses) >= 6)
            for incarnation in range(6, 9):
                outbox.append(document(incarnation))
            standin.heal()
            wait_for(lambda: len(outbox) == 0)
        finally:
            loop.stop()
    incarnations = [e["document"]["DocumentIncarnation"] for e in standin.envelopes()]
    assert incarnations == list(range(1, 9))
    sequences = [e["sequence"] for e in standin.envelopes()]
    assert sequences == sorted(sequences)
    errors = [r for r in caplog.records if "error" in r.getMessage()]
    assert len(errors) == 1  # one line for the whole outage
    assert any("recovered" in r.getMessage() for r in caplog.records)


def test_a_401_keeps_the_message_and_retries_slowly(
    tmp_path: Path, standin: ServiceBusStandIn, caplog: pytest.LogCaptureFixture
) -> None:
    outbox = Outbox(tmp_path)
    outbox.append(document(1))
    standin.fail(401, count=2)
    delays: list[float] = []

    def sleep(seconds: float) -> bool:
        delays.append(seconds)
        return False

    loop = SendLoop(outbox, sas_sender(standin), slow_retry=30, sleep=sleep)
    with caplog.at_level(logging.ERROR, logger="relay.sender"):
        loop.start()
        try:
            wait_for(lambda: len(outbox) == 0)
        finally:
            loop.stop()
    assert len(standin.messages) == 1
    assert delays and min(delays) >= 24  # slow retry with jitter, not a fast loop
    [line] = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert "Data Sender" in line.getMessage()


def test_file_sender_writes_one_atomic_file_per_message_sorting_in_order(tmp_path: Path) -> None:
    sender = FileSender(tmp_path / "out")
    for sequence in (9, 10, 11):
        envelope = document(sequence, sequence=sequence)
        sender.send(envelope, envelope.to_json())
    sender.send(document(10, sequence=10), document(10, sequence=10).to_json())  # a resend
    names = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert names == [
        "000000000009-vm0-document.json",
        "000000000010-vm0-document.json",
        "000000000011-vm0-document.json",
    ]
    assert json.loads((tmp_path / "out" / names[0]).read_text())["sequence"] == 9


def test_build_sender_from_settings(tmp_path: Path, standin: ServiceBusStandIn) -> None:
    conn = tmp_path / "sas.txt"
    conn.write_text(standin.connection_string + "\n")
    settings = load_settings(
        [
            f"--forward={standin.forward}",
            f"--sas-connection-string-file={conn}",
            f"--servicebus-endpoint={standin.endpoint}",
        ]
    )
    sender = build_sender(settings)
    sender.send(document(1), document(1).to_json())
    assert len(standin.messages) == 1
    assert isinstance(build_sender(load_settings(["--forward=file:/x"])), FileSender)
