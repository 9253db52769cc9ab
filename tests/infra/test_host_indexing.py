"""What the Functions host will index, checked against what the Bicep deploys.

The Python worker imports function_app.py and calls get_functions() on each FunctionApp
(azure.functions' FunctionRegister); each function's bindings are what the host indexes.
Here the same happens offline, and every Service Bus binding is matched against the Bicep:
its connection prefix against the identity-based settings the function app gets
(`<prefix>__fullyQualifiedNamespace`, `__credential`, `__clientId`), its `%SETTING%` names
against the app settings, and their values against the queues, topic and subscriptions
servicebus.bicep and eventgrid.bicep create. host.json's serviceBus section is checked
against the extension's own options class (schemas/servicebus-options.json).
"""

from __future__ import annotations

import importlib
import json
import re
from functools import cache

import azure.functions as func
import pytest

from tests.indexed_functions import indexed_functions
from tests.infra.bicep import INFRA, ROOT, iso_minutes
from tests.infra.bicep_evaluator import evaluator_for
from tests.infra.bicep_values import Alt, alternatives

SCHEMAS = ROOT / "tests" / "infra" / "schemas"


@cache
def indexed() -> dict[str, list[dict]]:
    module = importlib.import_module("function_app")
    apps = [v for v in vars(module).values() if isinstance(v, func.FunctionRegister)]
    assert len(apps) == 1, "the worker indexes every FunctionApp in function_app.py"
    assert apps[0] is module.app
    functions: dict[str, list[dict]] = {}
    for function in indexed_functions():
        name = function.get_function_name()
        assert name not in functions, f"two functions named {name}"
        functions[name] = json.loads(function.get_function_json())["bindings"]
    return functions


@cache
def app_settings() -> dict[str, list]:
    """Every app setting the Bicep can write (as main.bicep calls the module), each with its
    possible values."""
    evaluator = evaluator_for(INFRA / "modules" / "functionapp.bicep")
    merged: dict[str, list] = {}
    for option in alternatives(evaluator.identifier("appSettings", {})):
        for key, value in option.items():
            merged.setdefault(key, [])
            for v in alternatives(value):
                if v not in merged[key]:
                    merged[key].append(v)
    return merged


def _setting(name: str) -> list[str]:
    match = re.fullmatch(r"%(\w+)%", name)
    if not match:
        return [name]
    values = app_settings().get(match.group(1))
    assert values, f"%{match.group(1)}% is not an app setting the Bicep writes"
    assert all(isinstance(v, str) for v in values), values
    return values


@cache
def service_bus_entities() -> dict[str, object]:
    sb = evaluator_for(INFRA / "modules" / "servicebus.bicep")
    eg = evaluator_for(INFRA / "modules" / "eventgrid.bicep")
    queues, locks = {}, {}
    for evaluator in (sb, eg):
        for res in evaluator.template.tree["resources"].values():
            if res["type"] == "Microsoft.ServiceBus/namespaces/queues":
                body = res["config"]
                name = evaluator.eval(body["name"])
                session = evaluator.eval(body.get("properties", {}).get("requiresSession", False))
                queues[name] = session
                locks[name] = evaluator.eval(body["properties"]["lockDuration"])
    topic = sb.eval(sb.template.tree["resources"]["notifications"]["config"]["name"])
    subs = sb.eval(sb.template.tree["variables"]["subscriptionNames"]["value"])
    return {"queues": queues, "locks": locks, "topic": topic, "subscriptions": set(subs)}


def test_the_host_indexes_every_function() -> None:
    functions = indexed()
    assert len(functions) >= 13
    for name, bindings in functions.items():
        triggers = [b for b in bindings if b["type"].endswith("Trigger")]
        assert len(triggers) == 1, name


SERVICE_BUS = [
    (name, b) for name, bs in indexed().items() for b in bs if b["type"] == "serviceBusTrigger"
]


