"""The signed callback over real HTTP against the simulator: approve only what is safe."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
import requests

from functions.signing import sign_headers as v1_sign_headers
from relay.callback import CallbackApp, CallbackServer
from relay.imds import ImdsClient
from relay.signing import key_id
from tests.relay.conftest import KEY, VM0_ID, FixedKeys, sign_headers, vm_id_of


@pytest.fixture
def relay(simulator: Any) -> Iterator[Any]:
    sim = simulator.sim
    sim.add_vm("vm0", availability_set="as1")
    sim.add_vm("vm1", availability_set="as1")
    app = CallbackApp(
        FixedKeys(),
        VM0_ID,
        "vm0",
        ImdsClient(simulator.vm_url("vm0"), timeout=1.0),
        health=lambda: {"healthy": True, "imds": {"healthy": True}},
    )
    server = CallbackServer("127.0.0.1:0", app, poll_interval=0.05).start()
    try:
        yield server
    finally:
        server.stop()


def post(
    server: Any,
    body: bytes | dict[str, Any],
    path: str = "/v1/start",
    key: bytes = KEY,
    now: float | None = None,
    signed_path: str | None = None,
    headers: dict[str, str] | None = None,
) -> requests.Response:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    if headers is None:
        headers = sign_headers(key, "POST", signed_path or path, data, now=now)
    return requests.post(server.url + path, data=data, headers=headers, timeout=10)


def freeze(sim: Any, vm: str = "vm0") -> str:
    return sim.add_event(event_type="Freeze", resources=[vm], duration=5, notice=3600)


def test_a_valid_request_approves_in_imds(simulator: Any, relay: Any) -> None:
    sim = simulator.sim
    event_id = freeze(sim)
    response = post(relay, {"EventIds": [event_id.lower()]})
    assert response.status_code == 200, response.text
    assert response.json() == {
        "imds_status": 200,
        "results": {event_id: "approved"},
    }
    [approval] = sim.approvals
    assert (approval.vm, approval.event_id) == ("vm0", event_id)
    assert sim.document("vm0")["Events"][0]["EventStatus"] == "Started"


def test_several_event_ids_in_one_request(simulator: Any, relay: Any) -> None:
    sim = simulator.sim
    first, second = freeze(sim), freeze(sim)
    response = post(relay, {"EventIds": [first, second]})
    assert response.status_code == 200
    assert sorted(a.event_id for a in sim.approvals) == sorted([first, second])


def refused(sim: Any, response: requests.Response, status: int, reason: str) -> None:
    assert response.status_code == status, response.text
    assert reason in response.json()["error"]
    assert sim.approvals == []


def test_forged_signature(simulator: Any, relay: Any) -> None:
    body = json.dumps({"EventIds": [freeze(simulator.sim)]}).encode()
    headers = sign_headers(b"not-the-key-0123456789", "POST", "/v1/start", body)
    headers["X-Relay-Key-Id"] = key_id(KEY)  # the right key id, the wrong secret
    response = post(relay, body, headers=headers)
    refused(simulator.sim, response, 401, "bad signature")


def test_a_signature_for_another_vm_is_403(simulator: Any, relay: Any) -> None:
    """vm1's callback credentials, or a request meant for vm1, cannot act on vm0."""
    body = json.dumps({"EventIds": [freeze(simulator.sim)]}).encode()
    headers = sign_headers(KEY, "POST", "/v1/start", body, target=vm_id_of("vm1"))
    refused(simulator.sim, post(relay, body, headers=headers), 403, "signed for another VM")


def test_an_unknown_key_id_is_401(simulator: Any, relay: Any) -> None:
    body = json.dumps({"EventIds": [freeze(simulator.sim)]}).encode()
    headers = sign_headers(bytes(32), "POST", "/v1/start", body)
    refused(simulator.sim, post(relay, body, headers=headers), 401, "unknown key id")


