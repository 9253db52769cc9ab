"""Drain hooks over the signed callback: configured scripts only, once per EventId, timed.

Every script runs in the hook unit (relay/hooks.py), here local/hook_unit.py's stand-in for
systemd's socket activation, never in the relay's own process tree."""

from __future__ import annotations

import json
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from local.hook_unit import HookUnit
from relay.callback import CallbackApp, CallbackServer
from relay.hooks import HookRunner, _held
from relay.imds import ImdsClient
from relay.models import ScheduledEvent
from tests.relay.conftest import KEY, VM0_ID, FixedKeys, sign_headers, wait_for


def script(path: Path, body: str) -> Path:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return path


@pytest.fixture
def hooks_dir(tmp_path: Path) -> Path:
    runs = tmp_path / "runs"
    runs.mkdir()
    script(
        tmp_path / "drain.sh",
        f'echo "$SCHEDULED_EVENT_ID" >> {runs}/drain\n'
        f"env | grep '^SCHEDULED_EVENT_' | sort > {runs}/env\n"
        'echo "drained $SCHEDULED_EVENT_VM_NAME"\n',
    )
    script(tmp_path / "broken.sh", "echo 'cannot reach the load balancer' >&2\nexit 3\n")
    script(tmp_path / "hang.sh", f"echo $$ > {runs}/hang.pid\nexec sleep 30\n")
    script(tmp_path / "slowish.sh", "sleep 0.5\necho done\n")
    script(tmp_path / "chatty.sh", "seq 1 100000\n")
    return tmp_path


NAMES = ("drain", "broken", "hang", "slowish", "chatty")


@pytest.fixture
def hook_unit(hooks_dir: Path) -> Iterator[Callable[..., str]]:
    """Start a hook unit (the stand-in) for the hooks_dir scripts; its socket's path."""
    units: list[HookUnit] = []

    def start(timeout: float = 5.0, scripts: dict[str, str] | None = None) -> str:
        """`scripts`: hook name -> script file name (default: each of NAMES, its NAME.sh)."""
        scripts = scripts or {n: f"{n}.sh" for n in NAMES}
        path = hooks_dir / f"hooks-{len(units)}.sock"
        hooks = {name: hooks_dir / file for name, file in scripts.items()}
        units.append(HookUnit(path, hooks, timeout).start())
        return str(path)

    yield start
    for unit in units:
        unit.stop()


@pytest.fixture
def start_relay(
    simulator: Any, hooks_dir: Path, hook_unit: Callable[..., str]
) -> Iterator[Callable[..., Any]]:
    sim = simulator.sim
    sim.add_vm("vm0", availability_set="as1")
    sim.add_vm("vm1", availability_set="as1")
    servers: list[CallbackServer] = []

    def start(timeout: float = 5.0, wait: float = 3.0) -> CallbackServer:
        runner = HookRunner(
            {n: hooks_dir / f"{n}.sh" for n in NAMES},
            hooks_dir / "state",
            timeout=timeout,
            vm_name="vm0",
            socket=hook_unit(timeout),
        )
        app = CallbackApp(
            FixedKeys(),
            VM0_ID,
            "vm0",
            ImdsClient(simulator.vm_url("vm0")),
            hooks=runner,
            hook_wait=wait,
        )
        server = CallbackServer("127.0.0.1:0", app, poll_interval=0.05).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


def call(server: Any, hook: str, event_id: str) -> requests.Response:
    # Repeats within one second would be byte-identical replays; a nonce keeps them distinct.
    body = json.dumps({"Hook": hook, "EventId": event_id, "Nonce": uuid.uuid4().hex}).encode()
    headers = sign_headers(KEY, "POST", "/v1/hook", body)
    return requests.post(server.url + "/v1/hook", data=body, headers=headers, timeout=10)


def terminate(sim: Any, vm: str = "vm0") -> str:
    return sim.add_event(event_type="Terminate", resources=[vm], notice=3600)


