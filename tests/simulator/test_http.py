"""The simulator over real HTTP on 127.0.0.1: IMDS semantics, other endpoints, faults."""

from __future__ import annotations

import http.client
import json
import threading
import time
from collections.abc import Callable

import pytest
import requests

from functions.model.envelope import parse_document
from simulator import Simulator, SimulatorServer

HEADERS = {"Metadata": "true"}
V = {"api-version": "2020-07-01"}


def call(method: str, url: str, timeout: float = 5, **kwargs: object) -> requests.Response:
    return requests.request(method, url, timeout=timeout, **kwargs)  # type: ignore[arg-type]


def get(url: str, **kwargs: object) -> requests.Response:
    return call("GET", url, **kwargs)


def post(url: str, **kwargs: object) -> requests.Response:
    return call("POST", url, **kwargs)


def put(url: str, **kwargs: object) -> requests.Response:
    return call("PUT", url, **kwargs)


def se_url(base: str) -> str:
    return f"{base}/metadata/scheduledevents"


def get_doc(base: str, **params: str) -> dict:
    response = get(se_url(base), headers=HEADERS, params={**V, **params}, timeout=5)
    assert response.status_code == 200, response.text
    return response.json()


def approve(base: str, *ids: str) -> requests.Response:
    body = {"StartRequests": [{"EventId": i} for i in ids]}
    return post(se_url(base), headers=HEADERS, params=V, json=body, timeout=5)


def wait_for(condition: Callable[[], object], timeout: float = 5.0) -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = condition()
        if result:
            return result
        time.sleep(0.02)
    raise AssertionError("condition not met in time")


# ---------------------------------------------------------------------------- IMDS semantics


def test_root_serves_the_default_vm(simulator: SimulatorServer) -> None:
    doc = get_doc(simulator.url)
    assert doc == {"DocumentIncarnation": 1, "Events": []}
    assert get_doc(simulator.vm_url("myVM")) == doc
    assert simulator.sim.vm_names == ["myVM"]


def test_root_is_the_first_vm_added(simulator: SimulatorServer) -> None:
    simulator.sim.add_vm("vm0")
    simulator.sim.add_vm("vm1")
    simulator.sim.add_event("Freeze", ["vm0"])
    assert len(get_doc(simulator.url)["Events"]) == 1
    assert get_doc(simulator.vm_url("vm1"))["Events"] == []
    assert simulator.vm_url("VM1") == f"{simulator.url}/vm/vm1"


def test_metadata_header_is_required(simulator: SimulatorServer) -> None:
    for headers in ({}, {"Metadata": "false"}):
        response = get(se_url(simulator.url), headers=headers, params=V, timeout=5)
        assert response.status_code == 400
        assert "metadata header" in response.json()["error"].lower()
    response = post(se_url(simulator.url), params=V, json={"StartRequests": []}, timeout=5)
    assert response.status_code == 400
    assert get(se_url(simulator.url), headers={"Metadata": "True"}, params=V).ok


def test_forwarded_requests_are_refused(simulator: SimulatorServer) -> None:
    response = get(
        se_url(simulator.url),
        headers={**HEADERS, "X-Forwarded-For": "10.0.0.1"},
        params=V,
        timeout=5,
    )
    assert response.status_code == 400


@pytest.mark.parametrize("params", [{}, {"api-version": ""}, {"api-version": "2099-01-01"}])
def test_api_version_is_required_and_checked(simulator: SimulatorServer, params: dict) -> None:
    response = get(se_url(simulator.url), headers=HEADERS, params=params, timeout=5)
    assert response.status_code == 400
    body = response.json()
    assert "api-version" in body["error"]
    assert body["newest-versions"][0] == "2020-07-01"


def test_old_api_version_omits_fields_over_http(simulator: SimulatorServer) -> None:
    simulator.sim.add_event("Freeze", ["myVM"], duration=5)
    (event,) = get_doc(simulator.url, **{"api-version": "2019-04-01"})["Events"]
    assert "Description" in event
    assert "EventSource" not in event and "DurationInSeconds" not in event


def test_unknown_vm_and_path_are_404(simulator: SimulatorServer) -> None:
    response = get(se_url(f"{simulator.url}/vm/ghost"), headers=HEADERS, params=V)
    assert response.status_code == 404 and "ghost" in response.json()["error"]
    response = get(f"{simulator.url}/metadata/nothing", headers=HEADERS, params=V)
    assert response.status_code == 404


