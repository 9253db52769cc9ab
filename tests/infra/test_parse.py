"""Every template parses, and the worked example sets real parameters of main.bicep."""

from __future__ import annotations

import re

import pytest

from tests.infra.bicep import (
    INFRA,
    Template,
    bicep_files,
    dotted,
    load,
    module_path,
    parse,
    parse_bicepparam,
)


def test_there_are_templates() -> None:
    names = {p.relative_to(INFRA).as_posix() for p in bicep_files()}
    assert {
        "main.bicep",
        "modules/servicebus.bicep",
        "modules/functionapp.bicep",
        "modules/storage.bicep",
        "modules/keyvault.bicep",
        "modules/monitoring.bicep",
        "modules/network.bicep",
        "modules/vmss-relay.bicep",
        "modules/vm-relay.bicep",
    } <= names


@pytest.mark.parametrize("path", bicep_files(), ids=lambda p: p.relative_to(INFRA).as_posix())
def test_parses(path) -> None:
    tree = parse(path)
    # modules/example-ssh-key.bicep creates nothing: its parameter is its point.
    assert tree.get("resources") or tree.get("modules") or tree.get("outputs")


def test_every_module_path_exists_and_gets_only_its_params() -> None:
    main = load("main")
    assert main.modules
    for symbol, module in main.modules.items():
        path = module_path(main, symbol)
        assert path.is_file(), f"{symbol}: {path} missing"
        target = parse(path)["parameters"]
        config = module["config"]
        if "condition" in config and "config" in config:
            config = config["config"]
        given = set(config["params"])
        assert given <= set(target), f"{symbol}: unknown params {given - set(target)}"
        required = {n for n, p in target.items() if p["default"] is None}
        assert required <= given, f"{symbol}: missing required params {required - given}"


def test_load_text_content_paths_exist() -> None:
    text = (INFRA / "main.bicep").read_text()
    assert "loadTextContent('relay/cloud-init.yaml')" in text
    assert (INFRA / "relay" / "cloud-init.yaml").is_file()


def test_worked_example_sets_known_params_and_all_required_ones() -> None:
    values = parse_bicepparam(INFRA / "main.bicepparam")
    assert (INFRA / "main.bicepparam").read_text().startswith("//")
    assert "using 'main.bicep'" in (INFRA / "main.bicepparam").read_text()
    params = load("main").params
    assert set(values) <= set(params), f"unknown: {set(values) - set(params)}"
    required = {n for n, p in params.items() if p["default"] is None}
    assert required <= set(values), f"required but unset: {required - set(values)}"


def test_worked_example_takes_secrets_from_the_environment_only() -> None:
    values = parse_bicepparam(INFRA / "main.bicepparam")
    main = load("main")
    secure = {n for n in main.params if main.decorator(n, "secure")}
    assert {"appSecret", "pagerdutyRoutingKey", "webhookSecret"} <= secure
    assert values["appSecret"]["function"]["parameters"] == {"arg_1": "APP_SECRET"}  # required
    for name in secure & set(values):
        value = values[name]
        assert isinstance(value, dict), f"{name} is a literal in main.bicepparam"
        assert value["function"]["type"] == "readEnvironmentVariable", name


def test_worked_example_values_are_allowed() -> None:
    values = parse_bicepparam(INFRA / "main.bicepparam")
    main = load("main")
    for name, value in values.items():
        allowed = main.decorator(name, "allowed")
        if allowed and not isinstance(value, dict):
            assert value in allowed, f"{name}={value!r} not in {allowed}"


def _property_reads(node, found):
    """Every `x.properties...` chain in a value (a runtime reference())."""
    if isinstance(node, dict):
        op = node.get("operator", {})
        if op.get("type") == "property_accessor":
            try:
                path = dotted(node)
            except AssertionError:
                path = ""
            head, _, rest = path.partition(".")
            if rest.startswith("properties"):
                found.add(head)
        for value in node.values():
            _property_reads(value, found)
    elif isinstance(node, list):
        for value in node:
            _property_reads(value, found)
    elif isinstance(node, str):
        found.update(re.findall(r"\$\{(\w+)\.properties\b", node))
    return found


@pytest.mark.parametrize("path", bicep_files(), ids=lambda p: p.relative_to(INFRA).as_posix())
def test_outputs_never_read_a_resource_that_may_not_exist(path) -> None:
    template = Template.load(path)
    conditional = {r.symbol for r in template.resources() if r.condition is not None}
    for name, output in template.outputs.items():
        reads = _property_reads(output["value"], set())
        assert not reads & conditional, f"output {name} reads {reads & conditional}"