def test_a_v1_signature_is_401(simulator: Any, relay: Any) -> None:
    body = json.dumps({"EventIds": [freeze(simulator.sim)]}).encode()
    headers = v1_sign_headers(KEY, "POST", "/v1/start", body)
    refused(simulator.sim, post(relay, body, headers=headers), 401, "only v2")


def test_current_and_previous_keys_are_accepted(simulator: Any) -> None:
    sim = simulator.sim
    sim.add_vm("vm0")
    old, new = bytes(range(32)), KEY
    app = CallbackApp(FixedKeys(new, old), VM0_ID, "vm0", ImdsClient(simulator.vm_url("vm0")))
    server = CallbackServer("127.0.0.1:0", app, poll_interval=0.05).start()
    try:
        for secret in (new, old):
            assert post(server, {"EventIds": [freeze(sim)]}, key=secret).status_code == 200
        assert app.key_matches == {"current": 1, "previous": 1}
        health = requests.get(server.url + "/v1/health", timeout=5).json()["signatures"]
        assert health["key_id"] == key_id(new) and health["previous_key_active"] is True
        assert KEY.hex() not in json.dumps(health)
    finally:
        server.stop()


def test_missing_signature(simulator: Any, relay: Any) -> None:
    response = post(relay, {"EventIds": [freeze(simulator.sim)]}, headers={})
    refused(simulator.sim, response, 401, "missing signature")


def test_body_changed_after_signing(simulator: Any, relay: Any) -> None:
    sim = simulator.sim
    signed_for, sent = freeze(sim), freeze(sim)
    headers = sign_headers(
        KEY, "POST", "/v1/start", json.dumps({"EventIds": [signed_for]}).encode()
    )
    response = post(relay, {"EventIds": [sent]}, headers=headers)
    refused(sim, response, 401, "bad signature")


def test_signature_for_another_path(simulator: Any, relay: Any) -> None:
    response = post(relay, {"EventIds": [freeze(simulator.sim)]}, signed_path="/v1/hook")
    refused(simulator.sim, response, 401, "bad signature")


@pytest.mark.parametrize("skew", [-302, 302])
def test_stale_or_future_timestamp(simulator: Any, relay: Any, skew: int) -> None:
    # Two seconds past the 300 s window: the timestamp is truncated to a whole second and
    # the request takes time, so a 301 s skew can arrive as 300 s (accepted, a flaky test).
    response = post(relay, {"EventIds": [freeze(simulator.sim)]}, now=time.time() + skew)
    refused(simulator.sim, response, 401, "stale timestamp")


def test_replayed_request(simulator: Any, relay: Any) -> None:
    sim = simulator.sim
    event_id = freeze(sim)
    body = json.dumps({"EventIds": [event_id]}).encode()
    headers = sign_headers(KEY, "POST", "/v1/start", body)
    sim.inject_fault("status", vm="vm0", status=503)  # first attempt: IMDS down, nothing done
    assert post(relay, body, headers=headers).status_code == 503
    response = post(relay, body, headers=headers)  # the captured request, sent again
    refused(sim, response, 409, "replayed")


def test_unknown_event_id(simulator: Any, relay: Any) -> None:
    freeze(simulator.sim)
    response = post(relay, {"EventIds": ["00000000-0000-0000-0000-000000000000"]})
    refused(simulator.sim, response, 404, "unknown EventId")


def test_already_started(simulator: Any, relay: Any) -> None:
    sim = simulator.sim
    event_id = freeze(sim)
    sim.start_event(event_id)
    response = post(relay, {"EventIds": [event_id]})
    refused(sim, response, 409, "not Scheduled (Started)")


def test_another_vms_event_seen_through_the_availability_set(simulator: Any, relay: Any) -> None:
    sim = simulator.sim
    event_id = freeze(sim, vm="vm1")
    assert sim.document("vm0")["Events"][0]["EventId"] == event_id  # visible, not ours
    response = post(relay, {"EventIds": [event_id]})
    refused(sim, response, 403, "does not name this VM")


