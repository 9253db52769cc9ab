"""The template's other default resources: the NAT gateway and its public IP (by the hour and
by the GB), Key Vault, the alert rules, the host's blobs; counted from the Bicep itself."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from functions.__main__ import main
from functions.cost.model import estimate, load_deployment, nat_traffic, volumes
from functions.cost.prices import PRICES_FILE, REQUIRED_ASSUMPTIONS, load_prices
from functions.cost.resources import TemplateResources, template_resources
from tests.cost.test_model import COUNTS, DEPLOYMENT, PRICES, TABLE_WORKLOAD, WORKLOAD

ROOT = Path(__file__).resolve().parents[2]
NEW_VNET = DEPLOYMENT.model_copy(
    update={"resources": DEPLOYMENT.resources.model_copy(update={"network": "new"})}
)


def _lines(e) -> dict[str, float]:
    return {line.item: line for line in e.lines if line.part == "Network"}


def test_the_template_nat_gateway_costs_by_the_hour_and_by_the_gb() -> None:
    e = estimate(WORKLOAD, NEW_VNET, COUNTS, PRICES)
    network = _lines(e)
    assert network["NAT gateway"].usd == pytest.approx(29.2)  # 730 h x $0.04
    assert network["public IP (Standard, the NAT's)"].usd == pytest.approx(3.65)  # 730 x 0.005
    # 243,400 Table requests x 1,000 B + 3,045,000 Service Bus operations x 2,000 B
    assert network["NAT gateway data processed"].quantity == pytest.approx(6.3334)
    assert network["NAT gateway data processed"].usd == pytest.approx(0.31667)
    assert e.parts["Network"] == pytest.approx(29.2 + 3.65 + 0.31667)
    assert e.total_usd == pytest.approx(16.447593 + 33.16667, rel=1e-6)


def test_relays_outside_the_vnet_send_nothing_through_its_nat() -> None:
    """Heartbeats on Service Bus: the relays' sends (3,000 documents and 1,000,000 heartbeats)
    leave the NAT; the app's receives, completes and notifications stay."""
    outside = WORKLOAD.model_copy(update={"relays_behind_nat": 0.0})
    traffic = nat_traffic(volumes(outside, COUNTS, NEW_VNET), outside, COUNTS)
    assert traffic.servicebus_operations == pytest.approx(3_045_000 - 1_003_000)
    assert traffic.table_requests == pytest.approx(243_400)
    # relays writing the liveness table: their 1,000,000 heartbeats are Table requests
    table_outside = TABLE_WORKLOAD.model_copy(update={"relays_behind_nat": 0.0})
    v = volumes(table_outside, COUNTS, NEW_VNET)
    assert nat_traffic(v, table_outside, COUNTS).table_requests == pytest.approx(143_400)
    assert nat_traffic(v, TABLE_WORKLOAD, COUNTS).table_requests == pytest.approx(1_143_400)


def test_an_existing_vnet_has_no_nat_gateway_here() -> None:
    e = estimate(WORKLOAD, DEPLOYMENT, COUNTS, PRICES)
    assert "Network" not in e.parts


def test_the_counts_are_the_templates() -> None:
    """What main.bicep creates by default, counted independently of resources.py's parser."""
    main_bicep = (ROOT / "infra" / "main.bicep").read_text()
    network = (ROOT / "infra" / "modules" / "network.bicep").read_text()
    monitoring = (ROOT / "infra" / "modules" / "monitoring.bicep").read_text()
    assert "param createVirtualNetwork bool = true" in main_bicep
    assert "param createNatGateway bool = true" in main_bicep
    assert "'Microsoft.Network/natGateways@" in network
    assert "'Microsoft.Network/publicIPAddresses@" in network
    names = re.findall(r"^    name: '([a-z-]+)'$", monitoring, re.M)
    assert {
        "function-failures",
        "watchdog-not-running",
        "relay-silent",
        "approval-failed",
        "policy-invalid",
    } <= set(names)
    assert monitoring.count("evaluationFrequency: 'PT5M'") == 2  # metric and log rules
    found = template_resources(ROOT)
    vault = (ROOT / "infra" / "modules" / "keyvault.bicep").read_text()
    secrets = vault.count("'Microsoft.KeyVault/vaults/secrets@")
    assert secrets >= 5  # app-secret and the four channel secrets at least
    assert found == TemplateResources(
        network="new",
        key_vault_secrets=secrets,
        log_alert_rules=len(names),
        metric_alert_series=4,
    )
    assert template_resources(ROOT, network="existing").network == "existing"


def test_every_unmeasured_quantity_is_flagged() -> None:
    prices = load_prices()
    for name in REQUIRED_ASSUMPTIONS:
        assert not prices.assumptions[name].confirmed, name
        assert name in prices.unconfirmed()
    for name in ("nat_gateway_per_hour", "nat_gateway_per_gb", "public_ip_standard_per_hour"):
        entry = prices.prices[name]
        assert not entry.confirmed and entry.source.startswith("https://azure.microsoft.com/")


def test_a_price_table_without_the_assumptions_is_refused(tmp_path, capsys) -> None:
    table = json.loads(PRICES_FILE.read_text())
    del table["assumptions"]["nat_bytes_per_table_request"]
    broken = tmp_path / "prices.json"
    broken.write_text(json.dumps(table))
    assert main(["cost", "--vms", "10", "--prices", str(broken)]) == 2
    assert "missing entries: nat_bytes_per_table_request" in capsys.readouterr().err


def test_the_command_prices_the_nat_gateway_unless_told_the_vnet_is_yours(capsys) -> None:
    assert main(["cost", "--vms", "10000"]) == 0
    text = capsys.readouterr().out
    assert "NAT gateway" in text and "with a NAT gateway (100% of the relays behind it)" in text
    assert main(["cost", "--vms", "10000", "--network", "existing"]) == 0
    text = capsys.readouterr().out
    assert "Network " not in text and "your VNet and egress (no NAT gateway)" in text
    assert main(["cost", "--vms", "10", "--relays-behind-nat", "2"]) == 2
    assert "--relays-behind-nat" in capsys.readouterr().err


def test_the_shipped_deployment_reads_the_template() -> None:
    assert load_deployment().resources == template_resources(ROOT)
