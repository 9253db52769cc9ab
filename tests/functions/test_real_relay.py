"""Approval against the real relay callback (relay/callback.py) over the IMDS simulator."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
import requests

from functions.clock import SystemClock
from functions.pipeline.context import Pipeline
from functions.pipeline.ingest import ingest_message
from functions.pipeline.publish import LocalPublisher
from relay.callback import CallbackApp, CallbackServer
from relay.imds import ImdsClient
from simulator.engine import Simulator
from simulator.server import SimulatorServer
from tests.functions.conftest import KEY, make_settings


@pytest.fixture
def fleet() -> Iterator[tuple[Simulator, dict[str, CallbackServer]]]:
    sim = Simulator()
    sim.add_availability_set("as1", ["vm1", "vm2"])
    server = SimulatorServer(sim).start()
    keys = {"vm1": b"a-different-key-the-functions-do-not-have", "vm2": KEY.encode()}
    relays = {}
    try:
        for vm, key in keys.items():
            app = CallbackApp(key, vm, ImdsClient(server.vm_url(vm)))
            relays[vm] = CallbackServer("127.0.0.1:0", app, poll_interval=0.05).start()
        yield sim, relays
    finally:
        for relay in relays.values():
            relay.stop()
        server.stop()


def test_approval_through_the_real_relay_falls_back_past_a_refusal(store, fleet):
    sim, relays = fleet
    event_id = sim.add_event("Reboot", resources=["vm1", "vm2"], source="User")
    publisher = LocalPublisher()
    settings = make_settings(approval_budget_seconds=2)
    pipeline = Pipeline(store, settings, publisher, requests.Session(), SystemClock())
    for sequence, vm in enumerate(("vm1", "vm2"), start=1):
        body = {
            "schema": 1,
            "kind": "document",
            "vm": {"name": vm, "callback_url": relays[vm].url, "availability_set": "as1"},
            "sequence": sequence,
            "observed_at": datetime.now(UTC).isoformat(),
            "document": sim.document(vm),
        }
        ingest_message(json.dumps(body), pipeline)
    record = store.get_event(event_id)
    assert record.approval == "approved" and record.approved_by == "vm2"
    # vm1's relay answers 401 (it holds another key: perhaps mid-rotation), so it is asked
    # again within the budget, never given up on; vm2's relay approves once it is known.
    attempts = record.approval_attempts
    assert [a.vm for a in attempts][-1] == "vm2" and attempts[-1].outcome == "approved"
    assert {a.vm for a in attempts[:-1]} == {"vm1"} and len(attempts) >= 3
    assert all(a.outcome.startswith("answered 401 (may pass") for a in attempts[:-1])
    assert [(a.vm, a.event_id) for a in sim.approvals] == [("vm2", event_id)]
    assert publisher.transitions(event_id) == ["scheduled", "decided", "approved"]