def test_a_hook_runs_once_with_the_event_in_its_environment(
    simulator: Any, start_relay: Any, hooks_dir: Path
) -> None:
    relay = start_relay()
    event_id = terminate(simulator.sim)
    first = call(relay, "drain", event_id)
    assert first.status_code == 200, first.text
    assert first.json() == {
        "Hook": "drain",
        "EventId": event_id,
        "status": "succeeded",
        "exit_code": 0,
        "output_tail": "drained vm0\n",
    }
    again = call(relay, "drain", event_id)
    assert again.status_code == 200 and again.json() == first.json()
    assert (hooks_dir / "runs" / "drain").read_text().split() == [event_id]
    env = dict(line.split("=", 1) for line in (hooks_dir / "runs" / "env").read_text().splitlines())
    assert env["SCHEDULED_EVENT_ID"] == event_id
    assert env["SCHEDULED_EVENT_TYPE"] == "Terminate"
    assert env["SCHEDULED_EVENT_VM_NAME"] == "vm0"
    assert env["SCHEDULED_EVENT_NOT_BEFORE"].endswith("GMT")
    assert simulator.sim.approvals == []  # a hook never approves


def test_a_restarted_relay_does_not_rerun(
    simulator: Any, start_relay: Any, hooks_dir: Path
) -> None:
    event_id = terminate(simulator.sim)
    first = call(start_relay(), "drain", event_id).json()
    assert call(start_relay(), "drain", event_id).json() == first
    assert (hooks_dir / "runs" / "drain").read_text().split() == [event_id]


def test_a_run_interrupted_by_a_crash_is_failed_not_rerun(
    simulator: Any, hooks_dir: Path, hook_unit: Callable[..., str]
) -> None:
    """A run the relay recorded as started but never handed to the hook unit (killed in
    between, or the VM rebooted): its end is unknown, and it is not run again."""
    simulator.sim.add_vm("vm0")
    event_id = terminate(simulator.sim)
    state = hooks_dir / "state"
    unit = hook_unit()
    runner = HookRunner({"drain": hooks_dir / "drain.sh"}, state, 5, "vm0", socket=unit)
    runner._store({"Hook": "drain", "EventId": event_id, "status": "running"})
    after_crash = HookRunner({"drain": hooks_dir / "drain.sh"}, state, 5, "vm0", socket=unit)
    record = after_crash.result("drain", event_id)
    assert record is not None and record["status"] == "failed"
    assert "end is unknown" in record["output_tail"] and "not rerun" in record["output_tail"]
    assert call_count(hooks_dir) == 0


def call_count(hooks_dir: Path) -> int:
    runs = hooks_dir / "runs" / "drain"
    return len(runs.read_text().split()) if runs.exists() else 0


def _locked(rc: Path) -> bool:
    held = _held(rc)
    if held is None:
        return False
    held.close()
    return True


def _interrupted(
    hooks_dir: Path, script_name: str, unit: str
) -> tuple[HookRunner, str, threading.Event]:
    """A run started by a relay that then died (it never records the end), the EventId,
    and an event set once the dead relay's own hold on the run is gone (as a killed
    process's descriptors are closed): the script itself, in the hook unit, goes on."""
    state = hooks_dir / "state"
    dying = HookRunner({"drain": hooks_dir / script_name}, state, 5, "vm0", socket=unit)
    gone = threading.Event()
    dying._finish = lambda *args: gone.set()  # type: ignore[method-assign] # dead before it records
    event_id = uuid.uuid4().hex
    scheduled = ScheduledEvent(event_id, "Scheduled", "Terminate", ("vm0",))
    assert dying.run_once("drain", scheduled, wait=0.0)["status"] == "running"
    rc = dying._path("drain", event_id).with_suffix(".rc")
    # Handed to the unit: the relay creates the `.rc` file and then locks it; a check
    # between the two (a busy machine once made one) reads no run going on at all.
    wait_for(lambda: rc.exists() and (_locked(rc) or gone.is_set()))
    restarted = HookRunner({"drain": hooks_dir / script_name}, state, 5, "vm0", socket=unit)
    return restarted, event_id, gone