def test_put_is_not_allowed(simulator: SimulatorServer) -> None:
    response = put(se_url(simulator.url), headers=HEADERS, params=V, timeout=5)
    assert response.status_code == 405


def test_approval_over_http_starts_the_event_and_is_recorded(simulator: SimulatorServer) -> None:
    sim = simulator.sim
    sim.add_availability_set("as1", ["a", "b"])
    (eid,) = sim.play("live-migration", target="as1")
    before = get_doc(simulator.vm_url("b"))
    assert before["Events"][0]["EventStatus"] == "Scheduled"
    response = approve(simulator.vm_url("b"), eid)
    assert response.status_code == 200
    after = get_doc(simulator.vm_url("a"))
    assert after["Events"][0]["EventStatus"] == "Started"
    assert after["Events"][0]["NotBefore"] == ""
    assert after["DocumentIncarnation"] == before["DocumentIncarnation"] + 1
    assert approve(simulator.vm_url("a"), eid).status_code == 200  # already started: still 200
    assert [(a.vm, a.event_id) for a in sim.approvals] == [("b", eid), ("a", eid)]


@pytest.mark.parametrize(
    "body",
    [
        b"not json",
        b"",
        b"[]",
        b'{"StartRequests": {}}',
        b'{"StartRequests": []}',
        b'{"StartRequests": [{"Id": "x"}]}',
        b'{"StartRequests": [{"EventId": 42}]}',
        b'{"StartRequests": ["x"]}',
        b"\xff\xfe",
    ],
)
def test_malformed_start_requests_are_400(simulator: SimulatorServer, body: bytes) -> None:
    eid = simulator.sim.add_event("Freeze", ["myVM"])
    response = post(se_url(simulator.url), headers=HEADERS, params=V, data=body)
    assert response.status_code == 400
    assert response.json()["error"].startswith("Bad request")
    assert simulator.sim.approvals == []
    assert simulator.sim.event(eid).status == "Scheduled"


def test_unknown_event_id_is_400_and_nothing_is_approved(simulator: SimulatorServer) -> None:
    sim = simulator.sim
    sim.add_vm("a")
    sim.add_vm("b")
    mine = sim.add_event("Freeze", ["a"])
    theirs = sim.add_event("Freeze", ["b"])
    response = approve(simulator.vm_url("a"), mine, theirs)
    assert response.status_code == 400 and theirs in response.json()["error"]
    assert sim.approvals == []
    assert sim.event(mine).status == "Scheduled"


def test_several_start_requests_in_one_post(simulator: SimulatorServer) -> None:
    first = simulator.sim.add_event("Freeze", ["myVM"])
    second = simulator.sim.add_event("Reboot", ["myVM"])
    assert approve(simulator.url, first, second).status_code == 200
    assert {e["EventStatus"] for e in get_doc(simulator.url)["Events"]} == {"Started"}


def test_all_approval_mode_over_http() -> None:
    sim = Simulator(time_scale=60, approval_mode="all")
    sim.add_availability_set("as1", ["a", "b"])
    with SimulatorServer(sim) as server:
        (eid,) = sim.play("platform-reboot", target="as1")
        assert approve(server.vm_url("a"), eid).ok
        assert get_doc(server.vm_url("a"))["Events"][0]["EventStatus"] == "Scheduled"
        assert approve(server.vm_url("b"), eid).ok
        assert get_doc(server.vm_url("a"))["Events"][0]["EventStatus"] == "Started"


def test_notbefore_expiry_and_removal_in_real_time() -> None:
    """Time scale 3600: 15 min notice = 0.25 s, 5 min impact = 0.083 s; the ticker moves it."""
    sim = Simulator(time_scale=3600)
    seen: list[int] = []
    sim.subscribe(lambda vm, inc, doc: seen.append(inc))
    with SimulatorServer(sim, tick_interval=0.01) as server:
        (eid,) = sim.play("live-migration")
        doc = get_doc(server.url)
        assert doc["Events"][0]["EventStatus"] == "Scheduled"
        wait_for(lambda: seen[-1:] == [4], timeout=5)
        assert get_doc(server.url) == {"DocumentIncarnation": 4, "Events": []}
    assert seen == [2, 3, 4]
    assert [d["Events"][0]["EventStatus"] for d in sim.history("myVM")[1:3]] == [
        "Scheduled",
        "Started",
    ]
    assert sim.event(eid).end_reason == "completed"


