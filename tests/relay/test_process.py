"""The real `python -m relay` in a subprocess: crash safety, wiring, callback, shutdown."""

from __future__ import annotations

import json
import random
import uuid
from pathlib import Path
from typing import Any

import requests

from relay.attest import binding_nonces
from relay.signing import key_id
from tests.conftest import free_port
from tests.relay.conftest import json_files, relay_key, sign_headers, vm_id_of, wait_for
from tests.relay.servicebus_standin import ServiceBusStandIn

FAST = [
    "--poll-interval=0.05",
    "--imds-max-backoff=0.2",
    "--send-max-backoff=0.2",
    "--send-slow-retry=0.5",
    "--imds-timeout=2",
]


def servicebus_args(standin: ServiceBusStandIn, tmp_path: Path) -> list[str]:
    conn = tmp_path / "sas.txt"
    conn.write_text(standin.connection_string)
    return [
        f"--forward={standin.forward}",
        f"--sas-connection-string-file={conn}",
        f"--servicebus-endpoint={standin.endpoint}",
    ]


def one_vm_to_servicebus(
    simulator: Any, standin: ServiceBusStandIn, tmp_path: Path
) -> tuple[Any, Path, list[str]]:
    """VM `vm0` on the simulator and the relay arguments that forward it to the stand-in."""
    sim = simulator.sim
    sim.add_vm("vm0")
    state = tmp_path / "state"
    args = [f"--imds-url={simulator.vm_url('vm0')}", f"--state-dir={state}", *FAST]
    return sim, state, args + servicebus_args(standin, tmp_path)


def delivered_documents(standin: ServiceBusStandIn) -> list[dict[str, Any]]:
    return [e["document"] for e in standin.envelopes() if e["kind"] == "document"]


def outbox_message_ids(state: Path) -> set[str]:
    from relay.models import parse_envelope

    # The KID ending a document's MessageId is added at send time (with the key itself).
    envelopes = [parse_envelope(p.read_text()) for p in json_files(state / "outbox")]
    return {e.message_id().rpartition(":")[0] for e in envelopes}


def test_sigkill_mid_send_loses_nothing_and_keeps_order(
    simulator: Any, standin: ServiceBusStandIn, relay_process: Any, tmp_path: Path
) -> None:
    sim, state, args = one_vm_to_servicebus(simulator, standin, tmp_path)
    relay = relay_process(*args)
    wait_for(lambda: len(standin.messages) == 1)

    standin.hold_after_store()  # the next message is stored, its 201 never arrives
    sim.add_event(event_type="Freeze", resources=["vm0"], notice=3600)
    wait_for(standin.held.is_set)
    for _ in range(3):  # more changes pile up in the outbox behind the stuck send
        sim.add_event(event_type="Reboot", resources=["vm0"], notice=3600)
        behind = len(sim.history("vm0")) - 1  # all but the first, which was confirmed
        wait_for(lambda n=behind: len(list(json_files(state / "outbox"))) >= n)
    pending = outbox_message_ids(state)
    relay.kill()
    standin.release()
    assert len(pending) == 4  # the one in flight and three behind it

    relay_process(*args)
    wait_for(lambda: len(delivered_documents(standin)) == len(sim.history("vm0")))
    wait_for(lambda: not list(json_files(state / "outbox")))
    assert delivered_documents(standin) == sim.history("vm0")
    assert pending <= {m.message_id.rpartition(":")[0] for m in standin.messages}
    assert standin.duplicates >= 1  # the resend of the unconfirmed message, dropped
    sequences = [e["sequence"] for e in standin.envelopes()]
    assert sequences == sorted(sequences)


def test_repeated_sigkill_at_random_moments(
    simulator: Any, standin: ServiceBusStandIn, relay_process: Any, tmp_path: Path
) -> None:
    sim, state, args = one_vm_to_servicebus(simulator, standin, tmp_path)
    rng = random.Random(7)
    durable: set[str] = set()
    for _ in range(3):
        relay = relay_process(*args)
        wait_for(lambda r=relay: any(x.get("msg") == "forwarded" for x in r.logs()))
        for _ in range(3):
            sim.add_event(event_type="Freeze", resources=["vm0"], notice=3600)
            polled = sim.request_count("vm0")
            wait_for(lambda n=polled: sim.request_count("vm0") >= n + 2)
        wait_for(lambda: rng.random() < 0.2, interval=0.01)
        relay.kill()
        durable |= outbox_message_ids(state)
    relay_process(*args)
    final = sim.history("vm0")[-1]
    wait_for(lambda: delivered_documents(standin)[-1:] == [final])
    wait_for(lambda: not list(json_files(state / "outbox")))
    received = {m.message_id.rpartition(":")[0] for m in standin.messages}
    assert durable <= received  # whatever reached the outbox reached Service Bus
    incarnations = [d["DocumentIncarnation"] for d in delivered_documents(standin)]
    assert incarnations == sorted(set(incarnations))  # in order, each once
    history = {d["DocumentIncarnation"]: d for d in sim.history("vm0")}
    assert all(history[d["DocumentIncarnation"]] == d for d in delivered_documents(standin))


