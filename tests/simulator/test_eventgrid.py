"""The Event Grid stand-in: what it publishes, when, for whom; duplicates and reordering;
its sinks; the CLI flags. Checked against the function app's own parser, so the
simulator cannot drift from what ingest accepts."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from functions.pipeline.sources.eventgrid import parse_message
from simulator import Simulator
from simulator.eventgrid import EventGridPublisher, directory_sink, http_sink
from tests.simulator.test_cli import (
    Running,  # noqa: F401 - the run fixture's class
    run,  # noqa: F401
)


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


def collect(sim, **options):
    bodies: list[bytes] = []
    publisher = EventGridPublisher(
        sim, lambda body, mid: bodies.append(body), hold_seconds=0.05, **options
    ).start()
    return publisher, bodies


def statuses(bodies):
    out = []
    for body in bodies:
        events, rejected = parse_message(body)
        assert rejected == []
        out.extend(
            (g.event.event_id, g.status, g.owner.resource_type, g.owner.name) for g in events
        )
    return out


@pytest.mark.parametrize("schema", ["eventgrid", "cloudevents"])
def test_every_status_of_an_opted_in_scale_set(schema):
    clock = Clock()
    sim = Simulator(clock=clock)
    sim.add_scale_set("web", 2)
    publisher, bodies = collect(sim, opted_in=["web"], schema=schema)
    approved = sim.add_event("Reboot", resources=["web_0"], event_id="EV-1", notice=60, impact=5)
    cancelled = sim.add_event("Redeploy", resources=["web_1"], event_id="EV-2")
    sim.acknowledge("virtualMachineScaleSets", "web", approved)
    sim.cancel_event(cancelled)
    clock.now += 10
    sim.tick()
    assert publisher.flush()
    assert statuses(bodies) == [
        ("EV-1", "Scheduled", "virtualMachineScaleSets", "web"),
        ("EV-2", "Scheduled", "virtualMachineScaleSets", "web"),
        ("EV-1", "Started", "virtualMachineScaleSets", "web"),
        ("EV-2", "Canceled", "virtualMachineScaleSets", "web"),
        ("EV-1", "Completed", "virtualMachineScaleSets", "web"),
    ]
    first = json.loads(bodies[0])
    assert ("specversion" in first) == (schema == "cloudevents")
    publisher.stop()


def test_only_opted_in_owners_are_published():
    sim = Simulator(clock=Clock())
    sim.add_vm("solo")
    sim.add_vm("quiet")
    sim.add_availability_set("as1", ["a1", "a2"])
    publisher, bodies = collect(sim, opted_in=["solo", "as1", "a1"])
    sim.add_event("Freeze", resources=["solo"], event_id="EV-S")
    sim.add_event("Freeze", resources=["quiet"], event_id="EV-Q")
    sim.add_event("Freeze", resources=["a1"], event_id="EV-A")
    assert publisher.flush()
    assert [(e, o) for e, _, _, o in statuses(bodies)] == [("EV-S", "solo"), ("EV-A", "as1")]
    publisher.stop()


def test_duplicates_and_reordering_are_seeded():
    def run_once():
        sim = Simulator(clock=Clock())
        sim.add_vm("solo")
        publisher, bodies = collect(
            sim, opted_in=["*"], duplicate_rate=0.3, reorder_rate=0.3, seed=7
        )
        for i in range(12):
            event_id = sim.add_event("Freeze", resources=["solo"], event_id=f"EV-{i}")
            sim.start_event(event_id)
        assert publisher.flush()
        publisher.stop()
        return [json.loads(b)["id"] for b in bodies], statuses(bodies)

    ids, seen = run_once()
    _, again_seen = run_once()
    assert seen == again_seen  # deterministic for a seed
    assert len(ids) > len(set(ids)) == 24  # some delivered twice, with the same id
    order = [(e, s) for e, s, _, _ in seen]
    started_first = [
        e
        for e, s in order
        if s == "Started" and order.index((e, "Scheduled")) > order.index((e, s))
    ]
    assert started_first  # some Started arrived before their Scheduled


def test_directory_sink_writes_whole_files_the_local_host_reads(tmp_path: Path):
    sim = Simulator(clock=Clock())
    sim.add_vm("solo")
    publisher = EventGridPublisher(sim, directory_sink(tmp_path), opted_in=["solo"]).start()
    sim.add_event("Reboot", resources=["solo"], event_id="EV-D")
    assert publisher.flush()
    publisher.stop()
    files = sorted(tmp_path.iterdir())
    assert [f.name.endswith("-eventgrid.json") for f in files] == [True]
    assert statuses([files[0].read_bytes()])[0][:2] == ("EV-D", "Scheduled")


def test_http_sink_posts_an_array_like_event_grid_webhooks():
    received: list[tuple[dict, bytes]] = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_POST(self):
            body = self.rfile.read(int(self.headers["Content-Length"]))
            received.append((dict(self.headers), body))
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        sim = Simulator(clock=Clock())
        sim.add_vm("solo")
        url = f"http://127.0.0.1:{server.server_address[1]}/events"
        publisher = EventGridPublisher(sim, http_sink(url), opted_in=["solo"]).start()
        sim.add_event("Reboot", resources=["solo"], event_id="EV-H")
        assert publisher.flush()
        publisher.stop()
    finally:
        server.shutdown()
        server.server_close()
    ((headers, body),) = received
    assert headers["aeg-event-type"] == "Notification"
    assert json.loads(body)[0]["eventType"].endswith("ScheduledEventEmitted")
    assert statuses([body])[0][:2] == ("EV-H", "Scheduled")


def test_cli_publishes_to_an_inbox_and_serves_arm(run, tmp_path):  # noqa: F811
    proc = run(
        "--vm",
        "solo",
        "--scale-set",
        "web:2",
        "--time-scale",
        "60",
        "--scenario",
        "user-reboot@solo",
        "--event-grid",
        str(tmp_path),
        "--opt-in",
        "solo",
        "--event-grid-schema",
        "cloudevents",
    )
    ready = proc.ready()
    assert ready["arm"] == f"{ready['url']}/arm"
    proc.wait_line(lambda line: "Scheduled" in line)
    deadline = time.monotonic() + 10

    def published() -> list:
        # Not the sink's temporary ".…json" files: they are renamed into place when whole.
        return sorted(p for p in tmp_path.glob("*.json") if not p.name.startswith("."))

    while time.monotonic() < deadline and not published():
        time.sleep(0.05)
    (first,) = published()[:1]
    data = json.loads(first.read_text())
    assert data["specversion"] == "1.0" and "/virtualMachines/solo/" in data["subject"]


def test_cli_refuses_an_unknown_opt_in(run, tmp_path):  # noqa: F811
    proc = run("--vm", "solo", "--event-grid", str(tmp_path), "--opt-in", "nope")
    assert proc.proc.wait(timeout=10) == 2
    assert "no VM, scale set or availability set" in proc.proc.stderr.read()
