"""The poll loop against the IMDS simulator: one envelope per change, heartbeats, faults."""

from __future__ import annotations

import itertools
import json
import logging
import shutil
import threading
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from relay.imds import ImdsClient
from relay.models import VmRef
from relay.outbox import Outbox
from relay.senders import FileSender, SendLoop
from relay.watcher import Watcher
from tests.relay.conftest import json_files, wait_for


class Running:
    """A watcher and a file sender on threads, as `python -m relay` wires them."""

    def __init__(self, simulator: Any, tmp_path: Path, **watcher_args: Any) -> None:
        self.forward = tmp_path / "forward"
        self.outbox = Outbox(tmp_path / "state")
        self.stop_event = threading.Event()
        args = {"poll_interval": 0.05, "timeout": 0.5, "first_timeout": 5, "max_backoff": 0.1}
        args.update(watcher_args)
        self.watcher = Watcher(
            ImdsClient(simulator.vm_url("vm0")),
            self.outbox,
            VmRef(name="vm0"),
            stop=self.stop_event,
            **args,
        )
        self.sending = SendLoop(self.outbox, FileSender(self.forward), max_backoff=0.05).start()
        self.thread = threading.Thread(target=self.watcher.run, daemon=True)
        self.thread.start()

    def envelopes(self, kind: str | None = None) -> list[dict[str, Any]]:
        """Documents from DIR/, heartbeats from DIR/heartbeats/ (contract C1)."""
        found = [json.loads(p.read_text()) for p in json_files(self.forward)]
        found += [json.loads(p.read_text()) for p in json_files(self.forward / "heartbeats")]
        found.sort(key=lambda e: e["sequence"])
        return [e for e in found if kind is None or e["kind"] == kind]

    def documents(self) -> list[dict[str, Any]]:
        return [e["document"] for e in self.envelopes("document")]

    def stop(self) -> None:
        self.stop_event.set()
        self.thread.join(5)
        self.sending.stop()


@pytest.fixture
def running(simulator: Any, tmp_path: Path) -> Iterator[Any]:
    simulator.sim.add_vm("vm0")
    started: list[Running] = []

    def start(**kwargs: Any) -> Running:
        relay = Running(simulator, tmp_path / str(len(started)), **kwargs)
        started.append(relay)
        return relay

    yield start
    for relay in started:
        relay.stop()


def polls(simulator: Any) -> int:
    return simulator.sim.request_count("vm0")


def test_one_envelope_at_start_and_exactly_one_per_change(simulator: Any, running: Any) -> None:
    sim = simulator.sim
    relay = running()
    wait_for(lambda: len(relay.documents()) == 1)
    event_id = sim.add_event(event_type="Freeze", resources=["vm0"], duration=5, notice=3600)
    wait_for(lambda: len(relay.documents()) == 2)
    sim.start_event(event_id)
    wait_for(lambda: len(relay.documents()) == 3)
    sim.remove_event(event_id)
    wait_for(lambda: len(relay.documents()) == 4)
    before = polls(simulator)
    wait_for(lambda: polls(simulator) >= before + 10)  # idle polls change nothing
    assert relay.documents() == sim.history("vm0")
    statuses = [[e["EventStatus"] for e in d["Events"]] for d in relay.documents()]
    assert statuses == [[], ["Scheduled"], ["Started"], []]
    sequences = [e["sequence"] for e in relay.envelopes()]
    assert sequences == sorted(sequences) and len(set(sequences)) == len(sequences)


def test_several_quick_changes_are_each_forwarded(simulator: Any, running: Any) -> None:
    sim = simulator.sim
    relay = running()
    wait_for(lambda: len(relay.documents()) == 1)
    for _ in range(5):
        sim.add_event(event_type="Reboot", resources=["vm0"], notice=3600)
        before = polls(simulator)
        wait_for(lambda b=before: polls(simulator) >= b + 2)
    wait_for(lambda: len(relay.documents()) == 6)
    assert relay.documents() == sim.history("vm0")


def test_heartbeats_on_time(simulator: Any, running: Any) -> None:
    relay = running(heartbeat_interval=0.4)
    wait_for(lambda: len(relay.envelopes("heartbeat")) >= 4, timeout=10)
    beats = relay.envelopes("heartbeat")
    times = [datetime.fromisoformat(e["observed_at"]).timestamp() for e in beats]
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert all(0.2 < gap < 1.0 for gap in gaps), gaps
    assert beats[0]["imds_healthy"] is True
    assert len(relay.documents()) == 1  # heartbeats are not documents


FAULTS = [
    pytest.param({"kind": "status", "status": 500}, "http-500", id="500"),
    pytest.param({"kind": "status", "status": 503}, "http-503", id="503"),
    pytest.param({"kind": "status", "status": 429}, "http-429", id="429"),
    pytest.param({"kind": "status", "status": 400}, "http-400", id="400"),
    pytest.param({"kind": "slow", "seconds": 1.0}, "timeout", id="slow"),
    pytest.param({"kind": "drop"}, "connection", id="drop"),
    pytest.param({"kind": "malformed"}, "malformed", id="malformed"),
]


