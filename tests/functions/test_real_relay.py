"""Approval against the real relay callback (relay/callback.py) over the IMDS simulator."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
import requests

from functions.clock import SystemClock
from functions.identity.keys import CallbackKey
from functions.pipeline.context import Pipeline
from functions.pipeline.ingest import ingest_message
from functions.pipeline.publish import LocalPublisher
from relay.callback import CallbackApp, CallbackServer
from relay.imds import ImdsClient
from relay.keystore import KeyStore
from simulator.engine import Simulator
from simulator.server import SimulatorServer
from tests import identity_harness
from tests.conftest import free_port
from tests.functions.conftest import envelope, make_settings


@pytest.fixture
def fleet(tmp_path) -> Iterator[tuple[Simulator, dict[str, CallbackServer]]]:
    """Two real relay callbacks. vm2's relay holds the key its VM's messages carry; vm1's
    holds a key of its own the app never learns (a message carrying it never came)."""
    sim = Simulator()
    sim.add_availability_set("as1", ["vm1", "vm2"])
    server = SimulatorServer(sim).start()
    relays = {}
    try:
        for vm in ("vm1", "vm2"):
            keys = KeyStore(tmp_path / vm)
            if vm == "vm2":
                _give(keys, identity_harness.callback_key(vm, f"http://127.0.0.1:{PORTS[vm]}"))
            app = CallbackApp(keys, identity_harness.vm_id(vm), vm, ImdsClient(server.vm_url(vm)))
            relays[vm] = CallbackServer(f"127.0.0.1:{PORTS[vm]}", app, poll_interval=0.05).start()
        yield sim, relays
    finally:
        for relay in relays.values():
            relay.stop()
        server.stop()


PORTS = {"vm1": free_port(), "vm2": free_port()}


def _give(keys: KeyStore, key: CallbackKey) -> None:
    """The relay's key file, as if it had made this key itself."""
    created = int(time.time())
    keys.path.write_text(
        json.dumps(
            {
                "current": {"id": key.key_id, "secret": key.secret.hex(), "created": created},
                "previous": None,
            }
        )
    )
    keys.current, keys.previous = keys._load()


def report(pipeline: Pipeline, sim: Simulator, relays: dict, vm: str, sequence: int) -> None:
    """`vm`'s relay reports what the simulator's IMDS shows it now, through ingest."""
    body = envelope(
        vm,
        sequence,
        sim.document(vm)["Events"],
        callback_url=relays[vm].url,
        availability_set="as1",
        observed_at=datetime.now(UTC),
    )
    ingest_message(body, pipeline)


def test_approval_through_the_real_relay_falls_back_past_a_refusal(store, fleet):
    sim, relays = fleet
    event_id = sim.add_event("Reboot", resources=["vm1", "vm2"], source="User")
    publisher = LocalPublisher()
    settings = make_settings(approval_budget_seconds=2)
    pipeline = Pipeline(
        store,
        settings,
        publisher,
        requests.Session(),
        SystemClock(),
        admission=identity_harness.admission(store),
    )
    for sequence, vm in enumerate(("vm1", "vm2"), start=1):
        report(pipeline, sim, relays, vm, sequence)
    record = store.get_event(event_id)
    assert record.approval == "approved" and record.approved_by == "vm2"
    # vm1's relay answers 401 (it holds a key the app does not know), so it is asked
    # again within the budget, never given up on; vm2's relay approves once it is known.
    attempts = record.approval_attempts
    assert [a.vm for a in attempts][-1] == "vm2" and attempts[-1].outcome == "approved"
    assert {a.vm for a in attempts[:-1]} == {"vm1"} and len(attempts) >= 3
    assert all(a.outcome.startswith("answered 401 (may pass") for a in attempts[:-1])
    assert [(a.vm, a.event_id) for a in sim.approvals] == [("vm2", event_id)]
    assert publisher.transitions(event_id) == ["scheduled", "decided", "approved"]
