"""`python -m simulator` as a user runs it: a real process, a real port, real signals."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from simulator import EventSpec, ScenarioFileError, Simulator, load_scenario_file
from simulator.cli import build_parser, build_simulator, schedule_scenarios

ROOT = Path(__file__).resolve().parents[2]
HEADERS = {"Metadata": "true"}
V = {"api-version": "2020-07-01"}


class Running:
    """A simulator process whose output lines are collected by a reader thread."""

    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "simulator", "--port", "0", *args],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))

    def wait_line(self, predicate: object, timeout: float = 10.0) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=0.1)
            except queue.Empty:
                if self.proc.poll() is not None and self.lines.empty():
                    break
                continue
            self.seen.append(line)
            if predicate(line):  # type: ignore[operator]
                return line
        stderr = self.proc.stderr.read() if self.proc.poll() is not None else ""  # type: ignore[union-attr]
        raise AssertionError(f"line not seen; got {self.seen!r}; stderr {stderr!r}")

    def ready(self) -> dict:
        line = self.wait_line(lambda text: text.startswith("READY "))
        return json.loads(line.removeprefix("READY "))

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=10)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()


@pytest.fixture
def run() -> Iterator[type[Running]]:
    started: list[Running] = []

    class Tracked(Running):
        def __init__(self, *args: str) -> None:
            super().__init__(*args)
            started.append(self)

    yield Tracked
    for proc in started:
        if proc.proc.poll() is None:
            proc.proc.kill()
            proc.proc.wait(timeout=10)


def get(url: str) -> dict:
    response = requests.get(f"{url}/metadata/scheduledevents", headers=HEADERS, params=V, timeout=5)
    assert response.status_code == 200, response.text
    return response.json()


def test_cli_serves_my_vm_and_stops_on_sigterm(run: type[Running]) -> None:
    sim = run()
    ready = sim.ready()
    assert list(ready["vms"]) == ["myVM"] and ready["root"] == "myVM"
    assert ready["vms"]["myVM"] == f"{ready['url']}/vm/myVM"
    assert any(line.startswith("VM myVM: ") for line in sim.seen)
    assert get(ready["url"]) == {"DocumentIncarnation": 1, "Events": []}
    assert get(ready["vms"]["myVM"]) == {"DocumentIncarnation": 1, "Events": []}
    assert sim.stop() == 0
    assert sim.wait_line(lambda text: text == "simulator stopped")


def test_cli_vms_sets_and_a_scenario_printing_changes(run: type[Running]) -> None:
    sim = run(
        "--vm",
        "solo",
        "--availability-set",
        "as1:a,b",
        "--scale-set",
        "web:2",
        "--spot",
        "cheap",
        "--time-scale",
        "1800",
        "--scenario",
        "live-migration@as1",
    )
    ready = sim.ready()
    assert list(ready["vms"]) == ["solo", "a", "b", "web_0", "web_1", "cheap"]
    assert ready["root"] == "solo"
    line = sim.wait_line(lambda text: " a incarnation 2: Freeze Scheduled " in text)
    assert "Resources=a,b" in line
    sim.wait_line(lambda text: " b incarnation 3: Freeze Started " in text)
    sim.wait_line(lambda text: " b incarnation 4: no events" in text)
    assert get(ready["vms"]["solo"])["Events"] == []
    compute = requests.get(
        f"{ready['vms']['web_1']}/metadata/instance/compute",
        headers=HEADERS,
        params={"api-version": "2021-02-01"},
        timeout=5,
    ).json()
    assert compute["vmScaleSetName"] == "web"
    assert sim.stop() == 0


def test_cli_control_api_and_approval(run: type[Running]) -> None:
    sim = run("--time-scale", "60", "--approval-mode", "all")
    ready = sim.ready()
    created = requests.post(
        f"{ready['url']}/_sim/scenarios", json={"name": "user-reboot"}, timeout=5
    ).json()
    (eid,) = created["EventIds"]
    sim.wait_line(lambda text: f"Reboot Scheduled {eid}" in text)
    response = requests.post(
        f"{ready['url']}/metadata/scheduledevents",
        headers=HEADERS,
        params=V,
        json={"StartRequests": [{"EventId": eid}]},
        timeout=5,
    )
    assert response.status_code == 200
    sim.wait_line(lambda text: f"Reboot Started {eid}" in text)
    assert sim.stop() == 0


def test_cli_scenario_file_and_exit_when_done(run: type[Running], tmp_path: Path) -> None:
    scenario = tmp_path / "rehearsal.json"
    scenario.write_text(
        json.dumps(
            [
                {"at": 0, "scenario": "hardware-failure"},
                {
                    "at": 60,
                    "EventType": "Freeze",
                    "Resources": ["myVM"],
                    "DurationInSeconds": 3,
                    "notice": 120,
                    "impact": 30,
                },
            ]
        )
    )
    sim = run("--time-scale", "1200", "--scenario-file", str(scenario), "--exit-when-done")
    sim.ready()
    sim.wait_line(lambda text: "myVM incarnation 2: Reboot Started " in text)
    sim.wait_line(lambda text: "Freeze Scheduled" in text)
    sim.wait_line(lambda text: text == "all scenarios played out")
    assert sim.proc.wait(timeout=10) == 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--scenario", "meteor"], "unknown scenario"),
        (["--scenario", "preempt"], "Spot"),
        (["--scenario", "live-migration@ghost"], "ghost"),
        (["--availability-set", "as1"], "NAME:VM1,VM2"),
        (["--scale-set", "web:lots"], "NAME:COUNT"),
        (["--terminate-timeout", "PT1M", "--scale-set", "web:2"], "PT5M and PT15M"),
        (["--terminate-timeout", "5 minutes"], "ISO 8601"),
        (["--time-scale", "0"], "time-scale"),
        (["--rate-limit", "0"], "rate_limit"),
        (["--type-scale", "Preemt=6"], "the type must be one of"),
        (["--type-scale", "Preempt=0"], "greater than 0"),
        (["--type-scale", "Preempt"], "greater than 0"),
        (["--vm", "a", "--vm", "a"], "already exists"),
        (["--scenario-file", "/nonexistent/file.json"], "cannot read"),
    ],
)
def test_cli_refuses_bad_flags(args: list[str], message: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "simulator", "--port", "0", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 2
    assert message in proc.stderr
    assert "READY" not in proc.stdout


def test_cli_lists_scenarios() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "simulator", "--list-scenarios"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 0
    names = [line.split()[0] for line in proc.stdout.splitlines()]
    assert names == [
        "live-migration",
        "host-maintenance",
        "user-reboot",
        "user-redeploy",
        "platform-reboot",
        "preempt",
        "terminate",
        "cancelled",
        "hardware-failure",
        "platform-redeploy",
        "predicted-failure",
        "rolling-maintenance",
        "zone-wave",
    ]


# ---------------------------------------------------------------------------- in-process


def test_flags_build_the_vms_in_order() -> None:
    args = build_parser().parse_args(
        ["--scale-set", "web:2:PT10M", "--vm", "x", "--terminate-timeout", "PT15M"]
    )
    sim = build_simulator(args)
    assert sim.vm_names == ["web_0", "web_1", "x"] and sim.root_vm() == "web_0"
    assert sim.describe_vm("web_0")["terminate_timeout"] == 600
    default = build_simulator(build_parser().parse_args(["--scale-set", "api:1"]))
    assert default.describe_vm("api_0")["terminate_timeout"] == 300
    assert build_simulator(build_parser().parse_args([])).vm_names == ["myVM"]


def test_play_freezes_pauses_the_guest_and_writes_its_clock_file(tmp_path) -> None:
    """`--play-freezes DIR` (issue 33): a Started Freeze holds the VM's IMDS requests for
    its DurationInSeconds, one second in, and the pause is in DIR/VM.json for the shim."""
    import json

    sim = build_simulator(build_parser().parse_args(["--play-freezes", str(tmp_path / "c")]))
    event_id = sim.add_event("Freeze", resources=["myVM"], duration=3, notice=600)
    sim.start_event(event_id)
    (start, end) = sim.pauses("myVM")[0]
    assert end - start == 3.0 and sim.guest_hold("myVM", start + 1) == 2.0
    assert sim.guest_hold("myVM", end) == 0.0 and sim.guest_hold("myVM", start - 0.1) == 0.0
    assert json.loads((tmp_path / "c" / "myVM.json").read_text()) == {"pauses": [[start, end]]}
    plain = build_simulator(build_parser().parse_args([]))
    plain.start_event(plain.add_event("Freeze", resources=["myVM"], duration=3, notice=600))
    assert plain.pauses("myVM") == []  # only when asked


def test_scenario_targets_from_flags() -> None:
    args = build_parser().parse_args(
        [
            "--availability-set",
            "as1:a,b",
            "--scenario",
            "user-redeploy@as1",
            "--scenario",
            "live-migration",
        ]
    )
    sim = build_simulator(args)
    schedule_scenarios(sim, args)
    sim.tick()
    resources = [e["Resources"] for e in sim.document("a")["Events"]]
    assert resources == [["a", "b"], ["a"]]  # the default target is the first VM


def test_scenario_file_format(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    path.write_text(
        json.dumps(
            {
                "events": [
                    {"scenario": "cancelled", "target": "vm0", "at": 5},
                    {
                        "EventType": "Redeploy",
                        "target": "vm0",
                        "EventSource": "User",
                        "EventId": "11111111-2222-3333-4444-555555555555",
                    },
                ]
            }
        )
    )
    specs = load_scenario_file(path)
    assert specs[0] == EventSpec(scenario="cancelled", target="vm0", at=5)
    assert specs[1].event_kwargs() == {
        "event_type": "Redeploy",
        "source": "User",
        "event_id": "11111111-2222-3333-4444-555555555555",
    }
    sim = Simulator(clock=lambda: 1_800_000_000.0)
    sim.add_vm("vm0")
    for spec in specs:
        sim.schedule(spec)
    (event,) = sim.document("vm0")["Events"]
    assert event["EventId"] == "11111111-2222-3333-4444-555555555555"


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "not JSON"),
        ('{"scenario": "live-migration"}', "JSON list"),
        ('[{"scenario": "meteor"}]', "entry 0"),
        ('[{"EventType": "Freeze"}, {"EventTyp": "Freeze"}]', "entry 1"),
        ('[{"EventType": "Freeze", "at": -1}]', "at"),
    ],
)
def test_bad_scenario_files(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(ScenarioFileError, match=message):
        load_scenario_file(path)


def test_cli_logs_requests_when_asked(run: type[Running]) -> None:
    sim = run("--log-requests")
    ready = sim.ready()
    get(ready["url"])
    assert sim.stop() == 0
    assert sim.proc.stderr is not None
    assert "GET /metadata/scheduledevents?api-version=2020-07-01" in sim.proc.stderr.read()


def test_the_simulators_ca_lets_the_relays_hint_run_locally(
    run: type[Running], tmp_path: Path
) -> None:
    """`--write-ca-pem FILE` exports the CA that signs the simulator's attested documents,
    so the command the relay's `check` prints (`attestation check FILE --nonce N`) verifies
    a simulator document on this machine: with ATTESTATION_CA_PEM set from the file, as the
    local app has it, or with `--ca-pem FILE` (issue 33)."""
    ca = tmp_path / "sim-ca.pem"
    sim = run("--write-ca-pem", str(ca))
    ready = sim.ready()
    assert f"CA written to {ca}" in sim.seen
    assert ca.read_text().count("BEGIN CERTIFICATE") >= 2
    nonce = "1234567890"
    answer = requests.get(
        f"{ready['url']}/metadata/attested/document",
        headers=HEADERS,
        params={"api-version": "2020-09-01", "nonce": nonce},
        timeout=5,
    )
    assert answer.status_code == 200, answer.text
    document = tmp_path / "attested-document.json"
    document.write_text(answer.text)
    clean = {k: v for k, v in os.environ.items() if not k.startswith("ATTESTATION_")}
    command = [sys.executable, "-m", "functions", "attestation", "check", str(document)]
    for extra, env in (
        (["--nonce", nonce], {**clean, "ATTESTATION_CA_PEM": ca.read_text()}),
        (["--nonce", nonce, "--ca-pem", str(ca), "--offline"], clean),
    ):
        done = subprocess.run(
            [*command, *extra], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, (done.stdout, done.stderr)
        assert json.loads(done.stdout)["ok"] is True
    sim.stop()


def test_write_ca_pem_refuses_an_unwritable_file(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "simulator", "--write-ca-pem", str(tmp_path / "no" / "ca.pem")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and "--write-ca-pem" in proc.stderr
