"""A guest clock minutes off still takes the app's callbacks (issue 46, finding 7a).

The relay judges a callback's timestamp by its clock corrected by the skew its heartbeats'
sender measured against the `Date` of Azure's answers (Azure's clock, the app's too): Table
storage's for heartbeats in the liveness table, Service Bus's for heartbeats on its queue.
Here the VM's clock is 400 s fast and a loopback Table storage stand-in answers with the
true time, or Azure's clock is 400 s ahead in the Service Bus stand-in's answers.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from relay.__main__ import callback_clock
from relay.attest import Attester
from relay.callback import CallbackApp, Refused
from relay.imds import ImdsClient
from relay.liveness import SplitSender, TableLiveness, http_date
from relay.models import Envelope, VmRef
from relay.senders import FileSender, build_sender
from relay.settings import load_settings
from tests.relay.conftest import KEY, VM0_ID, FixedKeys, sign_headers
from tests.relay.servicebus_standin import ServiceBusStandIn

TRUE_NOW = float(int(time.time()))  # Azure's time, whole seconds as in a Date header
FAST = 400.0  # how far ahead the VM's clock runs


@pytest.fixture
def table() -> Iterator[str]:
    """Table storage answering every write 204 with `Date` the true time."""

    class Answers(BaseHTTPRequestHandler):
        def do_PATCH(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            self.send_response(204)
            self.send_header("Date", http_date(TRUE_NOW))
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Answers)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/acct/lvliveness"
    finally:
        server.shutdown()
        server.server_close()


def fast_relay(table_url: str, tmp_path: Path) -> tuple[SplitSender, TableLiveness]:
    heartbeats = TableLiveness(
        table_url, sas="sig=x", keys=FixedKeys(KEY), clock=lambda: TRUE_NOW + FAST
    )
    return SplitSender(FileSender(tmp_path / "out"), heartbeats), heartbeats


def heartbeat(sender: Any) -> None:
    envelope = Envelope(
        kind="heartbeat",
        vm=VmRef(name="vm0", vm_id=VM0_ID),
        sequence=1,
        observed_at=datetime.now(UTC),
        relay_version="9.9.9",
    )
    sender.send(envelope, envelope.to_json())


def callback(simulator: Any, sender: SplitSender) -> CallbackApp:
    """The callback of vm0 as the relay makes it (relay.__main__), with a Freeze to approve."""
    simulator.sim.add_vm("vm0")
    imds = ImdsClient(simulator.vm_url("vm0"), 1.0)
    return CallbackApp(FixedKeys(), VM0_ID, "vm0", imds, clock=callback_clock(sender))


def start(app: CallbackApp, event_id: str, signed_at: float) -> tuple[int, dict[str, Any]]:
    body = json.dumps({"EventIds": [event_id]}).encode()
    headers = sign_headers(KEY, "POST", "/v1/start", body, now=signed_at)
    return app.post("/v1/start", {k.lower(): v for k, v in headers.items()}, body)


def freeze(simulator: Any) -> str:
    return str(
        simulator.sim.add_event(event_type="Freeze", resources=["vm0"], duration=5, notice=3600)
    )


def test_a_fast_vm_with_a_measured_skew_approves_a_callback_signed_on_the_true_time(
    simulator: Any, table: str, tmp_path: Path
) -> None:
    sender, heartbeats = fast_relay(table, tmp_path)
    heartbeat(sender)
    assert heartbeats.skew == -FAST  # measured against Table storage's Date
    app = callback(simulator, sender)
    event_id = freeze(simulator)
    status, answer = start(app, event_id, TRUE_NOW)
    assert (status, answer["results"]) == (200, {event_id: "approved"})
    with pytest.raises(Refused) as replayed:  # the same request again: still a replay
        start(app, event_id, TRUE_NOW)
    assert replayed.value.status == 409
    assert [a.event_id for a in simulator.sim.approvals] == [event_id]


def test_a_fast_vm_still_refuses_a_callback_older_than_the_window_on_the_true_time(
    simulator: Any, table: str, tmp_path: Path
) -> None:
    sender, _ = fast_relay(table, tmp_path)
    heartbeat(sender)
    app = callback(simulator, sender)
    event_id = freeze(simulator)
    for signed_at in (TRUE_NOW - 301, TRUE_NOW + 301):  # 701 s and 99 s from the VM's clock
        with pytest.raises(Refused) as stale:
            start(app, event_id, signed_at)
        assert (stale.value.status, stale.value.body["error"]) == (401, "stale timestamp")
    assert simulator.sim.approvals == []


def test_without_a_measured_skew_a_fast_vm_refuses_as_before(
    simulator: Any, table: str, tmp_path: Path
) -> None:
    sender, heartbeats = fast_relay(table, tmp_path)  # no heartbeat written: nothing measured
    assert heartbeats.skew == 0.0
    app = callback(simulator, sender)
    with pytest.raises(Refused) as stale:
        start(app, freeze(simulator), TRUE_NOW)
    assert (stale.value.status, stale.value.body["error"]) == (401, "stale timestamp")
    assert simulator.sim.approvals == []


def test_heartbeats_to_a_directory_leave_the_vms_own_clock(tmp_path: Path) -> None:
    assert callback_clock(FileSender(tmp_path / "out")) is time.time


# ------------------------------------------------------------------ heartbeats on Service Bus

AHEAD = 400.0  # how far Azure's clock (the stand-in's) runs ahead of this VM's


def servicebus_relay(standin: ServiceBusStandIn, simulator: Any, tmp_path: Path) -> Any:
    """The sender a relay without a liveness table builds (relay.senders.build_sender):
    documents and heartbeats attested, to the stand-in's queues, whose `Date` runs AHEAD."""
    standin.clock = lambda: time.time() + AHEAD
    simulator.sim.add_vm("vm0")
    connection = tmp_path / "sas.txt"
    connection.write_text(standin.connection_string)
    settings = load_settings(
        [
            f"--forward={standin.forward}",
            f"--sas-connection-string-file={connection}",
            f"--servicebus-endpoint={standin.endpoint}",
        ]
    )
    attester = Attester(ImdsClient(simulator.vm_url("vm0"), 5.0))
    return build_sender(settings, keys=FixedKeys(KEY), attester=attester)


def test_heartbeats_on_service_bus_measure_the_skew_from_its_date(
    simulator: Any, standin: ServiceBusStandIn, tmp_path: Path
) -> None:
    sender = servicebus_relay(standin, simulator, tmp_path)
    app = CallbackApp(
        FixedKeys(),
        VM0_ID,
        "vm0",
        ImdsClient(simulator.vm_url("vm0"), 1.0),
        clock=callback_clock(sender),
    )
    event_id = freeze(simulator)
    with pytest.raises(Refused) as stale:  # nothing measured yet: this VM's own clock
        start(app, event_id, time.time() + AHEAD)
    assert (stale.value.status, stale.value.body["error"]) == (401, "stale timestamp")
    heartbeat(sender)
    assert len(standin.heartbeats) == 1  # on the heartbeats queue, answered with its Date
    status, answer = start(app, event_id, time.time() + AHEAD)  # signed on Azure's time
    assert (status, answer["results"]) == (200, {event_id: "approved"})
    assert [a.event_id for a in simulator.sim.approvals] == [event_id]
    with pytest.raises(Refused) as old:  # older than the window on Azure's time
        start(app, freeze(simulator), time.time() + AHEAD - 301)
    assert (old.value.status, old.value.body["error"]) == (401, "stale timestamp")
