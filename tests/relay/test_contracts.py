"""The relay's side of the contracts with the other stages, against the real relay process.

C1 heartbeats on their own session-less queue (or DIR/heartbeats/); C2 only this VM's
events; C3 subscription and resource group in the envelope; C4 the previous key accepted
during a rotation; issue 22 §1: every Service Bus message carries the VM's vmId, the relay's
own key and IMDS's attestation, is what the function app's model accepts, and has the
MessageId and SessionId the app expects. IMDS is the simulator; Service Bus is the
stand-in, which checks what Azure checks (and that heartbeats carry no SessionId).
"""

from __future__ import annotations

import http.client
import json
import time
import uuid
from pathlib import Path
from typing import Any

from functions.identity.keys import key_proof
from relay.signing import key_id
from simulator.instance import RESOURCE_GROUP, SUBSCRIPTION_ID
from tests.conftest import free_port
from tests.relay.conftest import VM0_ID, json_files, relay_key, sign_headers, wait_for
from tests.relay.servicebus_standin import ServiceBusStandIn

FAST = ["--poll-interval=0.05", "--imds-max-backoff=0.2", "--send-max-backoff=0.2"]


def to_standin(standin: ServiceBusStandIn, tmp_path: Path, connection: str) -> list[str]:
    conn = tmp_path / "sas.txt"
    conn.write_text(connection)
    return [
        f"--forward={standin.forward}",
        f"--sas-connection-string-file={conn}",
        f"--servicebus-endpoint={standin.endpoint}",
    ]


def read(directory: Path) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in json_files(directory)]


# ---------------------------------------------------------------------- C1


def test_heartbeats_go_to_their_own_queue_without_a_session(
    simulator: Any, standin: ServiceBusStandIn, relay_process: Any, tmp_path: Path
) -> None:
    simulator.sim.add_vm("vm0")
    relay = relay_process(
        f"--imds-url={simulator.vm_url('vm0')}",
        f"--state-dir={tmp_path / 'state'}",
        "--heartbeat-interval=1",
        *FAST,
        *to_standin(standin, tmp_path, standin.connection_string),
    )
    wait_for(lambda: len(standin.heartbeats) >= 2)
    wait_for(lambda: len(standin.messages) >= 1)
    assert all("SessionId" not in m.properties for m in standin.heartbeats)
    assert {m.envelope["kind"] for m in standin.heartbeats} == {"heartbeat"}
    assert {m.envelope["kind"] for m in standin.messages} == {"document"}
    assert all(m.properties["SessionId"] == VM0_ID for m in standin.messages)
    assert not standin.rejections
    assert relay.stop() == 0


def test_a_failing_heartbeat_queue_never_holds_documents_up(
    simulator: Any, standin: ServiceBusStandIn, relay_process: Any, tmp_path: Path
) -> None:
    sim = simulator.sim
    sim.add_vm("vm0")
    standin.heartbeat_queue = "not-deployed"  # the heartbeats queue is missing: 404
    relay = relay_process(
        f"--imds-url={simulator.vm_url('vm0')}",
        f"--state-dir={tmp_path / 'state'}",
        "--heartbeat-interval=1",
        "--send-slow-retry=60",  # a 404 is retried slowly...
        *FAST,
        *to_standin(standin, tmp_path, standin.connection_string),
    )
    wait_for(lambda: standin.rejections)  # a heartbeat refused
    for _ in range(3):
        sim.add_event(event_type="Freeze", resources=["vm0"], notice=3600)
        # ...but documents behind it go at once, not after the slow retry.
        wait_for(lambda: len(standin.messages) == len(sim.history("vm0")), timeout=5)
    assert [m.envelope["document"] for m in standin.messages] == sim.history("vm0")
    assert any("404" in x.get("msg", "") for x in relay.logs())


def test_an_empty_heartbeat_queue_keeps_heartbeats_with_the_documents(
    simulator: Any, standin: ServiceBusStandIn, relay_process: Any, tmp_path: Path
) -> None:
    simulator.sim.add_vm("vm0")
    relay_process(
        f"--imds-url={simulator.vm_url('vm0')}",
        f"--state-dir={tmp_path / 'state'}",
        "--heartbeat-interval=1",
        "--heartbeat-queue=",
        *FAST,
        *to_standin(standin, tmp_path, standin.queue_connection_string),
    )
    wait_for(lambda: any(e["kind"] == "heartbeat" for e in standin.envelopes()))
    assert standin.heartbeats == []
    assert all(m.properties["SessionId"] == VM0_ID for m in standin.messages)


