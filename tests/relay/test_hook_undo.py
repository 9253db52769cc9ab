"""An undrain hook for an event gone from IMDS (`Undoes`): told how the event ended.

The app sends `"EventStatus": "Completed"` after a Freeze, Reboot or Redeploy that is
over, `"Cancelled"` after a cancellation; an older app sends none (Cancelled). The relay
accepts only that closed set and passes it on as SCHEDULED_EVENT_STATUS.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from local.hook_unit import HookUnit
from relay.callback import CallbackApp, CallbackServer
from relay.hooks import HookRunner
from relay.imds import ImdsClient
from tests.relay.conftest import KEY, VM0_ID, FixedKeys, sign_headers


@pytest.fixture
def relay(simulator: Any, tmp_path: Path) -> Iterator[tuple[CallbackServer, Path]]:
    simulator.sim.add_vm("vm0")
    env = tmp_path / "env"
    scripts = {}
    for name in ("drain", "undrain"):
        path = tmp_path / f"{name}.sh"
        path.write_text(
            f'#!/bin/sh\necho "{name} $SCHEDULED_EVENT_ID $SCHEDULED_EVENT_STATUS" >> {env}\n'
        )
        path.chmod(0o755)
        scripts[name] = path
    unit = HookUnit(tmp_path / "hooks.sock", scripts, 5).start()
    runner = HookRunner(scripts, tmp_path / "state", timeout=5, vm_name="vm0", socket=unit.path)
    app = CallbackApp(FixedKeys(), VM0_ID, "vm0", ImdsClient(simulator.vm_url("vm0")), hooks=runner)
    server = CallbackServer("127.0.0.1:0", app, poll_interval=0.05).start()
    try:
        yield server, env
    finally:
        server.stop()
        unit.stop()


def call(server: CallbackServer, **fields: Any) -> requests.Response:
    body = json.dumps({**fields, "Nonce": uuid.uuid4().hex}).encode()
    headers = sign_headers(KEY, "POST", "/v1/hook", body)
    return requests.post(server.url + "/v1/hook", data=body, headers=headers, timeout=10)


def drained_then_over(simulator: Any, server: CallbackServer, event_type: str) -> str:
    event_id = simulator.sim.add_event(event_type=event_type, resources=["vm0"], notice=3600)
    assert call(server, Hook="drain", EventId=event_id).json()["status"] == "succeeded"
    simulator.sim.remove_event(event_id)  # over: gone from IMDS
    return event_id


@pytest.mark.parametrize(
    ("sent", "expected"),
    [
        ({"EventStatus": "Completed"}, "Completed"),
        ({"EventStatus": "Cancelled"}, "Cancelled"),
        ({}, "Cancelled"),
    ],
)
def test_the_undrain_hook_is_told_how_the_event_ended(
    simulator: Any, relay: tuple[CallbackServer, Path], sent: dict[str, str], expected: str
) -> None:
    server, env = relay
    event_id = drained_then_over(simulator, server, "Reboot")
    answer = call(
        server, Hook="undrain", EventId=event_id, Undoes="drain", EventType="Reboot", **sent
    )
    assert answer.status_code == 200 and answer.json()["status"] == "succeeded", answer.text
    assert env.read_text().splitlines() == [
        f"drain {event_id} Scheduled",
        f"undrain {event_id} {expected}",
    ]


@pytest.mark.parametrize("status", ["Started", "completed", "", 1, None, ["Completed"]])
def test_any_other_event_status_is_refused_and_runs_nothing(
    simulator: Any, relay: tuple[CallbackServer, Path], status: Any
) -> None:
    server, env = relay
    event_id = drained_then_over(simulator, server, "Reboot")
    answer = call(
        server,
        Hook="undrain",
        EventId=event_id,
        Undoes="drain",
        EventType="Reboot",
        EventStatus=status,
    )
    assert answer.status_code == 400, answer.text
    assert "EventStatus" in answer.json()["error"]
    assert env.read_text().splitlines() == [f"drain {event_id} Scheduled"]  # no undrain ran
