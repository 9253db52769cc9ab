"""docs/conformance.md stays true: every contract of issue 26 has a row, and every file and
test the table names exists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "conformance.md"
CONTRACTS = (
    "IMDS Scheduled Events",
    "IMDS compute metadata",
    "IMDS attested document",
    "Managed identity token",
    "Service Bus REST",
    "Table storage REST",
    "Azure Resource Graph",
    "ARM acknowledge",
    "Event Grid",
    "Teams Workflows",
    "PagerDuty Events API v2",
    "Standard Webhooks",
    "App Service authentication headers",
)


def rows() -> list[str]:
    lines = DOC.read_text().splitlines()
    return [line for line in lines if line.startswith("| ") and not line.startswith("| Contract")]


def test_every_contract_has_a_row_with_a_source_and_a_test() -> None:
    table = rows()
    for contract in CONTRACTS:
        (row,) = [r for r in table if r.startswith(f"| {contract}")]
        code, source, tests = row.split(" | ")[1:4]
        assert code and tests.count("tests/") >= 1, contract
        assert re.search(r"@ [0-9a-f]{8}|npm|PyPI|Azurite|Learn", source), contract


def test_every_named_path_and_test_exists() -> None:
    text = DOC.read_text()
    for path, _, test in re.findall(r"`((?:tests|functions|relay)/[\w/.-]+)(::)?(\w*)", text):
        target = ROOT / path
        assert target.exists(), path
        if test:
            assert f"def {test}(" in target.read_text(), f"{path}::{test}"
