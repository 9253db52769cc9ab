"""The dated price table (functions/cost/prices.json) and the platform limits beside it.

Prices change and differ by region and agreement, so they live in a file a user can copy
and edit (`--prices FILE`), each with the date and the page it came from, never in code.
"""

from __future__ import annotations

import json
from datetime import date
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

PRICES_FILE = Path(__file__).with_name("prices.json")

REQUIRED_PRICES = (
    "flex_gb_second",
    "flex_always_ready_baseline_gb_second",
    "flex_executions_per_million",
    "flex_min_billed_seconds",
    "flex_free_gb_seconds",
    "flex_free_executions",
    "servicebus_standard_base_per_hour",
    "servicebus_standard_operations",
    "table_transactions_per_10k",
    "table_lrs_gb_month",
    "log_analytics_gb",
    "nat_gateway_per_hour",
    "nat_gateway_per_gb",
    "public_ip_standard_per_hour",
    "key_vault_operations_per_10k",
    "log_alert_rule_5min_month",
    "metric_alert_series_month",
    "blob_hot_lrs_gb_month",
    "blob_write_operations_per_10k",
)
# Not prices: quantities Azure does not let us measure here (bytes on the wire, the host's
# own blob writes), kept beside the prices so they are dated, sourced and flagged the same way.
REQUIRED_ASSUMPTIONS = (
    "nat_bytes_per_table_request",
    "nat_bytes_per_servicebus_operation",
    "key_vault_reads_per_secret_month",
    "host_blob_writes_per_minute",
    "host_blob_gb",
)
REQUIRED_LIMITS = (
    "servicebus_standard_credits_per_second",
    "table_account_entities_per_second",
    "table_partition_entities_per_second",
    "watchdog_sweep_seconds",
)


class CostInputError(ValueError):
    """A price or counts file, or an option, the model cannot use; the message says why."""


class Tier(BaseModel):
    model_config = ConfigDict(extra="forbid")

    up_to_millions: float | None = Field(gt=0)  # None: no upper bound
    usd_per_million: float = Field(ge=0)


class Entry(BaseModel):
    """One price or limit, with where and when it was read."""

    model_config = ConfigDict(extra="forbid")

    value: float = Field(ge=0)
    unit: str = Field(min_length=1)
    as_of: date
    source: str = Field(min_length=1)
    confirmed: bool
    note: str = ""
    tiers: list[Tier] | None = None

    @model_validator(mode="after")
    def _tiers_ascend(self) -> Entry:
        if self.tiers:
            bounds = [t.up_to_millions for t in self.tiers]
            if None in bounds[:-1]:
                raise ValueError("only the last tier may be unbounded (up_to_millions null)")
            finite = [b for b in bounds if b is not None]
            if finite != sorted(finite) or len(set(finite)) != len(finite):
                raise ValueError("tiers must ascend")
        return self


class PriceTable(BaseModel):
    model_config = ConfigDict(extra="forbid")

    currency: str
    region: str
    as_of: date
    note: str = ""
    prices: dict[str, Entry]
    limits: dict[str, Entry]
    assumptions: dict[str, Entry] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _complete(self) -> PriceTable:
        if self.currency != "USD":
            raise ValueError(f"currency must be USD (the table says {self.currency!r})")
        missing = [k for k in REQUIRED_PRICES if k not in self.prices]
        missing += [k for k in REQUIRED_LIMITS if k not in self.limits]
        missing += [k for k in REQUIRED_ASSUMPTIONS if k not in self.assumptions]
        if missing:
            raise ValueError(f"missing entries: {', '.join(missing)}")
        return self

    def price(self, name: str) -> float:
        return self.prices[name].value

    def limit(self, name: str) -> float:
        return self.limits[name].value

    def assumed(self, name: str) -> float:
        return self.assumptions[name].value

    def unconfirmed(self) -> list[str]:
        every = {**self.prices, **self.limits, **self.assumptions}
        return sorted(name for name, e in every.items() if not e.confirmed)


def load_prices(path: Path | str | None = None) -> PriceTable:
    """Read and check a price table; CostInputError names the file and the first problem."""
    file = Path(path) if path is not None else PRICES_FILE
    try:
        return PriceTable.model_validate(json.loads(file.read_text(encoding="utf-8")))
    except (OSError, UnicodeDecodeError) as exc:
        raise CostInputError(f"{file}: {exc}") from None
    except json.JSONDecodeError as exc:
        raise CostInputError(f"{file}: not JSON: {exc}") from None
    except ValidationError as exc:
        raise CostInputError(f"{file}: not a price table: {first_error(exc)}") from None


def first_error(exc: ValidationError) -> str:
    error = exc.errors(include_url=False)[0]
    where = ".".join(str(p) for p in error["loc"])
    message = error["msg"].removeprefix("Value error, ")
    return f"{where}: {message}" if where else message