def test_one_bad_id_refuses_the_whole_request(simulator: Any, relay: Any) -> None:
    sim = simulator.sim
    good = freeze(sim)
    response = post(relay, {"EventIds": [good, "no-such-event"]})
    refused(sim, response, 404, "unknown EventId")
    assert response.json()["results"] == {good: "ok", "no-such-event": "unknown EventId"}
    assert sim.document("vm0")["Events"][0]["EventStatus"] == "Scheduled"


def test_oversized_body(simulator: Any, relay: Any) -> None:
    event_id = freeze(simulator.sim)
    body = json.dumps({"EventIds": [event_id], "padding": "x" * 17000}).encode()
    response = post(relay, body)
    refused(simulator.sim, response, 413, "16384")


@pytest.mark.parametrize(
    "body",
    [
        b"not json",
        b"[1, 2]",
        b'{"EventIds": "one"}',
        b'{"EventIds": []}',
        b'{"EventIds": [7]}',
        b'{"eventids": ["x"]}',
        b'{"EventIds": ["a", "A"]}',
        b'{"EventIds": ["\\ud800"]}',
    ],
)
def test_malformed_bodies(simulator: Any, relay: Any, body: bytes) -> None:
    freeze(simulator.sim)
    response = post(relay, body)
    assert response.status_code in (400, 404), response.text
    assert simulator.sim.approvals == []


def test_imds_unavailable_for_the_fresh_read(simulator: Any, relay: Any) -> None:
    sim = simulator.sim
    event_id = freeze(sim)
    sim.inject_fault("drop", vm="vm0")
    response = post(relay, {"EventIds": [event_id]})
    refused(sim, response, 503, "cannot read IMDS")


def test_unknown_paths_and_methods(simulator: Any, relay: Any) -> None:
    assert post(relay, {"EventIds": ["x"]}, path="/v1/approve").status_code == 404
    assert requests.put(relay.url + "/v1/start", timeout=5).status_code == 405
    assert requests.get(relay.url + "/v1/start", timeout=5).status_code == 404
    assert simulator.sim.approvals == []


def test_health_has_no_event_details(simulator: Any, relay: Any) -> None:
    freeze(simulator.sim)
    response = requests.get(relay.url + "/v1/health", timeout=5)
    assert response.status_code == 200
    assert response.json()["healthy"] is True
    assert "Events" not in response.text and "EventId" not in response.text


def test_the_replay_cache_forgets_only_what_can_no_longer_verify() -> None:
    from relay.callback import Refused, ReplayCache

    cache = ReplayCache(window=300, limit=4)
    assert cache.first_use("a", now=1000)
    assert not cache.first_use("a", now=1000 + 599)  # a timestamp may lie 300 s ahead
    assert cache.first_use("b", now=1000)
    assert cache.first_use("c", now=1001)
    assert cache.first_use("d", now=2000)  # a, b, c have expired and are purged
    assert len(cache) <= 2
    assert cache.first_use("e", now=2000)
    assert cache.first_use("f", now=2000)
    assert cache.first_use("g", now=2000)
    with pytest.raises(Refused) as info:  # full of live signatures: refuse, never forget
        cache.first_use("h", now=2000)
    assert info.value.status == 503


# ------------------------------------------------ Expect: the app's view of a shared event


def test_an_event_that_differs_from_the_apps_view_is_refused_and_imds_untouched(
    simulator: Any, relay: Any
) -> None:
    """A VM forging its view of a shared event (a `User` reboot reported for a `Platform`
    one) cannot get it approved on another VM: that VM's own IMDS view is compared first."""
    sim = simulator.sim
    event_id = sim.add_event(event_type="Reboot", resources=["vm0"], source="Platform")
    expect = {event_id: {"EventType": "Reboot", "EventSource": "User"}}
    response = post(relay, {"EventIds": [event_id], "Expect": expect})
    assert response.status_code == 409, response.text
    assert response.json() == {
        "error": f"event {event_id} differs from this VM's view: "
        "EventSource 'User' expected, IMDS says 'Platform'",
        "results": {event_id: "differs"},
    }
    assert sim.approvals == []
    assert sim.document("vm0")["Events"][0]["EventStatus"] == "Scheduled"