def test_documents_parse_with_the_shared_models(simulator: SimulatorServer) -> None:
    simulator.sim.add_vm("spot", spot=True)
    simulator.sim.add_scale_set("web", 2)
    for name in ("live-migration", "user-redeploy", "hardware-failure", "cancelled"):
        simulator.sim.play(name, target="spot")
    simulator.sim.play("preempt")
    simulator.sim.play("terminate")
    for vm in ("spot", "web_0"):
        document = parse_document(
            get(se_url(simulator.vm_url(vm)), headers=HEADERS, params=V).content
        )
        assert document.events
        for event in document.events:
            assert event.is_started == (event.not_before is None)


# ---------------------------------------------------------------------------- other endpoints


def test_compute_metadata(simulator: SimulatorServer) -> None:
    simulator.sim.add_vm("solo")
    simulator.sim.add_scale_set("web", 2)
    compute = get(
        f"{simulator.vm_url('web_1')}/metadata/instance/compute",
        headers=HEADERS,
        params={"api-version": "2021-02-01"},
        timeout=5,
    ).json()
    assert compute["name"] == "web_1" and compute["vmScaleSetName"] == "web"
    assert compute["resourceId"].endswith("/virtualMachineScaleSets/web/virtualMachines/1")
    assert compute["location"] == "westeurope"
    solo = get(
        f"{simulator.url}/metadata/instance/compute",
        headers=HEADERS,
        params={"api-version": "2021-02-01"},
    ).json()
    assert solo["name"] == "solo" and solo["vmScaleSetName"] == ""
    assert solo["resourceId"].endswith("/providers/Microsoft.Compute/virtualMachines/solo")
    full = get(
        f"{simulator.url}/metadata/instance",
        headers=HEADERS,
        params={"api-version": "2021-02-01"},
    ).json()
    assert full["compute"] == solo


def test_compute_needs_header_and_version(simulator: SimulatorServer) -> None:
    url = f"{simulator.url}/metadata/instance/compute"
    assert get(url, params={"api-version": "2021-02-01"}).status_code == 400
    assert get(url, headers=HEADERS).status_code == 400
    assert get(url, headers=HEADERS, params={"api-version": "x"}).status_code == 400


def test_managed_identity_token(simulator: SimulatorServer) -> None:
    url = f"{simulator.url}/metadata/identity/oauth2/token"
    params = {"api-version": "2018-02-01", "resource": "https://servicebus.azure.net"}
    before = time.time()
    token = get(url, headers=HEADERS, params=params, timeout=5).json()
    assert token["token_type"] == "Bearer"
    assert token["resource"] == "https://servicebus.azure.net"
    assert token["access_token"].count(".") == 2
    assert int(token["expires_in"]) > 3600
    assert int(token["expires_on"]) >= int(before) + int(token["expires_in"])
    assert get(url, params=params).status_code == 400  # no header
    missing = get(url, headers=HEADERS, params={"api-version": "2018-02-01"})
    assert missing.status_code == 400 and missing.json()["error"] == "invalid_request"
    assert simulator.sim.request_count("myVM", "token") == 1


# ---------------------------------------------------------------------------- faults


def test_status_fault_with_count(simulator: SimulatorServer) -> None:
    simulator.sim.inject_fault("status", status=500, count=2)
    codes = [get(se_url(simulator.url), headers=HEADERS, params=V).status_code for _ in range(3)]
    assert codes == [500, 500, 200]


def test_throttling_fault_until_cleared(simulator: SimulatorServer) -> None:
    simulator.sim.inject_fault("status", status=429, count=None)
    for _ in range(3):
        response = get(se_url(simulator.url), headers=HEADERS, params=V)
        assert response.status_code == 429 and response.headers["Retry-After"] == "1"
    simulator.sim.clear_faults()
    assert get(se_url(simulator.url), headers=HEADERS, params=V).ok


