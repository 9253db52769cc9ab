"""StartRequests at most once per attempt (issue 31), counted where IMDS receives them.

The simulator counts every POST of StartRequests a VM's IMDS gets, answered or faulted
(`request_count(vm, "startrequests")`), so these tests count what matters: how often the
relay asked IMDS to start the event, through a repeat with the same `AttemptId`, a retry
after IMDS failed, concurrent repeats and a relay restart (the real pyz, with the app's
own `post_start`).
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from relay.callback import CallbackApp, CallbackServer
from relay.imds import ImdsClient
from relay.startlog import FILE_NAME, StartLog
from tests.conftest import free_port
from tests.relay.conftest import KEY, VM0_ID, FixedKeys, relay_key, sign_headers, wait_for
from tests.relay.test_process import FAST

ATTEMPT = "sa1-" + "0123456789abcdef" * 2


@pytest.fixture
def relay(simulator: Any, tmp_path: Path) -> Iterator[CallbackServer]:
    simulator.sim.add_vm("vm0")
    server = start_server(simulator, tmp_path)
    try:
        yield server
    finally:
        server.stop()


def start_server(simulator: Any, state: Path) -> CallbackServer:
    app = CallbackApp(
        FixedKeys(),
        VM0_ID,
        "vm0",
        ImdsClient(simulator.vm_url("vm0"), timeout=2.0),
        starts=StartLog(state),
    )
    return CallbackServer("127.0.0.1:0", app, poll_interval=0.05).start()


def start(url: str, event_ids: list[str], attempt: Any = ATTEMPT, key: bytes = KEY) -> Any:
    payload: dict[str, Any] = {"EventIds": event_ids, "Nonce": uuid.uuid4().hex}
    if attempt is not None:
        payload["AttemptId"] = attempt
    body = json.dumps(payload).encode()
    headers = sign_headers(key, "POST", "/v1/start", body)
    return requests.post(url + "/v1/start", data=body, headers=headers, timeout=10)


def posts(simulator: Any) -> int:
    """StartRequests the VM's IMDS received, whatever it answered."""
    return simulator.sim.request_count("vm0", "startrequests")


def freeze(simulator: Any) -> str:
    return simulator.sim.add_event(event_type="Freeze", resources=["vm0"], notice=3600)


def test_a_repeat_with_the_same_attempt_id_does_not_ask_imds_again(
    simulator: Any, relay: CallbackServer
) -> None:
    event_id = freeze(simulator)
    first = start(relay.url, [event_id])
    assert first.status_code == 200, first.text
    assert first.json() == {"imds_status": 200, "results": {event_id: "approved"}}
    # The event has Started since: without the record this would be a 409 "not Scheduled",
    # an answer the app cannot count as an approval (the lost-response case of issue 31).
    assert simulator.sim.document("vm0")["Events"][0]["EventStatus"] == "Started"
    again = start(relay.url, [event_id.lower()])
    assert again.status_code == 200, again.text
    assert again.json() == {**first.json(), "repeated": True}
    assert posts(simulator) == 1
    assert len(simulator.sim.approvals) == 1


def test_after_an_imds_5xx_a_retry_goes_through(simulator: Any, relay: CallbackServer) -> None:
    event_id = freeze(simulator)
    simulator.sim.inject_fault(kind="status", status=500, count=2, endpoint="startrequests")
    failed = start(relay.url, [event_id])
    assert failed.status_code == 502 and failed.json()["imds_status"] == 500, failed.text
    same = start(relay.url, [event_id])  # a failure is not remembered: the same id retries
    assert same.status_code == 502
    assert posts(simulator) == 2
    other = start(relay.url, [event_id], attempt="sa1-another-attempt")
    assert other.status_code == 200, other.text
    assert "repeated" not in other.json()
    assert posts(simulator) == 3
    assert [a.event_id for a in simulator.sim.approvals] == [event_id]


def test_a_different_attempt_id_after_a_5xx_makes_two_posts(
    simulator: Any, relay: CallbackServer
) -> None:
    event_id = freeze(simulator)
    simulator.sim.inject_fault(kind="status", status=503, count=1, endpoint="startrequests")
    assert start(relay.url, [event_id], attempt="sa1-first").status_code == 502
    assert start(relay.url, [event_id], attempt="sa1-second").status_code == 200
    assert posts(simulator) == 2


def test_requests_without_attempt_id_are_served_as_before(
    simulator: Any, relay: CallbackServer
) -> None:
    event_id = freeze(simulator)
    assert start(relay.url, [event_id], attempt=None).status_code == 200
    late = start(relay.url, [event_id], attempt=None)
    assert late.status_code == 409 and late.json()["results"] == {
        event_id: "not Scheduled (Started)"
    }
    assert posts(simulator) == 1


