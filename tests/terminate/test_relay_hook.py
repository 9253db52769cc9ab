"""Drain through the relay's own hook scripts: real callback servers reading simulated IMDS."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import pytest

from functions.identity.keys import CallbackKey, key_id_of
from functions.terminate.workflow import run_drain
from tests.notify.receiver import Answer, running
from tests.terminate.conftest import Harness, Relays, settings, terminate_note

OTHER_KEY = CallbackKey(key_id=key_id_of(b"k" * 32), secret=b"k" * 32)


def with_keys(fleet: Relays, *keys: CallbackKey):
    """The app's view of each relay, with other keys (a key this relay never gave)."""
    return lambda vm: replace(fleet.targets[vm], keys=keys) if vm in fleet.targets else None


pytestmark = pytest.mark.azurite


class Crash(BaseException):
    """The worker dies (not an error the workflow could handle)."""


def test_relay_hook_runs_once_per_vm_even_when_redelivered(
    harness: Harness, relays: Callable[..., Relays]
) -> None:
    fleet = relays(count=2)
    harness.callbacks.update(fleet.targets)
    event_id = fleet.sim.add_event("Terminate", resources=["web_0", "web_1"], notice=300)
    note = terminate_note(event_id, resources=("web_0", "web_1"))
    first = run_drain(note, settings(relay_hook="drain"), harness.context())
    again = run_drain(note, settings(relay_hook="drain"), harness.context())  # redelivery
    assert first.outcome == again.outcome == "approved"
    assert sorted(fleet.runs()) == [f"web_0 {event_id}", f"web_1 {event_id}"]
    assert "drained web_0" in first.steps["hook:web_0"].detail
    assert len(harness.approvals.calls) == 1


def test_a_slow_hook_is_polled_until_it_finishes(
    harness: Harness, relays: Callable[..., Relays]
) -> None:
    fleet = relays(count=1, hook_seconds=0.6, hook_wait=0.1)  # the relay answers 202 first
    harness.callbacks.update(fleet.targets)
    event_id = fleet.sim.add_event("Terminate", resources=["web_0"], notice=300)
    result = run_drain(terminate_note(event_id), settings(relay_hook="drain"), harness.context())
    assert result.outcome == "approved"
    assert fleet.runs() == [f"web_0 {event_id}"]


def test_only_hooks_in_the_relays_config_run(
    harness: Harness, relays: Callable[..., Relays]
) -> None:
    fleet = relays(count=1)
    harness.callbacks.update(fleet.targets)
    event_id = fleet.sim.add_event("Terminate", resources=["web_0"], notice=300)
    result = run_drain(terminate_note(event_id), settings(relay_hook="rm-rf"), harness.context())
    assert result.outcome == "held"
    assert "unknown hook" in result.steps["hook:web_0"].detail
    assert fleet.runs() == []
    assert harness.transitions() == ["drain_started", "drain_failed"]


def test_a_wrong_key_is_refused_by_the_relay(
    harness: Harness, relays: Callable[..., Relays]
) -> None:
    fleet = relays(count=1)
    event_id = fleet.sim.add_event("Terminate", resources=["web_0"], notice=300)
    result = run_drain(
        terminate_note(event_id),
        settings(relay_hook="drain", on_failure="approve"),
        harness.context(relay_target=with_keys(fleet, OTHER_KEY)),
    )
    assert "refused (401)" in result.steps["hook:web_0"].detail
    assert fleet.runs() == []
    assert result.outcome == "approved" and not result.drained


def test_a_vm_without_a_known_relay_fails_its_step(harness: Harness) -> None:
    result = run_drain(terminate_note(), settings(relay_hook="drain"), harness.context())
    assert result.steps["hook:web_0"].detail == (
        "no relay known for web_0 (no attested key or no address from Azure)"
    )
    assert result.outcome == "held"