def test_faults_can_target_one_vm(simulator: SimulatorServer) -> None:
    simulator.sim.add_vm("a")
    simulator.sim.add_vm("b")
    simulator.sim.inject_fault("status", vm="b", status=503, count=None)
    assert get(se_url(simulator.vm_url("a")), headers=HEADERS, params=V).ok
    response = get(se_url(simulator.vm_url("b")), headers=HEADERS, params=V)
    assert response.status_code == 503


def test_faults_default_to_scheduledevents_only(simulator: SimulatorServer) -> None:
    simulator.sim.inject_fault("status", count=None)
    token_url = f"{simulator.url}/metadata/identity/oauth2/token"
    params = {"api-version": "2018-02-01", "resource": "https://servicebus.azure.net"}
    assert get(token_url, headers=HEADERS, params=params).ok
    simulator.sim.inject_fault("status", count=1, endpoint="token")
    assert get(token_url, headers=HEADERS, params=params).status_code == 500


def test_invalid_requests_do_not_consume_faults(simulator: SimulatorServer) -> None:
    simulator.sim.inject_fault("status", count=1)
    assert get(se_url(simulator.url), params=V).status_code == 400  # no header
    assert get(se_url(simulator.url), headers=HEADERS, params=V).status_code == 500


def test_slow_fault(simulator: SimulatorServer) -> None:
    simulator.sim.inject_fault("slow", seconds=0.3)
    started = time.monotonic()
    with pytest.raises(requests.exceptions.ReadTimeout):
        get(se_url(simulator.url), headers=HEADERS, params=V, timeout=0.1)
    simulator.sim.inject_fault("slow", seconds=0.2)
    started = time.monotonic()
    assert get(se_url(simulator.url), headers=HEADERS, params=V, timeout=5).ok
    assert time.monotonic() - started >= 0.2
    started = time.monotonic()
    assert get(se_url(simulator.url), headers=HEADERS, params=V, timeout=5).ok


def test_drop_fault_closes_without_an_answer(simulator: SimulatorServer) -> None:
    with requests.Session() as session:
        assert session.get(se_url(simulator.url), headers=HEADERS, params=V).ok
        simulator.sim.inject_fault("drop")
        # the next request on the same kept-alive connection is dropped: no response at all
        with pytest.raises(requests.exceptions.ConnectionError):
            session.get(se_url(simulator.url), headers=HEADERS, params=V)
        assert session.get(se_url(simulator.url), headers=HEADERS, params=V).ok


def test_drop_fault_also_applies_to_a_post(simulator: SimulatorServer) -> None:
    eid = simulator.sim.add_event("Freeze", ["myVM"])
    simulator.sim.inject_fault("drop")
    with pytest.raises(requests.exceptions.ConnectionError):
        approve(simulator.url, eid)
    assert simulator.sim.approvals == []  # the POST was lost, not applied


def test_malformed_fault(simulator: SimulatorServer) -> None:
    simulator.sim.add_event("Freeze", ["myVM"])
    simulator.sim.inject_fault("malformed")
    response = get(se_url(simulator.url), headers=HEADERS, params=V)
    assert response.status_code == 200
    assert response.headers["Content-Type"].startswith("application/json")
    with pytest.raises(json.JSONDecodeError):
        json.loads(response.content)
    assert len(get_doc(simulator.url)["Events"]) == 1


def test_first_call_delay(simulator: SimulatorServer) -> None:
    simulator.sim.add_vm("a")
    simulator.sim.add_vm("b")
    simulator.sim.inject_fault("first-call-delay", vm="a", seconds=0.3)
    started = time.monotonic()
    with pytest.raises(requests.exceptions.ReadTimeout):
        get(se_url(simulator.vm_url("a")), headers=HEADERS, params=V, timeout=0.1)
    # a retry during enablement waits for the rest of it, then it is enabled for good
    assert get(se_url(simulator.vm_url("a")), headers=HEADERS, params=V).ok
    assert time.monotonic() - started >= 0.29
    quick = time.monotonic()
    assert get(se_url(simulator.vm_url("a")), headers=HEADERS, params=V).ok
    assert get(se_url(simulator.vm_url("b")), headers=HEADERS, params=V).ok
    assert time.monotonic() - quick < 0.25
    assert simulator.sim.faults == []


