"""The simulator's Resource Graph refuses what Azure documents it refuses, pages at 1,000
rows with `$skipToken`, and spends a 15-per-5-s quota (simulator.resource_graph)."""

from __future__ import annotations

from typing import Any

import pytest
import requests

from functions.identity.facts import TABLES, ResourceGraphRefused, ResourceGraphResolver, vm_query
from simulator import Simulator, SimulatorServer
from simulator.resource_graph import (
    INVALID_QUERY,
    QueryRefused,
    ResourceGraphService,
    check_query,
    vm_row,
)
from tests.identity.test_facts import SimulatorCredential

SUB = "aaaaaaaa-0000-0000-0000-000000000000"
VM = "01234567-89ab-cdef-0123-456789abcdef"

# The query facts.py sent before it obeyed the documented limits: a cross-table union,
# twice, and a join across tables. Azure refuses it; so must the simulator.
OLD_FACTS_QUERY = f"""union
(resources | where type =~ 'microsoft.compute/virtualmachines'
 | where tolower(tostring(properties.vmId)) == '{VM}' | project vmKey = tolower(id), id),
(computeresources
 | where type =~ 'microsoft.compute/virtualmachinescalesets/virtualmachines'
 | where tolower(tostring(properties.vmId)) == '{VM}' | project vmKey = tolower(id), id)
| join kind=leftouter (
    union
      (resources | where type =~ 'microsoft.network/networkinterfaces'),
      (computeresources | where type =~
         'microsoft.compute/virtualmachinescalesets/virtualmachines/networkinterfaces')
    | extend vmKey = tolower(tostring(properties.virtualMachine.id))
  ) on vmKey
| limit 200"""


@pytest.mark.parametrize("table", TABLES)
@pytest.mark.parametrize("vm_id", [None, VM])
def test_the_facts_queries_obey_the_documented_limits(table: str, vm_id: str | None) -> None:
    check_query(vm_query(table, vm_id))


@pytest.mark.parametrize(
    ("query", "rule"),
    [
        (OLD_FACTS_QUERY, "CrossTableUnionNotSupported"),
        ("resources | union computeresources", "CrossTableUnionNotSupported"),
        ("union (resources), (resources), (resources), (resources)", "UnionLegsLimitExceeded"),
        ("resources | union resources, resources, resources", "UnionLegsLimitExceeded"),
        (
            "resources | join (resources) on id | join (resources) on id"
            " | join (resources) on id | join (resources) on id",
            "JoinLimitExceeded",
        ),
        (
            "resources | join (computeresources) on id | join (advisorresources) on id",
            "CrossTableJoinLimitExceeded",
        ),
        ("nosuchtable | limit 1", "UnknownTable"),
        ("resources | join (nosuchtable) on id", "UnknownTable"),
        (
            "resources | mv-expand a | mv-expand b | mv-expand c | mv-expand d",
            "MvExpandLimitExceeded",
        ),
    ],
)
def test_what_azure_refuses_is_refused(query: str, rule: str) -> None:
    with pytest.raises(QueryRefused) as info:
        check_query(query)
    assert info.value.rule == rule


@pytest.mark.parametrize(
    "query",
    [
        "resources | union resourcecontainers",  # documented: Resources with ResourceContainers
        "resources | join (resourcecontainers) on subscriptionId"
        " | join (resourcecontainers) on subscriptionId",  # three allowed between those two
        "resources | join (computeresources) on id",  # one cross-table join
        "resources | where name == 'union (computeresources)' | limit 1",  # words in a string
    ],
)
def test_what_the_docs_allow_is_allowed(query: str) -> None:
    check_query(query)


def inventory(count: int) -> list[dict[str, Any]]:
    rows = []
    for i in range(count):
        rid = f"/subscriptions/{SUB}/resourceGroups/rg/providers/Microsoft.Compute/"
        rid += f"virtualMachines/v{i:06d}"
        rows.append(
            vm_row(
                table="resources",
                resource_id=rid,
                subscription_id=SUB,
                resource_group="rg",
                vm_id=f"{i:08x}-0000-4000-8000-000000000000",
                nic_id=f"{rid}-nic",
                address="10.0.0.4",
            )
        )
    return rows


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_pages_of_1000_rows_with_skip_tokens_cover_everything_once() -> None:
    service = ResourceGraphService(inventory=lambda: inventory(2500), quota=None)
    query = vm_query("resources")
    seen, token, pages = [], None, 0
    while True:
        request: dict[str, Any] = {"query": query, "options": {"$top": 1000}}
        if token:
            request["options"]["$skipToken"] = token
        status, body, _ = service.answer("app", request, {SUB})
        assert status == 200
        assert body["totalRecords"] == 2500
        assert body["count"] == len(body["data"]) <= 1000
        seen += [r["id"] for r in body["data"]]
        pages += 1
        token = body.get("$skipToken")
        if not token:
            break
    assert pages == 3
    assert seen == sorted(seen) and len(set(seen)) == 2500
    status, body, _ = service.answer("app", {"query": query, "options": {"$top": 1001}}, {SUB})
    assert status == 400
    status, body, _ = service.answer(
        "app", {"query": "resources | limit 1", "options": {"$skipToken": "junk"}}, {SUB}
    )
    assert (status, body["error"]["details"][1]["code"]) == (400, "InvalidSkipToken")


def test_the_quota_is_15_per_5_seconds_per_user_with_azures_headers() -> None:
    clock = Clock()
    service = ResourceGraphService(inventory=lambda: [], clock=clock)
    request = {"query": vm_query("resources", VM)}
    remaining = []
    for _ in range(15):
        status, _, headers = service.answer("app", request, None)
        assert status == 200
        remaining.append(int(headers["x-ms-user-quota-remaining"]))
        clock.now += 0.1
    assert remaining == list(range(14, -1, -1))
    status, body, headers = service.answer("app", request, None)
    assert status == 429 and body["error"]["code"] == "RateLimiting"
    assert headers["x-ms-user-quota-remaining"] == "0"
    assert headers["x-ms-user-quota-resets-after"] == "00:00:04"
    assert service.answer("another-user", request, None)[0] == 200  # per user
    clock.now += 3.6
    assert service.answer("app", request, None)[0] == 200  # a new window


def test_over_http_a_refused_query_is_azures_400_and_a_configuration_error() -> None:
    sim = Simulator(time_scale=60.0)
    sim.add_vm("solo")
    server = SimulatorServer(sim).start()
    try:
        credential = SimulatorCredential(server)
        token = credential.get_token(f"{server.arm_url}/.default").token
        answer = requests.post(
            f"{server.arm_url}/providers/Microsoft.ResourceGraph/resources",
            params={"api-version": "2024-04-01"},
            json={"query": OLD_FACTS_QUERY},
            headers={"Authorization": f"Bearer {token}"},
            timeout=5,
        )
        assert answer.status_code == 400
        error = answer.json()["error"]
        assert error["code"] == "BadRequest"
        assert error["message"].startswith("Please provide below info when asking for support")
        assert error["details"][0] == {"code": "InvalidQuery", "message": INVALID_QUERY}
        assert error["details"][1]["code"] == "CrossTableUnionNotSupported"
        assert int(answer.headers["x-ms-user-quota-remaining"]) == 14

        resolver = ResourceGraphResolver(requests.Session(), credential, server.arm_url)
        with pytest.raises(ResourceGraphRefused, match="CrossTableUnionNotSupported"):
            resolver.graph.query(OLD_FACTS_QUERY)
        assert server.arm.graph.refused == ["CrossTableUnionNotSupported"] * 2
    finally:
        server.stop()
