"""Every resource body of infra/ against Azure's published types (tests/infra/schema_check.py).

A failure here is what `bicep build` would warn about (BCP037 unknown property, BCP036
wrong type, BCP035 missing required property, BCP073 read-only) or what ARM refuses at
deployment (InvalidTemplate / an unknown api-version).
"""

from __future__ import annotations

import json
import textwrap

import pytest

from tests.infra import conftest
from tests.infra.schema_check import Report, check_all, check_resource, schema
from tests.infra.schemas.extract import declared_types

# Values the checker cannot evaluate offline (names with uniqueString, the tenant id...).
# Raise it only with a reason: each one is a value no test checks before Azure does.
MAX_NOT_CHECKED = 12


# One worker runs the whole module (make test: --dist loadgroup): its fixture once.
pytestmark = pytest.mark.xdist_group("schemas")


@pytest.fixture(scope="module")
def report() -> Report:
    found = check_all()
    conftest.SUMMARIES.append(f"schema check: {found.summary()}")
    return found


def test_extract_covers_exactly_the_declared_types() -> None:
    data = schema()
    declared = {f"{t}@{v}" for t, v in declared_types()}
    assert data["missing"] == []
    assert set(data["resources"]) == declared, "regenerate: tests/infra/schemas/extract.py"
    assert data["source"]["commit"] and data["source"]["license"].startswith("MIT")


def test_every_resource_body_matches_azure_types(report: Report) -> None:
    assert report.errors == []
    assert report.resources >= 90
    assert len(report.property_places) > 900


def test_what_is_not_checked_is_counted_and_few(report: Report) -> None:
    # Reported, never passed: the summary line at the end of the run lists the reasons.
    assert sum(report.not_checked.values()) == len(report.not_checked_where)
    assert len(report.not_checked_where) <= MAX_NOT_CHECKED, "\n".join(report.not_checked_where)


# --- The checker itself catches what it claims to (small templates written here) ---------

BAD = {
    "unknown property": (
        "resource x 'Microsoft.ManagedIdentity/userAssignedIdentities@2023-01-31' = {\n"
        "  name: 'x'\n  location: 'westeurope'\n  propertiez: {}\n}\n",
        "propertiez: is not a property here",
    ),
    "casing": (
        "resource x 'Microsoft.Web/sites@2024-04-01' = {\n  name: 'x'\n  location: 'w'\n"
        "  properties: {\n    httpsonly: true\n  }\n}\n",
        "is spelled 'httpsOnly'",
    ),
    "enum value": (
        "resource x 'Microsoft.ServiceBus/namespaces@2022-10-01-preview' = {\n  name: 'x'\n"
        "  location: 'w'\n  sku: {\n    name: 'Basic2'\n  }\n}\n",
        "sku.name: 'Basic2' is none of",
    ),
    "enum via parameter": (
        "@allowed([\n  'Standard'\n  'Gold'\n])\nparam tier string = 'Standard'\n"
        "resource x 'Microsoft.ServiceBus/namespaces@2022-10-01-preview' = {\n  name: 'x'\n"
        "  location: 'w'\n  sku: {\n    name: tier\n  }\n}\n",
        "'Gold' is none of",
    ),
    "type": (
        "resource x 'Microsoft.Web/sites@2024-04-01' = {\n  name: 'x'\n  location: 'w'\n"
        "  properties: {\n    httpsOnly: 'yes'\n  }\n}\n",
        "expects a bool",
    ),
    "required": (
        "resource x 'Microsoft.Authorization/roleAssignments@2022-04-01' = {\n  name: 'x'\n"
        "  properties: {\n    principalId: 'p'\n  }\n}\n",
        "roleDefinitionId: is required",
    ),
    "read-only": (
        "resource x 'Microsoft.Web/sites@2024-04-01' = {\n  name: 'x'\n  location: 'w'\n"
        "  properties: {\n    defaultHostName: 'h'\n  }\n}\n",
        "defaultHostName: is read-only",
    ),
    "api-version": (
        "resource x 'Microsoft.Web/sites@2099-01-01' = {\n  name: 'x'\n  location: 'w'\n}\n",
        "is not a published resource type",
    ),
    "ternary arm": (
        "param big bool = false\n"
        "resource x 'Microsoft.ServiceBus/namespaces@2022-10-01-preview' = {\n  name: 'x'\n"
        "  location: 'w'\n  sku: {\n    name: big ? 'Premium' : 'Cheap'\n  }\n}\n",
        "'Cheap' is none of",
    ),
    "discriminated child (sites/config)": (
        "resource x 'Microsoft.Web/sites/config@2024-04-01' = {\n  name: 'authsettingsV2'\n"
        "  properties: {\n    platform: {\n      enabeld: true\n    }\n  }\n}\n",
        "platform.enabeld: is not a property here",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_checker_catches(case: str, tmp_path) -> None:
    source, expected = BAD[case]
    path = tmp_path / "bad.bicep"
    path.write_text(textwrap.dedent(source))
    # Stubbed into the extract's lookup only for the unknown api-version case.
    found = Report()
    check_resource(path, "x", found)
    assert any(expected in e for e in found.errors), json.dumps(found.errors, indent=1)


def test_checker_counts_a_runtime_value_as_not_checked(tmp_path) -> None:
    path = tmp_path / "unknown.bicep"
    path.write_text(
        "param sku string\n"
        "resource x 'Microsoft.ServiceBus/namespaces@2022-10-01-preview' = {\n  name: 'x'\n"
        "  location: resourceGroup().location\n  sku: {\n    name: sku\n  }\n}\n"
    )
    found = Report()
    check_resource(path, "x", found)
    assert found.errors == []
    assert found.not_checked_where == ["unknown.bicep:x: sku.name (parameter)"]