def test_first_call_delay_after_polling_began_acts_as_re_enablement(
    simulator: SimulatorServer,
) -> None:
    assert get_doc(simulator.url)
    simulator.sim.inject_fault("first-call-delay", seconds=0.2)
    started = time.monotonic()
    assert get_doc(simulator.url)
    assert time.monotonic() - started >= 0.19


def test_stop_ends_a_slow_answer_promptly() -> None:
    sim = Simulator()
    server = SimulatorServer(sim).start()
    sim.inject_fault("slow", seconds=30)
    errors: list[BaseException] = []

    def call() -> None:
        try:
            get(se_url(server.url), headers=HEADERS, params=V, timeout=10)
        except requests.RequestException as exc:
            errors.append(exc)

    thread = threading.Thread(target=call)
    thread.start()
    wait_for(lambda: sim.request_count("myVM") == 1)
    started = time.monotonic()
    server.stop()
    thread.join(timeout=10)
    assert time.monotonic() - started < 5
    assert errors  # the client saw the connection end, not a document


def test_refused_post_bodies_do_not_poison_a_kept_alive_connection(
    simulator: SimulatorServer,
) -> None:
    with requests.Session() as session:
        body = b'{"StartRequests": [{"EventId": "X"}]}'
        refused = session.post(se_url(simulator.url), params=V, data=body, timeout=5)
        assert refused.status_code == 400  # no Metadata header; body read and discarded
        assert session.get(se_url(simulator.url), headers=HEADERS, params=V, timeout=5).ok


def test_oversized_and_invalid_bodies(simulator: SimulatorServer) -> None:
    big = post(se_url(simulator.url), headers=HEADERS, params=V, data=b"x" * (65 * 1024))
    assert big.status_code == 413
    conn = http.client.HTTPConnection("127.0.0.1", simulator.port, timeout=5)
    try:
        conn.putrequest("POST", "/metadata/scheduledevents?api-version=2020-07-01")
        conn.putheader("Metadata", "true")
        conn.putheader("Content-Length", "abc")
        conn.endheaders()
        assert conn.getresponse().status == 400
    finally:
        conn.close()


def test_concurrent_polls_see_consistent_documents() -> None:
    """Same incarnation, same content; incarnations never go back, under threads and a ticker."""
    sim = Simulator(time_scale=7200)
    sim.add_availability_set("as1", ["a", "b", "c"])
    seen: dict[int, str] = {}
    problems: list[str] = []
    lock = threading.Lock()

    def poll(vm: str) -> None:
        last = 0
        with requests.Session() as session:
            for _ in range(60):
                doc = session.get(
                    se_url(server.vm_url(vm)), headers=HEADERS, params=V, timeout=5
                ).json()
                incarnation = doc["DocumentIncarnation"]
                if incarnation < last:
                    problems.append(f"{vm}: {incarnation} after {last}")
                last = incarnation
                content = json.dumps(doc["Events"], sort_keys=True)
                with lock:
                    if seen.setdefault(incarnation * 10 + "abc".index(vm), content) != content:
                        problems.append(f"{vm}: incarnation {incarnation} changed content")

    def approve_all() -> None:
        for _ in range(30):
            for event in sim.document("a")["Events"]:
                if event["EventStatus"] == "Scheduled":
                    approve(server.vm_url("b"), event["EventId"])
            time.sleep(0.005)

    with SimulatorServer(sim, tick_interval=0.005) as server:
        for name in ("live-migration", "user-reboot", "cancelled"):
            sim.play(name, target="as1")
        threads = [threading.Thread(target=poll, args=(vm,)) for vm in ("a", "b", "c")]
        threads.append(threading.Thread(target=approve_all))
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=30)
    assert problems == []
    assert len({k for k in seen if k % 10 == 0}) >= 2


def test_rate_limit_answers_429_like_imds() -> None:
    sim = Simulator(rate_limit=3)
    sim.add_vm("a")
    sim.add_vm("b")
    with SimulatorServer(sim) as server, requests.Session() as session:

        def code(vm: str) -> int:
            url = se_url(server.vm_url(vm))
            return session.get(url, headers=HEADERS, params=V, timeout=5).status_code

        assert [code("a") for _ in range(4)] == [200, 200, 200, 429]
        assert code("b") == 200  # per VM
        time.sleep(1.05)
        assert code("a") == 200
