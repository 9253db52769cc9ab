"""The load balancer example of issue 33 probes what the relay serves: `Http` on the
relays' ready port, path relay.ready.PATH, and the README shows the same probe."""

from __future__ import annotations

import re

from relay.ready import PATH
from tests.infra.bicep import INFRA, load

RELAY_README = INFRA.parent / "relay" / "README.md"
DOCUMENTED_PORT = 8493  # RELAY_READY_LISTEN=0.0.0.0:8493 in relay/README.md and README.md


def test_the_probe_is_the_relays_readiness_path_and_port() -> None:
    template = load("relay-ready-lb")
    [balancer] = template.resources("Microsoft.Network/loadBalancers")
    [probe] = balancer.body["properties"]["probes"]
    settings = probe["properties"]
    assert settings["protocol"] == "Http"
    assert settings["requestPath"] == PATH == "/readyz"
    assert settings["port"] == "readyPort"
    assert template.param_default("readyPort") == DOCUMENTED_PORT
    assert settings["probeThreshold"] == settings["numberOfProbes"] == "probeThreshold"
    [rule] = balancer.body["properties"]["loadBalancingRules"]
    used = rule["properties"]["probe"]["id"]["function"]["parameters"]
    assert used["resource_type"] == "Microsoft.Network/loadBalancers/probes"
    assert used["resource_name_2"] == probe["name"] == "probeName"  # the rule uses this probe
    assert template.variables["probeName"] == "relay-readyz"
    assert balancer.body["sku"]["name"] == "Standard"


def test_the_readme_shows_the_probe_the_module_declares() -> None:
    text = RELAY_README.read_text()
    [snippet] = re.findall(r"```bicep\n(.*?)```", text, re.S)
    assert f"requestPath: '{PATH}'" in snippet
    assert "protocol: 'Http'" in snippet
    module = (INFRA / "modules" / "relay-ready-lb.bicep").read_text()
    for line in ("requestPath: '/readyz'", "protocol: 'Http'", "port: readyPort"):
        assert line in module and line in snippet, line
    assert f"RELAY_READY_LISTEN=0.0.0.0:{DOCUMENTED_PORT}" in text
    assert "168.63.129.16" in text