def test_one_differing_event_refuses_the_whole_request(simulator: Any, relay: Any) -> None:
    sim = simulator.sim
    same, other = freeze(sim), freeze(sim)
    expect = {
        same.lower(): {"EventType": "freeze", "EventSource": "platform"},
        other: {"EventType": "Redeploy"},
    }
    response = post(relay, {"EventIds": [same, other], "Expect": expect})
    assert response.status_code == 409, response.text
    assert response.json()["results"] == {same: "ok", other: "differs"}
    assert response.json()["error"] == (
        f"event {other} differs from this VM's view: EventType 'Redeploy' expected, "
        "IMDS says 'Freeze'"
    )
    assert sim.approvals == []
    assert [e["EventStatus"] for e in sim.document("vm0")["Events"]] == ["Scheduled"] * 2


def test_an_event_as_the_app_expects_it_is_approved(simulator: Any, relay: Any) -> None:
    """Case-insensitive on both fields and on the EventId; each key optional; an Expect
    entry for an EventId the request does not name changes nothing."""
    sim = simulator.sim
    first, second = freeze(sim), freeze(sim)
    expect = {
        first.lower(): {"EventType": "FREEZE", "EventSource": "platform"},
        second: {"EventSource": "Platform"},
        "00000000-0000-0000-0000-000000000000": {"EventType": "Terminate"},
    }
    response = post(relay, {"EventIds": [first, second], "Expect": expect})
    assert response.status_code == 200, response.text
    assert response.json() == {
        "imds_status": 200,
        "results": {first: "approved", second: "approved"},
    }
    assert sorted(a.event_id for a in sim.approvals) == sorted([first, second])


@pytest.mark.parametrize("expect", [None, {}])
def test_a_request_without_expectations_still_approves(
    simulator: Any, relay: Any, expect: Any
) -> None:
    sim = simulator.sim
    event_id = freeze(sim)
    body: dict[str, Any] = {"EventIds": [event_id]}
    if expect is not None:
        body["Expect"] = expect
    response = post(relay, body)
    assert response.status_code == 200, response.text
    assert response.json()["results"] == {event_id: "approved"}
    assert [a.event_id for a in sim.approvals] == [event_id]


@pytest.mark.parametrize(
    "expect",
    [
        [],
        "Freeze",
        {"X": "Freeze"},
        {"X": {"EventType": 1}},
        {"X": {"EventSource": None}},
        {"X": {"EventType": "F" * 65}},
        {"": {"EventType": "Freeze"}},
        {"a": {}, "A": {}},
    ],
)
def test_a_malformed_expect_is_a_400(simulator: Any, relay: Any, expect: Any) -> None:
    response = post(relay, {"EventIds": [freeze(simulator.sim)], "Expect": expect})
    refused(simulator.sim, response, 400, "Expect")


def test_a_missing_event_source_in_imds_counts_as_empty() -> None:
    from relay.callback import _differences
    from relay.models import ScheduledEvent

    raw = {"EventId": "E1", "EventStatus": "Scheduled", "EventType": "Freeze"}  # no EventSource
    scheduled = ScheduledEvent("E1", "Scheduled", "Freeze", ("vm0",), raw)
    assert _differences({"EventSource": ""}, scheduled) == []
    assert _differences({"EventType": "freeze"}, scheduled) == []
    assert _differences({"EventSource": "Platform"}, scheduled) == [
        "EventSource 'Platform' expected, IMDS says ''"
    ]