def test_callback_hooks_and_identity_from_compute_metadata(
    simulator: Any, relay_process: Any, hook_unit: Any, tmp_path: Path, key_file: Path
) -> None:
    sim = simulator.sim
    sim.add_vm("web_3", scale_set="web")
    port = free_port()
    forward = tmp_path / "forward"
    state = tmp_path / "state"
    # The hook runs in the hook unit (its own process, here as whoever runs the tests; on a
    # VM as its drop-in says, tests/infra/test_hook_unit.py), not as a child of the relay.
    drain = tmp_path / "drain.sh"
    drain.write_text(
        "#!/bin/sh\np=$$ chain=\n"
        'while [ "$p" -gt 1 ]; do chain="$chain $p"; p=$(cut -d" " -f4 /proc/$p/stat); done\n'
        'echo "drained $SCHEDULED_EVENT_ID; ancestors:$chain"\n'
    )
    drain.chmod(0o755)
    relay = relay_process(
        f"--imds-url={simulator.vm_url('web_3')}",
        f"--state-dir={state}",
        f"--forward=file:{forward}",
        f"--callback-listen=127.0.0.1:{port}",
        f"--callback-key-file={key_file}",  # deprecated: ignored with a warning
        f"--hook=drain={drain}",
        f"--hook-socket={hook_unit({'drain': drain})}",
        "--hook-user=nobody",  # deprecated: the hook unit's drop-in says who
        "--availability-set=as-web",
        *FAST,
    )
    url = f"http://127.0.0.1:{port}"
    wait_for(lambda: json_files(forward))
    envelope = json.loads(json_files(forward)[0].read_text())
    assert envelope["vm"]["name"] == "web_3"
    assert envelope["vm"]["scale_set"] == "web"
    assert envelope["vm"]["availability_set"] == "as-web"  # IMDS cannot tell; the flag does
    assert envelope["vm"]["callback_url"] == url
    assert envelope["vm"]["vm_id"] == vm_id_of("web_3")
    key = relay_key(state)
    assert envelope["callback_key"] == {"id": key_id(key), "secret": key.hex()}
    assert envelope["attestation"]["nonce"] == binding_nonces(envelope)[0]
    assert oct(state.stat().st_mode & 0o777) == "0o700"
    assert oct((state / "callback-key.json").stat().st_mode & 0o777) == "0o600"
    messages = [x.get("msg", "") for x in relay.logs()]
    assert any(m.startswith("--callback-key-file is ignored") for m in messages)
    assert "--hook-user is ignored: hook scripts run as the hook unit's drop-in says" in str(
        messages
    )
    # The outbox empties a moment after the first file appears (the sender removes a message
    # once it is out, and a heartbeat may be queued behind it): wait for that, not just for
    # the callback server to answer.
    health = wait_for(lambda: _drained(_get(url + "/v1/health")))
    assert health.status_code == 200

    event_id = sim.add_event(event_type="Terminate", resources=["web_3"], notice=3600)
    hook = _signed(url, "/v1/hook", {"Hook": "drain", "EventId": event_id}, key, "web_3")
    assert hook.json()["status"] == "succeeded", hook.json()
    tail = hook.json()["output_tail"]
    assert tail.startswith(f"drained {event_id}; ancestors: ")
    assert str(relay.proc.pid) not in tail.split()  # the hook unit's run, not the relay's
    assert sim.approvals == []
    start = _signed(url, "/v1/start", {"EventIds": [event_id]}, key, "web_3")
    assert start.status_code == 200, start.text
    assert [a.event_id for a in sim.approvals] == [event_id]
    assert relay.stop() == 0
    assert relay.logs()[-1]["msg"] == "relay stopped"


def test_sigterm_stops_cleanly_even_while_imds_is_down(relay_process: Any, tmp_path: Path) -> None:
    """Without IMDS the relay cannot learn its vmId (its identity, even with --vm-name):
    it waits, logs the error once per streak, and still stops cleanly."""
    port = free_port()
    relay = relay_process(
        f"--imds-url=http://127.0.0.1:{free_port()}",
        "--vm-name=vm0",
        f"--state-dir={tmp_path / 'state'}",
        f"--forward=file:{tmp_path / 'out'}",
        f"--callback-listen=127.0.0.1:{port}",
        *FAST,
    )
    wait_for(lambda: any("compute metadata" in x.get("msg", "") for x in relay.logs()))
    assert relay.stop() == 0
    errors = [x for x in relay.logs() if "IMDS compute metadata error" in x.get("msg", "")]
    assert len(errors) == 1 and errors[0]["kind"] == "connection", relay.logs()


def _get(url: str) -> requests.Response | None:
    """The answer, whatever its status (a Response is falsy for 4xx/5xx), or None."""
    try:
        return requests.get(url, timeout=2)
    except requests.ConnectionError:
        return None


def _drained(health: requests.Response | None) -> requests.Response | None:
    """The health answer once it says nothing is left to send, else None (wait_for retries)."""
    if health is not None and health.status_code == 200 and health.json()["sender"]["pending"] == 0:
        return health
    return None


def _signed(url: str, path: str, payload: dict[str, Any], key: bytes, vm: str) -> requests.Response:
    body = json.dumps({**payload, "Nonce": uuid.uuid4().hex}).encode()
    headers = sign_headers(key, "POST", path, body, target=vm_id_of(vm))
    return requests.post(url + path, data=body, headers=headers, timeout=10)
