"""The Azure handler of agentless mode, as function_app.py registers it."""

from __future__ import annotations

import json

import azure.functions as func

from functions.triggers import core
from functions.triggers.eventgrid import bp
from tests.agentless.grid import event, grid_event
from tests.functions.conftest import make_pipeline


def test_binding_is_the_event_grid_queue_without_sessions():
    app = func.FunctionApp()
    app.register_functions(bp)
    (function,) = app.get_functions()
    binding = function.get_bindings()[0].get_dict_repr()
    assert function.get_function_name() == "ingest_event_grid"
    assert binding["type"] == "serviceBusTrigger" and binding["queueName"] == "%EVENTGRID_QUEUE%"
    assert not binding.get("isSessionsEnabled")
    assert binding["connection"] == "ServiceBusConnection"


def test_handler_ingests_and_completes_bad_messages(store, clock):
    pipeline, pub = make_pipeline(store, clock)
    core.use_pipeline(pipeline)
    try:
        handler = bp._function_builders[0]._function.get_user_function()
        body = json.dumps(grid_event(event("EV-T", "Reboot"), schema="cloudevents"))
        handler(func.ServiceBusMessage(body=body.encode()))
        handler(func.ServiceBusMessage(body=b"[{]"))  # recorded, not raised
    finally:
        core.use_pipeline(None)
    assert pub.transitions("EV-T") == ["scheduled", "decided"]
    assert ["not JSON" in r["reason"] for r in store.rejected_rows()] == [True]