def test_a_restart_mid_workflow_resumes_without_rerunning_finished_steps(
    harness: Harness, relays: Callable[..., Relays]
) -> None:
    fleet = relays(count=2)
    event_id = fleet.sim.add_event("Terminate", resources=["web_0", "web_1"], notice=300)
    note = terminate_note(event_id, resources=("web_0", "web_1"))
    lookups: list[str] = []

    def dies_on_web_1(vm: str) -> str | None:
        lookups.append(vm)
        if vm == "web_1" and lookups.count("web_1") == 1:
            raise Crash("worker killed")
        return fleet.targets[vm]

    harness.resolve = dies_on_web_1
    with running(Answer(200)) as hook:
        config = settings(relay_hook="drain", http_url=hook.url)
        with pytest.raises(Crash):
            run_drain(note, config, harness.context())
        done = harness.store.steps(event_id)
        assert {name: step.status for name, step in done.items()} == {
            "announce:drain_started": "succeeded",
            "http": "succeeded",
            "hook:web_0": "succeeded",
        }
        result = run_drain(note, config, harness.context())  # Service Bus redelivers
        assert len(hook.requests) == 1
    assert result.outcome == "approved" and result.drained
    assert sorted(fleet.runs()) == [f"web_0 {event_id}", f"web_1 {event_id}"]
    assert harness.transitions() == ["drain_started"]
    assert len(harness.approvals.calls) == 1


def test_instances_drain_at_the_same_time(harness: Harness, relays: Callable[..., Relays]) -> None:
    fleet = relays(count=3, hook_seconds=0.5)
    harness.callbacks.update(fleet.targets)
    names = ("web_0", "web_1", "web_2")
    event_id = fleet.sim.add_event("Terminate", resources=list(names), notice=300)
    result = run_drain(
        terminate_note(event_id, resources=names), settings(relay_hook="drain"), harness.context()
    )
    assert result.outcome == "approved"
    hooks = [result.steps[f"hook:{vm}"] for vm in names]
    first_done = min(step.finished_at for step in hooks if step.finished_at)
    assert all(step.started_at < first_done for step in hooks)  # they overlapped
    assert sorted(fleet.runs()) == sorted(f"{vm} {event_id}" for vm in names)


def test_a_relay_hook_that_outlasts_its_step_fails_the_drain(
    harness: Harness, relays: Callable[..., Relays]
) -> None:
    fleet = relays(count=1, hook_seconds=4, hook_wait=0.1)
    harness.callbacks.update(fleet.targets)
    event_id = fleet.sim.add_event("Terminate", resources=["web_0"], notice=300)
    result = run_drain(
        terminate_note(event_id),
        settings(relay_hook="drain", step_timeout_seconds=1.5),
        harness.context(),
    )
    assert result.outcome == "held"
    assert "ran out of time: hook still running" in result.steps["hook:web_0"].detail
    assert harness.transitions() == ["drain_started", "drain_failed"]


def test_mid_rotation_the_previous_key_runs_the_hook(
    harness: Harness, relays: Callable[..., Relays]
) -> None:
    """The app knows a newer key than this relay holds (say, a key from a message the relay
    sent just before its state was restored): the previous key it knows still works."""
    fleet = relays(count=1)
    (genuine,) = fleet.targets["web_0"].keys
    event_id = fleet.sim.add_event("Terminate", resources=["web_0"], notice=300)
    result = run_drain(
        terminate_note(event_id),
        settings(relay_hook="drain"),
        harness.context(relay_target=with_keys(fleet, OTHER_KEY, genuine)),
    )
    assert result.outcome == "approved" and result.drained
    assert fleet.runs() == [f"web_0 {event_id}"]


def test_a_last_poll_that_times_out_keeps_what_the_relay_last_said() -> None:
    """The relay answered 202 (running), then a poll sent with little of the step left gets
    no answer in time: the step reports "hook still running", not "did not answer" (the
    flake this replaced: the timed-out poll's detail overwrote the relay's last word)."""
    import http.server
    import threading
    import time
    from datetime import UTC, datetime, timedelta

    import requests

    from functions.approvers.relay import RelayTarget
    from functions.identity.keys import CallbackKey, key_id_of
    from functions.terminate.steps import relay_hook

    polls: list[float] = []

    class Relay(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            polls.append(time.monotonic())
            if len(polls) > 1:
                time.sleep(1.5)  # the step's time runs out while this poll waits
            self.send_response(202)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(b'{"status": "running"}')

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Relay)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        secret = bytes(range(32))
        target = RelayTarget(
            url=f"http://127.0.0.1:{server.server_address[1]}",
            vm_id="00000000-0000-0000-0000-000000000001",
            keys=(CallbackKey(key_id_of(secret), secret),),
        )
        start = datetime.now(UTC)
        ok, detail, _ = relay_hook(
            requests.Session(),
            target,
            "drain",
            "EV-1",
            until=start + timedelta(seconds=1.2),
            now=lambda: datetime.now(UTC),
            sleep=time.sleep,
            poll_seconds=0.1,
        )
    finally:
        server.shutdown()
    assert not ok
    assert len(polls) >= 2
    assert "ran out of time: hook still running" in detail, detail
