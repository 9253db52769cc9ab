"""What the template's other default resources cost: the NAT gateway and its public IP, Key
Vault, the alert rules, the host's blob storage.

The fleet model (model.py) prices the work the bridge does per document, heartbeat and
sweep. These resources cost mostly by the hour or by the rule, whatever the fleet does, and
a small fleet's bill is mostly them: the NAT gateway alone (about 33 USD a month) is more
than the work of 10,000 VMs. `template_resources` reads how many of each the Bicep creates
by default, so a template change shows up here (tests/cost/test_resources.py checks it).
Quantities Azure does not let us measure here (bytes through the NAT gateway, the host's
lease renewals) are the price table's `assumptions`, flagged unconfirmed like its prices.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from functions.cost.lines import Line
from functions.cost.prices import CostInputError, PriceTable

HOURS_PER_MONTH = 730
MINUTES_PER_MONTH = HOURS_PER_MONTH * 60


class TemplateResources(BaseModel):
    """The resources main.bicep creates by default besides the Function App, Service Bus
    and the state tables."""

    model_config = ConfigDict(extra="forbid")

    # new: the template's VNet with its NAT gateway and public IP (createVirtualNetwork and
    # createNatGateway default true); existing: your VNet and your own egress, no NAT here.
    network: Literal["new", "existing"] = "new"
    key_vault_secrets: int = Field(default=5, ge=0)  # app-secret and up to 4 channel secrets
    log_alert_rules: int = Field(default=5, ge=0)  # evaluated every 5 minutes
    metric_alert_series: int = Field(default=4, ge=0)  # dead letters, one per entity


class Traffic(BaseModel):
    """What crosses the NAT gateway in a month (the function app's outbound, and the relays'
    of the VMs that live in the template's VNet)."""

    table_requests: float = Field(ge=0)
    servicebus_operations: float = Field(ge=0)


def network_lines(r: TemplateResources, traffic: Traffic, p: PriceTable) -> list[Line]:
    if r.network == "existing":
        return []
    gigabytes = (
        traffic.table_requests * p.assumed("nat_bytes_per_table_request")
        + traffic.servicebus_operations * p.assumed("nat_bytes_per_servicebus_operation")
    ) / 1e9
    return [
        Line(
            part="Network",
            item="NAT gateway",
            quantity=HOURS_PER_MONTH,
            unit="hours",
            usd=HOURS_PER_MONTH * p.price("nat_gateway_per_hour"),
        ),
        Line(
            part="Network",
            item="NAT gateway data processed",
            quantity=gigabytes,
            unit="GB",
            usd=gigabytes * p.price("nat_gateway_per_gb"),
        ),
        Line(
            part="Network",
            item="public IP (Standard, the NAT's)",
            quantity=HOURS_PER_MONTH,
            unit="hours",
            usd=HOURS_PER_MONTH * p.price("public_ip_standard_per_hour"),
        ),
    ]


def keyvault_lines(r: TemplateResources, p: PriceTable) -> list[Line]:
    operations = r.key_vault_secrets * p.assumed("key_vault_reads_per_secret_month")
    return [
        Line(
            part="Key Vault",
            item="secret operations",
            quantity=operations,
            unit="operations",
            usd=operations / 1e4 * p.price("key_vault_operations_per_10k"),
        )
    ]


def monitor_lines(r: TemplateResources, p: PriceTable) -> list[Line]:
    return [
        Line(
            part="Alerts",
            item="log alert rules (every 5 min)",
            quantity=r.log_alert_rules,
            unit="rules",
            usd=r.log_alert_rules * p.price("log_alert_rule_5min_month"),
        ),
        Line(
            part="Alerts",
            item="metric alert series",
            quantity=r.metric_alert_series,
            unit="series",
            usd=r.metric_alert_series * p.price("metric_alert_series_month"),
        ),
    ]


def blob_lines(p: PriceTable) -> list[Line]:
    writes = MINUTES_PER_MONTH * p.assumed("host_blob_writes_per_minute")
    gigabytes = p.assumed("host_blob_gb")
    return [
        Line(
            part="Blob storage",
            item="host lease renewals",
            quantity=writes,
            unit="writes",
            usd=writes / 1e4 * p.price("blob_write_operations_per_10k"),
        ),
        Line(
            part="Blob storage",
            item="package and host blobs",
            quantity=gigabytes,
            unit="GB",
            usd=gigabytes * p.price("blob_hot_lrs_gb_month"),
        ),
    ]


def resource_lines(r: TemplateResources, traffic: Traffic, p: PriceTable) -> list[Line]:
    return [
        *network_lines(r, traffic, p),
        *keyvault_lines(r, p),
        *monitor_lines(r, p),
        *blob_lines(p),
    ]


def template_resources(root: Path, *, network: str | None = None) -> TemplateResources:
    """Count what main.bicep and its modules create by default."""
    try:
        main = (root / "infra" / "main.bicep").read_text(encoding="utf-8")
        monitoring = (root / "infra" / "modules" / "monitoring.bicep").read_text(encoding="utf-8")
        vault = (root / "infra" / "modules" / "keyvault.bicep").read_text(encoding="utf-8")
    except OSError as exc:
        raise CostInputError(f"cannot read the template: {exc}") from None
    new_vnet = _bool_default(main, "createVirtualNetwork") and _bool_default(
        main, "createNatGateway"
    )
    return TemplateResources(
        network=network or ("new" if new_vnet else "existing"),
        key_vault_secrets=len(
            re.findall(r"^resource \w+ 'Microsoft\.KeyVault/vaults/secrets@", vault, re.M)
        ),
        log_alert_rules=len(
            re.findall(r"^    name: '", _block(monitoring, "var logAlerts = ["), re.M)
        ),
        metric_alert_series=len(
            [
                x
                for x in _block(main, "deadLetterEntities: [").splitlines()[1:]
                if x.strip() and x.strip() != "]"
            ]
        ),
    )


def _bool_default(text: str, name: str) -> bool:
    match = re.search(rf"^param {name} bool = (true|false)", text, re.M)
    if match is None:
        raise CostInputError(f"main.bicep has no default for {name}")
    return match.group(1) == "true"


def _block(text: str, opening: str) -> str:
    """From `opening` to its closing bracket (at the opening line's indentation)."""
    start = text.find(opening)
    if start < 0:
        raise CostInputError(f"the template has no {opening!r}")
    line_start = text.rfind("\n", 0, start) + 1
    indent = start - line_start
    end = text.find("\n" + " " * indent + "]", start)
    return text[start : end if end > 0 else len(text)]