def test_a_queue_scoped_sas_rule_cannot_reach_the_heartbeat_queue(
    standin: ServiceBusStandIn, relay_process: Any, tmp_path: Path
) -> None:
    relay = relay_process(
        f"--state-dir={tmp_path / 'state'}",
        "--vm-name=vm0",
        *to_standin(standin, tmp_path, standin.queue_connection_string),
    )
    assert relay.proc.wait(30) == 2
    [line] = relay.log_path.read_text().splitlines()
    assert line.startswith("relay: bad settings: the SAS connection string is for queue")
    assert "--heartbeat-queue ''" in line


def test_file_forwarding_puts_heartbeats_in_their_own_directory(
    simulator: Any, relay_process: Any, tmp_path: Path
) -> None:
    simulator.sim.add_vm("vm0")
    forward = tmp_path / "forward"
    relay_process(
        f"--imds-url={simulator.vm_url('vm0')}",
        f"--state-dir={tmp_path / 'state'}",
        f"--forward=file:{forward}",
        "--heartbeat-interval=1",
        *FAST,
    )
    wait_for(lambda: len(read(forward / "heartbeats")) >= 2)
    assert {e["kind"] for e in read(forward)} == {"document"}
    assert {e["kind"] for e in read(forward / "heartbeats")} == {"heartbeat"}


def test_every_message_is_attested_and_is_what_the_apps_model_accepts(
    simulator: Any, standin: ServiceBusStandIn, relay_process: Any, tmp_path: Path
) -> None:
    import jsonschema

    from functions.model.envelope import parse_envelope
    from relay.attest import binding_nonces
    from tests.relay.wire_schema import SCHEMA_PATH

    simulator.sim.add_vm("vm0")
    state = tmp_path / "state"
    relay_process(
        f"--imds-url={simulator.vm_url('vm0')}",
        f"--state-dir={state}",
        "--heartbeat-interval=1",
        *FAST,
        *to_standin(standin, tmp_path, standin.connection_string),
    )
    wait_for(lambda: len(standin.heartbeats) >= 1 and len(standin.messages) >= 1)
    simulator.sim.add_event(event_type="Freeze", resources=["vm0"], notice=3600)
    wait_for(lambda: len(standin.messages) >= 2)
    key = relay_key(state)
    validator = jsonschema.Draft202012Validator(json.loads(SCHEMA_PATH.read_text("utf-8")))
    for message in [*standin.messages, *standin.heartbeats]:
        data = message.envelope
        assert not [e.message for e in validator.iter_errors(data)], data
        envelope = parse_envelope(message.body.decode())
        assert envelope.vm.vm_id == VM0_ID
        assert envelope.callback_key is not None
        assert (envelope.callback_key.id, envelope.callback_key.secret) == (key_id(key), key.hex())
        assert envelope.attestation is not None
        assert envelope.attestation.nonce in binding_nonces(data)
        # The app computes the same MessageId (a rotated key re-sends, not deduplicated).
        assert message.message_id == envelope.message_id()
        if envelope.kind == "document":
            assert message.message_id.startswith(f"{VM0_ID}:")
            assert message.message_id.endswith(f":{key_id(key)}")
            assert len(message.message_id) <= 128
            assert message.properties["SessionId"] == envelope.vm.vm_id


# ---------------------------------------------------------------------- C2, C3