@pytest.mark.parametrize(("fault", "kind"), FAULTS)
def test_every_imds_fault_is_survived_and_logged_once_per_streak(
    simulator: Any,
    running: Any,
    caplog: pytest.LogCaptureFixture,
    fault: dict[str, Any],
    kind: str,
) -> None:
    sim = simulator.sim
    with caplog.at_level(logging.INFO, logger="relay.watcher"):
        relay = running(timeout=0.3)
        wait_for(lambda: len(relay.documents()) == 1)
        sim.inject_fault(vm="vm0", count=4, **fault)
        event_id = sim.add_event(event_type="Freeze", resources=["vm0"], notice=3600)
        wait_for(lambda: len(relay.documents()) == 2)
        wait_for(lambda: not relay.watcher.streak.failing)
    assert relay.documents()[1]["Events"][0]["EventId"] == event_id
    errors = [r for r in caplog.records if r.getMessage().startswith("IMDS error")]
    assert [r.fields["kind"] for r in errors] == [kind]
    recovered = [r for r in caplog.records if r.getMessage() == "IMDS recovered"]
    assert len(recovered) == 1 and recovered[0].fields["errors_in_streak"] == 4
    assert relay.thread.is_alive()


def test_mixed_faults_log_each_kind_once(
    simulator: Any, running: Any, caplog: pytest.LogCaptureFixture
) -> None:
    sim = simulator.sim
    with caplog.at_level(logging.INFO, logger="relay.watcher"):
        relay = running(timeout=0.3)
        wait_for(lambda: len(relay.documents()) == 1)
        fault = sim.inject_fault("status", vm="vm0", count=None, status=503)
        wait_for(lambda: relay.watcher.streak.count >= 3)
        sim.clear_faults()
        sim.inject_fault("drop", vm="vm0", count=3)
        sim.inject_fault("status", vm="vm0", count=3, status=503)
        wait_for(lambda: relay.watcher.healthy)
    assert fault
    errors = [r.fields["kind"] for r in caplog.records if r.getMessage().startswith("IMDS error")]
    assert sorted(errors) == ["connection", "http-503"]


def test_the_first_call_may_take_long(
    simulator: Any, running: Any, caplog: pytest.LogCaptureFixture
) -> None:
    simulator.sim.inject_fault("first-call-delay", vm="vm0", seconds=1.0)
    with caplog.at_level(logging.INFO, logger="relay.watcher"):
        relay = running(timeout=0.3, first_timeout=5)
        wait_for(lambda: len(relay.documents()) == 1)
    assert not [r for r in caplog.records if r.getMessage().startswith("IMDS error")]


def test_imds_unreachable_at_start_then_up(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from simulator import Simulator, SimulatorServer
    from tests.conftest import free_port

    port = free_port()
    sim = Simulator(time_scale=60.0)
    sim.add_vm("vm0")

    class Late:
        def vm_url(self, name: str) -> str:
            return f"http://127.0.0.1:{port}/vm/{name}"

    with caplog.at_level(logging.INFO, logger="relay.watcher"):
        relay = Running(Late(), tmp_path, poll_interval=0.05, max_backoff=0.1)
        try:
            wait_for(lambda: relay.watcher.streak.count >= 3)
            server = SimulatorServer(sim, port=port).start()
            try:
                wait_for(lambda: len(relay.documents()) == 1)
            finally:
                server.stop()
        finally:
            relay.stop()
    errors = [r for r in caplog.records if r.getMessage().startswith("IMDS error")]
    assert len(errors) == 1 and errors[0].fields["kind"] == "connection"


def test_a_document_the_disk_refused_is_queued_later(
    simulator: Any, running: Any, caplog: pytest.LogCaptureFixture
) -> None:
    relay = running()
    wait_for(lambda: len(relay.documents()) == 1)
    relay.sending.stop()  # hold the outbox still while its directory is gone
    shutil.rmtree(relay.outbox.directory)
    with caplog.at_level(logging.ERROR, logger="relay.watcher"):
        simulator.sim.add_event(event_type="Reboot", resources=["vm0"], notice=3600)
        wait_for(lambda: "outbox error" in caplog.text)
    relay.outbox.directory.mkdir()
    wait_for(lambda: len(relay.outbox) == 1)
    relay.sending = SendLoop(relay.outbox, FileSender(relay.forward)).start()
    wait_for(lambda: len(relay.documents()) == 2)
    assert relay.documents() == simulator.sim.history("vm0")


def test_heartbeats_continue_while_imds_is_down_and_say_so(tmp_path: Path) -> None:
    from tests.conftest import free_port

    class Nowhere:
        def vm_url(self, name: str) -> str:
            return f"http://127.0.0.1:{free_port()}/vm/{name}"

    relay = Running(Nowhere(), tmp_path, heartbeat_interval=0.2, max_backoff=0.1)
    try:
        wait_for(lambda: len(relay.envelopes("heartbeat")) >= 2)
    finally:
        relay.stop()
    beat = relay.envelopes("heartbeat")[-1]
    assert beat["imds_healthy"] is False and beat["imds_error"] == "connection"
    assert relay.documents() == []