def test_concurrent_repeats_post_once(simulator: Any, relay: CallbackServer) -> None:
    event_id = freeze(simulator)
    simulator.sim.inject_fault(kind="slow", seconds=0.5, count=1, endpoint="startrequests")
    answers: list[Any] = []
    threads = [
        threading.Thread(target=lambda: answers.append(start(relay.url, [event_id])))
        for _ in range(3)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert sorted(a.status_code for a in answers) == [200, 200, 200]
    assert sorted(bool(a.json().get("repeated")) for a in answers) == [False, True, True]
    assert posts(simulator) == 1


@pytest.mark.parametrize(
    ("attempt", "error"),
    [
        ("", '"AttemptId" must be 1..128 letters, digits or _.:-'),
        ("a" * 129, '"AttemptId" must be 1..128 letters, digits or _.:-'),
        ("has space", '"AttemptId" must be 1..128 letters, digits or _.:-'),
        (42, '"AttemptId" must be 1..128 letters, digits or _.:-'),
    ],
)
def test_a_malformed_attempt_id_is_a_400(
    simulator: Any, relay: CallbackServer, attempt: Any, error: str
) -> None:
    event_id = freeze(simulator)
    answer = start(relay.url, [event_id], attempt=attempt)
    assert (answer.status_code, answer.json()) == (400, {"error": error})
    assert posts(simulator) == 0


def test_an_attempt_id_reused_for_other_event_ids_is_refused(
    simulator: Any, relay: CallbackServer
) -> None:
    first, second = freeze(simulator), freeze(simulator)
    assert start(relay.url, [first]).status_code == 200
    reused = start(relay.url, [second])
    assert reused.status_code == 409
    assert reused.json()["error"] == "AttemptId already used for other EventIds"
    assert posts(simulator) == 1


def test_the_record_is_bounded_and_expires(tmp_path: Path) -> None:
    now = [1000.0]
    log = StartLog(tmp_path, limit=3, ttl=100, clock=lambda: now[0])
    for n in range(5):
        now[0] += 1
        assert log.get(f"a{n}") is None
        log.remember(f"a{n}", ["EV"], {"imds_status": 200, "results": {"EV": "approved"}})
    assert len(log) == 3
    saved = json.loads((tmp_path / FILE_NAME).read_text())
    assert sorted(saved) == ["a2", "a3", "a4"]
    assert oct((tmp_path / FILE_NAME).stat().st_mode & 0o777) == "0o600"
    reloaded = StartLog(tmp_path, limit=3, ttl=100, clock=lambda: now[0])
    assert reloaded.get("a4") == saved["a4"]
    now[0] += 100  # a day after IMDS accepted it (here 100 s): forgotten
    assert reloaded.get("a4") is None


def test_an_unreadable_record_is_logged_and_replaced(tmp_path: Path, caplog: Any) -> None:
    (tmp_path / FILE_NAME).write_text("{not json")
    log = StartLog(tmp_path)
    assert len(log) == 0
    assert "start attempts unreadable; starting afresh" in caplog.text


def test_a_relay_restart_between_two_repeats_keeps_one_post(
    simulator: Any, relay_process: Any, tmp_path: Path
) -> None:
    """The real pyz, asked by the app's own post_start: the attempt survives a restart."""
    from functions.approvers.relay import RelayTarget, post_start, start_attempt_id
    from functions.identity.keys import CallbackKey, key_id_of

    simulator.sim.add_vm("vm0")
    port = free_port()
    state = tmp_path / "state"
    args = [
        f"--imds-url={simulator.vm_url('vm0')}",
        f"--state-dir={state}",
        f"--forward=file:{tmp_path / 'forward'}",
        f"--callback-listen=127.0.0.1:{port}",
        *FAST,
    ]
    relay = relay_process(*args)
    wait_for(lambda: any(x.get("msg") == "callback listening" for x in relay.logs()), 30)
    secret = relay_key(state)
    target = RelayTarget(
        f"http://127.0.0.1:{port}", VM0_ID, (CallbackKey(key_id=key_id_of(secret), secret=secret),)
    )
    event_id = freeze(simulator)
    with requests.Session() as session:
        assert post_start(target, event_id, session, 10.0)[0] == "approved"
        relay.kill()  # kill -9: nothing is flushed on the way out
        relay = relay_process(*args)
        wait_for(lambda: any(x.get("msg") == "callback listening" for x in relay.logs()), 30)
        assert post_start(target, event_id, session, 10.0)[0] == "approved"
    assert posts(simulator) == 1
    saved = json.loads((state / FILE_NAME).read_text())
    assert list(saved) == [start_attempt_id(VM0_ID, event_id)]
    assert any(x.get("msg") == "start repeated; IMDS not asked again" for x in relay.logs())