@pytest.mark.parametrize(("name", "binding"), SERVICE_BUS, ids=[n for n, _ in SERVICE_BUS])
def test_service_bus_bindings_match_the_bicep(name: str, binding: dict) -> None:
    settings = app_settings()
    prefix = binding["connection"]
    assert f"{prefix}__fullyQualifiedNamespace" in settings
    assert settings[f"{prefix}__credential"] == ["managedidentity"]
    assert f"{prefix}__clientId" in settings
    assert prefix not in settings, "a connection string would win over the identity settings"
    entities = service_bus_entities()
    if "queueName" in binding:
        (queue,) = _setting(binding["queueName"])
        assert queue in entities["queues"], f"{name}: no queue {queue}"
        sessions = entities["queues"][queue]
        assert bool(binding.get("isSessionsEnabled", False)) == sessions, name
        if binding.get("cardinality", "ONE").upper() == "MANY":
            assert not sessions, f"{name}: batched receive from a session queue"
            _batch_wait_fits_the_lock(name, entities["locks"][queue])
    else:
        (topic,) = _setting(binding["topicName"])
        assert topic == entities["topic"]
        assert binding["subscriptionName"] in entities["subscriptions"], name
        assert not binding.get("isSessionsEnabled", False)


def test_host_storage_is_identity_based_with_the_user_assigned_identity() -> None:
    settings = app_settings()
    assert settings["AzureWebJobsStorage__credential"] == ["managedidentity"]
    assert "AzureWebJobsStorage__clientId" in settings
    assert "AzureWebJobsStorage__accountName" in settings
    assert "AzureWebJobsStorage" not in settings


def test_host_json_service_bus_options_exist_in_the_extension() -> None:
    known = json.loads((SCHEMAS / "servicebus-options.json").read_text())
    host = json.loads((ROOT / "host.json").read_text())
    options = host["extensions"]["serviceBus"]
    assert set(options) <= set(known["options"]), set(options) - set(known["options"])
    retry = options.get("clientRetryOptions", {})
    assert set(retry) <= set(known["clientRetryOptions"])
    assert retry.get("mode", "exponential").lower() in ("exponential", "fixed")
    wait = options.get("maxBatchWaitTime")
    if wait:
        h, m, s = (float(x) for x in wait.split(":"))
        assert h * 3600 + m * 60 + s <= known["maxBatchWaitTimeSecondsAtMost"]
    assert options.get("minMessageBatchSize", 1) < options.get("maxMessageBatchSize", 1000)


def _batch_wait_fits_the_lock(name: str, lock: str) -> None:
    """Learn's Service Bus bindings page, host.json settings (MicrosoftDocs/azure-docs
    articles/azure-functions/functions-bindings-service-bus.md): maxBatchWaitTime "The
    longest allowed wait time is 50% of the entity message lock duration ... Otherwise, you
    may get lock exceptions", and maxAutoLockRenewalDuration "only applies for functions
    that receive a single message at a time": a batch waits on its first message's lock,
    which is never renewed. The 30 s wait on the 10 s lock lost every quiet batch (issue 38)."""
    options = json.loads((ROOT / "host.json").read_text())["extensions"]["serviceBus"]
    h, m, s = (float(x) for x in options.get("maxBatchWaitTime", "00:00:30").split(":"))
    wait = h * 3600 + m * 60 + s
    assert wait <= iso_minutes(lock) * 60 / 2, (
        f"{name}: waits {wait:g} s for a batch on a {lock} lock"
    )


def test_host_json_other_sections() -> None:
    host = json.loads((ROOT / "host.json").read_text())
    assert host["version"] == "2.0"
    bundle = host["extensionBundle"]
    # Flex Consumption: non-C# apps need bundle [4.0.0, 5.0.0) or later.
    assert bundle["id"] == "Microsoft.Azure.Functions.ExtensionBundle"
    assert bundle["version"].startswith("[4.")
    # Flex has no hard functionTimeout cap, but the value must parse as a TimeSpan.
    assert re.fullmatch(r"\d{2}:\d{2}:\d{2}", host["functionTimeout"])
    lock = host["extensions"]["serviceBus"]["maxAutoLockRenewalDuration"]
    assert lock == host["functionTimeout"] or lock > host["functionTimeout"]
    assert iso_minutes("PT20M") == 20  # the shape test_timeouts.py compares against


def test_app_settings_values_are_strings_or_runtime_values() -> None:
    for key, values in app_settings().items():
        for value in values:
            assert not isinstance(value, (Alt, dict, list, int, bool)), key