def test_a_run_that_ended_while_the_relay_was_down_is_recorded_as_it_ended(
    hooks_dir: Path, hook_unit: Callable[..., str]
) -> None:
    """Issue 40: a relay killed in its drain script reported the drain failed when it came
    back, though the script ran to its end (the chaos suite's run)."""
    restarted, event_id, gone = _interrupted(
        hooks_dir, "drain.sh", hook_unit(scripts={"drain": "drain.sh"})
    )
    assert gone.wait(10)  # the unit wrote how it ended, and closed the connection
    record = restarted.result("drain", event_id)
    assert record is not None
    assert (record["status"], record["exit_code"]) == ("succeeded", 0)
    assert record["output_tail"] == "drained vm0\n"
    assert (hooks_dir / "runs" / "drain").read_text().split() == [event_id]  # not rerun
    assert not list((hooks_dir / "state" / "hooks").glob("*.rc"))  # nothing left behind


def test_a_run_still_going_when_the_relay_comes_back_is_waited_for(
    hooks_dir: Path, hook_unit: Callable[..., str]
) -> None:
    restarted, event_id, _ = _interrupted(
        hooks_dir, "slowish.sh", hook_unit(scripts={"drain": "slowish.sh"})
    )
    first = restarted.result("drain", event_id)
    assert first is not None and first["status"] == "running"  # taken over, not failed
    final = wait_for(
        lambda: (r := restarted.result("drain", event_id)) and r["status"] != "running" and r
    )
    assert (final["status"], final["exit_code"], final["output_tail"]) == ("succeeded", 0, "done\n")


def test_a_failing_run_that_ended_while_the_relay_was_down_is_failed(
    hooks_dir: Path, hook_unit: Callable[..., str]
) -> None:
    restarted, event_id, gone = _interrupted(
        hooks_dir, "broken.sh", hook_unit(scripts={"drain": "broken.sh"})
    )
    assert gone.wait(10)
    record = wait_for(
        lambda: (r := restarted.result("drain", event_id)) and r["status"] != "running" and r
    )
    assert (record["status"], record["exit_code"]) == ("failed", 3)
    assert "cannot reach the load balancer" in record["output_tail"]


def test_each_event_gets_its_own_run(simulator: Any, start_relay: Any, hooks_dir: Path) -> None:
    relay = start_relay()
    first, second = terminate(simulator.sim), terminate(simulator.sim)
    assert call(relay, "drain", first).json()["status"] == "succeeded"
    assert call(relay, "drain", second).json()["status"] == "succeeded"
    assert (hooks_dir / "runs" / "drain").read_text().split() == [first, second]


def test_only_configured_names_run(simulator: Any, start_relay: Any, hooks_dir: Path) -> None:
    relay = start_relay()
    event_id = terminate(simulator.sim)
    for name in ("undrain", "/bin/sh", str(hooks_dir / "drain.sh"), "drain; reboot", ""):
        response = call(relay, name, event_id)
        assert response.status_code == 404, name
        assert response.json() == {"error": "unknown hook"}
    assert not (hooks_dir / "runs" / "drain").exists()


def test_an_event_of_another_vm_or_unknown_is_refused(
    simulator: Any, start_relay: Any, hooks_dir: Path
) -> None:
    relay = start_relay()
    theirs = terminate(simulator.sim, vm="vm1")
    assert call(relay, "drain", theirs).status_code == 403
    assert call(relay, "drain", "no-such-event").status_code == 404
    assert not (hooks_dir / "runs" / "drain").exists()


def test_any_status_is_accepted(simulator: Any, start_relay: Any) -> None:
    relay = start_relay()
    event_id = terminate(simulator.sim)
    simulator.sim.start_event(event_id)
    assert call(relay, "drain", event_id).json()["status"] == "succeeded"