def test_only_this_vms_events_are_forwarded_by_default(
    simulator: Any, relay_process: Any, tmp_path: Path
) -> None:
    sim = simulator.sim
    sim.add_vm("vm0", availability_set="as1")
    sim.add_vm("vm1", availability_set="as1")
    own, everything = tmp_path / "own", tmp_path / "all"
    for forward, extra in ((own, []), (everything, ["--forward-all-events"])):
        relay_process(
            f"--imds-url={simulator.vm_url('vm0')}",
            f"--state-dir={forward}-state",
            f"--forward=file:{forward}",
            *FAST,
            *extra,
        )
    wait_for(lambda: read(own) and read(everything))
    theirs = sim.add_event(event_type="Reboot", resources=["vm1"], notice=3600)
    wait_for(lambda: len(read(everything)) == 2)
    polls = sim.request_count("vm0")
    wait_for(lambda: sim.request_count("vm0") >= polls + 10)  # both relays polled it
    assert len(read(own)) == 1  # another VM's event: nothing sent
    mine = sim.add_event(event_type="Freeze", resources=["VM0"], notice=3600)  # any case
    wait_for(lambda: len(read(own)) == 2)
    wait_for(lambda: len(read(everything)) == 3)
    latest_own, latest_all = read(own)[-1], read(everything)[-1]
    assert [e["EventId"] for e in latest_own["document"]["Events"]] == [mine]
    assert {e["EventId"] for e in latest_all["document"]["Events"]} == {mine, theirs}
    assert (
        latest_own["document"]["DocumentIncarnation"] == sim.document("vm0")["DocumentIncarnation"]
    )
    assert (latest_own["events"], latest_all["events"]) == ("own", "all")
    vm = latest_own["vm"]
    assert (vm["subscription_id"], vm["resource_group"]) == (SUBSCRIPTION_ID, RESOURCE_GROUP)
    assert vm["resource_id"].startswith(f"/subscriptions/{SUBSCRIPTION_ID}/resourceGroups/")


# ---------------------------------------------------------------------- C4


def test_a_rotated_key_resends_the_document_and_the_previous_key_still_works(
    simulator: Any, relay_process: Any, tmp_path: Path
) -> None:
    """Contract §4: a key older than --callback-key-max-age-days is replaced at once; the
    old one stays valid as the previous key; the current document goes out again with the
    new key (a new MessageId, so it is not dropped as a duplicate)."""
    sim = simulator.sim
    sim.add_vm("vm0")
    state, forward = tmp_path / "state", tmp_path / "forward"
    state.mkdir()
    old_key = bytes(range(32))
    stored = {
        "id": key_id(old_key),
        "secret": old_key.hex(),
        "created": int(time.time()) - 86400 + 8,  # due 8 s after the start
    }
    (state / "callback-key.json").write_text(json.dumps({"current": stored, "previous": None}))
    port = free_port()
    relay = relay_process(
        f"--imds-url={simulator.vm_url('vm0')}",
        f"--state-dir={state}",
        f"--forward=file:{forward}",
        f"--callback-listen=127.0.0.1:{port}",
        "--callback-key-max-age-days=1",
        *FAST,
    )
    wait_for(lambda: any(x.get("msg") == "callback listening" for x in relay.logs()))
    wait_for(lambda: len(read(forward)) >= 2, timeout=30)  # the key is due 8 s after start
    new_key = relay_key(state)
    assert new_key != old_key
    sent = read(forward)
    assert [e["callback_key"]["id"] for e in sent] == [key_id(old_key), key_id(new_key)]
    # The new key comes with the old one's proof that it is its successor (issue 46).
    assert "proof" not in sent[0]["callback_key"]
    assert sent[1]["callback_key"]["prev"] == key_id(old_key)
    assert sent[1]["callback_key"]["proof"] == key_proof(old_key, key_id(new_key))
    assert sent[0]["document"] == sent[1]["document"] == sim.document("vm0")  # sent again
    first = sim.add_event(event_type="Freeze", resources=["vm0"], notice=3600)
    second = sim.add_event(event_type="Freeze", resources=["vm0"], notice=3600)
    assert start(port, old_key, first)[0] == 200  # the previous key, still accepted
    assert start(port, new_key, second)[0] == 200  # the current key
    status, answer = start(port, bytes(32), second)
    assert (status, answer["error"]) == (401, "unknown key id")
    assert sorted(a.event_id for a in sim.approvals) == sorted([first, second])
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    conn.request("GET", "/v1/health")
    health = json.loads(conn.getresponse().read())
    conn.close()
    assert health["signatures"] == {
        "scheme": "v2",
        "key_id": key_id(new_key),
        "previous_key_active": True,
        "accepted": {"current": 1, "previous": 1},
    }
    text = relay.log_path.read_text()
    assert old_key.hex() not in text and new_key.hex() not in text
    assert any(x.get("msg") == "callback key rotated" for x in relay.logs())


def start(port: int, key: bytes, event_id: str) -> tuple[int, dict[str, Any]]:
    body = json.dumps({"EventIds": [event_id], "Nonce": uuid.uuid4().hex}).encode()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request(
            "POST", "/v1/start", body=body, headers=sign_headers(key, "POST", "/v1/start", body)
        )
        response = conn.getresponse()
        return response.status, json.loads(response.read())
    finally:
        conn.close()