def test_a_failing_hook_reports_its_exit_code_and_output(simulator: Any, start_relay: Any) -> None:
    answer = call(start_relay(), "broken", terminate(simulator.sim)).json()
    assert answer["status"] == "failed"
    assert answer["exit_code"] == 3
    assert answer["output_tail"] == "cannot reach the load balancer\n"


def test_a_hung_hook_times_out_and_is_killed(
    simulator: Any, start_relay: Any, hooks_dir: Path
) -> None:
    relay = start_relay(timeout=0.5, wait=0.1)
    event_id = terminate(simulator.sim)
    first = call(relay, "hang", event_id)
    assert first.status_code == 202
    assert first.json()["status"] == "running"
    final = wait_for(
        lambda: (r := call(relay, "hang", event_id)).status_code == 200 and r.json(), timeout=10
    )
    assert final["status"] == "timeout"
    pid = int((hooks_dir / "runs" / "hang.pid").read_text())
    # Killed: gone, or a zombie its `sh` (killed with it) left for init to reap.
    assert _gone_or_zombie(pid)


def _gone_or_zombie(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state == "Z"


def test_a_repeat_while_running_answers_202_and_does_not_start_another(
    simulator: Any, start_relay: Any
) -> None:
    relay = start_relay(wait=0.05)
    event_id = terminate(simulator.sim)
    assert call(relay, "slowish", event_id).status_code == 202
    assert call(relay, "slowish", event_id).json()["status"] == "running"
    time.sleep(0.6)
    final = wait_for(lambda: (r := call(relay, "slowish", event_id)).status_code == 200 and r)
    assert final.json()["output_tail"] == "done\n"


def test_hook_calls_are_signed_like_start(simulator: Any, start_relay: Any) -> None:
    relay = start_relay()
    event_id = terminate(simulator.sim)
    body = json.dumps({"Hook": "drain", "EventId": event_id}).encode()
    forged = sign_headers(b"wrong-key-0123456789", "POST", "/v1/hook", body)
    response = requests.post(relay.url + "/v1/hook", data=body, headers=forged, timeout=5)
    assert response.status_code == 401
    signed_for_start = sign_headers(KEY, "POST", "/v1/start", body)
    response = requests.post(relay.url + "/v1/hook", data=body, headers=signed_for_start, timeout=5)
    assert response.status_code == 401


def test_an_identical_repeat_is_a_replay(simulator: Any, start_relay: Any) -> None:
    relay = start_relay()
    body = json.dumps({"Hook": "drain", "EventId": terminate(simulator.sim)}).encode()
    headers = sign_headers(KEY, "POST", "/v1/hook", body)
    url = relay.url + "/v1/hook"
    assert requests.post(url, data=body, headers=headers, timeout=5).status_code == 200
    assert requests.post(url, data=body, headers=headers, timeout=5).status_code == 409


def test_only_the_tail_of_the_output_is_kept(simulator: Any, start_relay: Any) -> None:
    answer = call(start_relay(), "chatty", terminate(simulator.sim)).json()
    assert answer["status"] == "succeeded"
    assert len(answer["output_tail"]) <= 2048
    assert answer["output_tail"].endswith("99999\n100000\n")


def test_a_hook_unit_that_does_not_answer_fails_the_run_with_the_reason(
    tmp_path: Path, hooks_dir: Path
) -> None:
    """Issue 38: the relay runs no script itself; a hook unit that is not there (not
    installed, its socket stopped) is a failed run saying so, never a crash, and the
    script does not run anyway."""
    runner = HookRunner(
        {"drain": hooks_dir / "drain.sh"}, tmp_path / "state", 5, "vm0", str(tmp_path / "no.sock")
    )
    event = ScheduledEvent("EV-1", "Scheduled", "Terminate", ("vm0",), {"NotBefore": ""})
    record = runner.run_once("drain", event, wait=5)
    assert (record["status"], record["exit_code"]) == ("failed", None)
    assert record["output_tail"].startswith(f"cannot run the hook through {tmp_path}/no.sock")
    assert call_count(hooks_dir) == 0


def test_the_unit_runs_only_what_its_own_configuration_names(
    tmp_path: Path, hooks_dir: Path, hook_unit: Callable[..., str]
) -> None:
    """The relay only names a hook: a name the unit's own RELAY_HOOKS lacks is refused
    there, whatever the relay's configuration says."""
    unit = hook_unit(scripts={"broken": "broken.sh"})
    runner = HookRunner({"drain": hooks_dir / "drain.sh"}, tmp_path / "state", 5, "vm0", unit)
    event = ScheduledEvent("EV-2", "Scheduled", "Terminate", ("vm0",), {"NotBefore": ""})
    record = runner.run_once("drain", event, wait=5)
    assert (record["status"], record["exit_code"]) == ("failed", None)
    assert record["output_tail"] == "not a hook this VM's relay configuration names"
    assert call_count(hooks_dir) == 0


def _ask(unit: str, request: bytes, files: list[Path]) -> None:
    """Talk to the unit as a relay would (or a relay that was taken over)."""
    opened = [open(path, "wb") for path in files]  # noqa: SIM115 - closed below
    try:
        with socket.socket(socket.AF_UNIX) as conn:
            conn.settimeout(10)
            conn.connect(unit)
            socket.send_fds(conn, [request], [f.fileno() for f in opened])
            assert conn.recv(1) == b""  # closed once the run is over
    finally:
        for handle in opened:
            handle.close()


def test_the_unit_passes_the_script_nothing_but_the_scheduled_event_values(
    tmp_path: Path, hook_unit: Callable[..., str]
) -> None:
    """A relay that was taken over cannot hand the script its own environment
    (LD_PRELOAD, PATH): the unit keeps SCHEDULED_EVENT_* alone and sets PATH itself."""
    probe = script(tmp_path / "probe.sh", "env | sort\n")
    unit = HookUnit(tmp_path / "probe.sock", {"probe": probe}, 5).start()
    try:
        env = {"SCHEDULED_EVENT_ID": "EV-3", "LD_PRELOAD": "/tmp/evil.so", "PATH": "/tmp/evil"}
        request = json.dumps({"hook": "probe", "env": env}).encode() + b"\n"
        out, ended = tmp_path / "probe.out", tmp_path / "probe.rc"
        _ask(unit.path, request, [out, ended])
    finally:
        unit.stop()
    assert ended.read_text() == "0"
    seen = dict(line.split("=", 1) for line in out.read_text().splitlines() if "=" in line)
    assert seen["SCHEDULED_EVENT_ID"] == "EV-3"
    assert "LD_PRELOAD" not in seen and "/tmp/evil" not in seen["PATH"]


def test_the_unit_runs_nothing_for_a_request_without_the_relay_s_files(
    tmp_path: Path, hooks_dir: Path, hook_unit: Callable[..., str]
) -> None:
    unit = hook_unit()
    request = json.dumps({"hook": "drain", "env": {}}).encode() + b"\n"
    with socket.socket(socket.AF_UNIX) as conn:
        conn.settimeout(10)
        conn.connect(unit)
        conn.sendall(request)
        assert conn.recv(1) == b""
    assert call_count(hooks_dir) == 0


def test_the_relay_reads_its_hook_socket_setting(tmp_path: Path, monkeypatch: Any) -> None:
    from relay.settings import SettingsError, load_settings

    monkeypatch.setenv("RELAY_FORWARD", f"file:{tmp_path}")
    assert load_settings([]).hook_socket == "/run/scheduled-events-relay-hooks.sock"
    monkeypatch.setenv("RELAY_HOOK_SOCKET", "/run/other.sock")
    assert load_settings([]).hook_socket == "/run/other.sock"
    monkeypatch.setenv("RELAY_HOOK_SOCKET", "")
    with pytest.raises(SettingsError, match="--hook-socket"):
        load_settings([])
