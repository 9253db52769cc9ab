"""The Resource Graph facts resolver against the simulator's Resource Graph over HTTP, and
against a local server answering what Resource Graph answers when things go wrong."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace
from typing import Any

import pytest
import requests

from functions.identity.facts import (
    TABLES,
    VM_TABLE,
    FactsUnavailable,
    ResourceGraphRefused,
    ResourceGraphResolver,
    StaticResolver,
    UnknownVm,
    VmFacts,
    facts_from_rows,
    normalise_vm_id,
    placement_of,
    vm_query,
)
from simulator import Simulator, SimulatorServer, instance
from simulator.arm import simulated_vm_id

NOW = datetime(2026, 11, 24, 10, 0, tzinfo=UTC)


class SimulatorCredential:
    """A TokenCredential that asks the simulator's managed-identity endpoint, as
    ManagedIdentityCredential asks IMDS; records the scopes it was asked for."""

    def __init__(self, server: SimulatorServer) -> None:
        self.server = server
        self.scopes: list[str] = []

    def get_token(self, *scopes: str, **_: Any) -> SimpleNamespace:
        self.scopes.extend(scopes)
        resource = scopes[0].removesuffix("/.default")
        answer = requests.get(
            f"{self.server.url}/metadata/identity/oauth2/token",
            params={"api-version": "2018-02-01", "resource": resource},
            headers={"Metadata": "true"},
            timeout=5,
        )
        return SimpleNamespace(token=answer.json()["access_token"])


@pytest.fixture
def server() -> Iterator[SimulatorServer]:
    sim = Simulator(time_scale=60.0)
    sim.add_vm("solo")
    sim.add_scale_set("web", 2)
    sim.add_availability_set("avset", ["db1", "db2"])
    server = SimulatorServer(sim).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def resolver(server) -> ResourceGraphResolver:
    return ResourceGraphResolver(
        requests.Session(), SimulatorCredential(server), server.arm_url, clock=lambda: NOW
    )


def test_a_standalone_vm_resolves_to_its_facts_and_own_address(resolver, server):
    facts = resolver.resolve(simulated_vm_id("solo"))
    assert facts == VmFacts(
        vm_id=simulated_vm_id("solo"),
        name="solo",
        resource_id=instance.resource_id(server.sim.describe_vm("solo")),
        subscription_id=instance.SUBSCRIPTION_ID,
        resource_group=instance.RESOURCE_GROUP.lower(),
        scale_set=None,
        availability_set=None,
        address="127.0.0.2",
        fetched_at=NOW,
        location="eastus",  # the VM's region: with the subscription, what a zone means
    )
    assert resolver.credential.scopes == [f"{server.arm_url}/.default"]


def test_uniform_instances_are_named_set_underscore_instance(resolver):
    first, second = (resolver.resolve(simulated_vm_id(f"web_{i}")) for i in (0, 1))
    assert (first.name, first.scale_set, first.address) == ("web_0", "web", "127.0.0.3")
    assert (second.name, second.scale_set, second.address) == ("web_1", "web", "127.0.0.4")
    assert first.resource_id.endswith("/virtualMachineScaleSets/web/virtualMachines/0")


def test_availability_set_members_name_their_set(resolver):
    facts = resolver.resolve(simulated_vm_id("db2"))
    assert (facts.name, facts.availability_set, facts.address) == ("db2", "avset", "127.0.0.6")


def test_an_unknown_vm_id_is_unknown(resolver):
    with pytest.raises(UnknownVm):
        resolver.resolve("01234567-89ab-cdef-0123-456789abcdef")


def test_a_vm_id_that_is_not_a_uuid_never_reaches_the_query(resolver, server):
    for bad in ("x' or 1==1 //", "", "{01234567-89ab-cdef-0123-456789abcdef}", "0" * 36):
        with pytest.raises(UnknownVm):
            resolver.resolve(bad)
    with pytest.raises(ValueError, match="not a UUID"):
        vm_query(VM_TABLE, "' | project secrets")
    assert server.arm.calls == []


def test_upper_case_vm_id_is_normalised():
    upper = simulated_vm_id("solo").upper()
    assert normalise_vm_id(upper) == simulated_vm_id("solo")
    assert f"'{simulated_vm_id('solo')}'" in vm_query(VM_TABLE, upper)


def test_another_subscription_scope_finds_nothing(server):
    resolver = ResourceGraphResolver(
        requests.Session(),
        SimulatorCredential(server),
        server.arm_url,
        subscriptions=["11111111-1111-1111-1111-111111111111"],
    )
    with pytest.raises(UnknownVm):
        resolver.resolve(simulated_vm_id("solo"))


def test_the_simulator_requires_a_bearer_token(server):
    answer = requests.post(
        f"{server.arm_url}/providers/Microsoft.ResourceGraph/resources",
        params={"api-version": "2024-04-01"},
        json={"query": vm_query(VM_TABLE, simulated_vm_id("solo"))},
        timeout=5,
    )
    assert answer.status_code == 401
    assert answer.json()["error"]["code"] == "AuthenticationFailed"


def test_throttling_and_server_errors_are_transient_with_the_wait(resolver, server):
    server.arm.fail_next(429, retry_after=3)
    with pytest.raises(FactsUnavailable, match="429") as info:
        resolver.resolve(simulated_vm_id("solo"))
    assert info.value.retry_after == 3
    server.arm.fail_next(500)
    with pytest.raises(FactsUnavailable, match="500"):
        resolver.resolve(simulated_vm_id("solo"))
    assert resolver.resolve(simulated_vm_id("solo")).name == "solo"


def test_a_token_failure_is_transient(server):
    class Broken:
        def get_token(self, *scopes: str, **_: Any) -> Any:
            raise RuntimeError("no identity")

    resolver = ResourceGraphResolver(requests.Session(), Broken(), server.arm_url)
    with pytest.raises(FactsUnavailable, match="no token"):
        resolver.resolve(simulated_vm_id("solo"))


# ---------------------------------------------------------------------- a hostile server


class _Canned(BaseHTTPRequestHandler):
    answers: list[tuple[int, dict[str, str], bytes]] = []
    seen: list[dict[str, Any]] = []

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        self.seen.append(
            {
                "path": self.path,
                "auth": self.headers.get("Authorization"),
                "body": json.loads(self.rfile.read(length)),
            }
        )
        status, headers, body = self.answers.pop(0)
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def canned() -> Iterator[tuple[str, type[_Canned]]]:
    handler = type("Handler", (_Canned,), {"answers": [], "seen": []})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", handler
    finally:
        httpd.shutdown()
        httpd.server_close()


class FixedCredential:
    def get_token(self, *scopes: str, **_: Any) -> SimpleNamespace:
        return SimpleNamespace(token="t0ken")


VM = "01234567-89ab-cdef-0123-456789abcdef"
ROW = {
    "id": "/subscriptions/aaaaaaaa-0000-0000-0000-000000000000/resourceGroups/RG/providers/"
    "Microsoft.Compute/virtualMachines/vm1",
    "subscriptionId": "aaaaaaaa-0000-0000-0000-000000000000",
    "resourceGroup": "rg",
    "vmId": VM,
    "scaleSetId": "",
    "availabilitySetId": "",
    "nicId": "/subscriptions/x/resourceGroups/rg/providers/Microsoft.Network/networkInterfaces/n1",
    "nicPrimary": "true",
    "ipConfigurations": [
        {"properties": {"primary": True, "privateIPAddress": "10.0.0.4"}},
    ],
}


def ipc(address: str, primary: bool) -> dict[str, Any]:
    """An ipConfigurations item as NetworkInterfaceGet.json (azure-rest-api-specs) has it."""
    version = "IPv6" if ":" in address else "IPv4"
    return {
        "name": "ipconfig",
        "properties": {
            "primary": primary,
            "privateIPAddress": address,
            "privateIPAddressVersion": version,
        },
    }


def rg_answer(rows: list[dict[str, Any]]) -> bytes:
    return json.dumps(
        {"totalRecords": len(rows), "count": len(rows), "data": rows, "facets": []}
    ).encode()


def test_the_request_is_resource_graphs(canned):
    url, handler = canned
    handler.answers.append((200, {}, rg_answer([ROW])))
    resolver = ResourceGraphResolver(
        requests.Session(), FixedCredential(), url, subscriptions=[ROW["subscriptionId"]]
    )
    facts = resolver.resolve(VM)
    assert (facts.name, facts.address, facts.resource_group) == ("vm1", "10.0.0.4", "rg")
    seen = handler.seen[0]
    assert seen["path"] == "/providers/Microsoft.ResourceGraph/resources?api-version=2024-04-01"
    assert seen["auth"] == "Bearer t0ken"
    assert seen["body"]["subscriptions"] == [ROW["subscriptionId"]]
    assert f"'{VM}'" in seen["body"]["query"]


@pytest.mark.parametrize(
    ("status", "headers", "body", "match", "wait"),
    [
        (
            429,
            {"x-ms-user-quota-remaining": "0", "x-ms-user-quota-resets-after": "00:00:04"},
            b'{"error": {"code": "RateLimiting"}}',
            "429 RateLimiting",
            4.0,
        ),
        (429, {"Retry-After": "7"}, b"", "429", 7.0),
        (500, {}, b"<html>oops</html>", "500", None),
        (302, {"Location": "http://169.254.169.254/"}, b"", "302", None),
        (200, {}, b"not json", "not understood", None),
        (200, {}, b'{"data": "rows"}', "not understood", None),
        (200, {}, b'{"data": [1, 2]}', "not understood", None),
        (200, {}, b'{"nodata": []}', "not understood", None),
    ],
)
def test_bad_answers_are_transient(canned, status, headers, body, match, wait):
    url, handler = canned
    handler.answers.append((status, headers, body))
    resolver = ResourceGraphResolver(requests.Session(), FixedCredential(), url)
    with pytest.raises(FactsUnavailable, match=match) as info:
        resolver.resolve(VM)
    assert info.value.retry_after == wait


def test_an_empty_answer_from_both_tables_is_an_unknown_vm(canned):
    url, handler = canned
    handler.answers.extend([(200, {}, rg_answer([])), (200, {}, rg_answer([]))])
    with pytest.raises(UnknownVm):
        ResourceGraphResolver(requests.Session(), FixedCredential(), url).resolve(VM)
    queries = [seen["body"]["query"] for seen in handler.seen]
    assert [q.split("\n", 1)[0] for q in queries] == list(TABLES)
    assert all(seen["body"]["options"]["$top"] == 1000 for seen in handler.seen)


# Azure's answer to an invalid query, as recorded by Azure/azure-powershell
# (src/ResourceGraph/ResourceGraph.Test/ScenarioTests/ResourceGraphQueryTests.ps1 @ d89a87d2).
INVALID_QUERY_ANSWER = {
    "error": {
        "code": "BadRequest",
        "message": "Please provide below info when asking for support: timestamp = "
        "2021-03-25T17:28:36.4413187Z, correlationId = 2f0c3f5c-0bd3-4b6a-9f1c-7a0a0f6e43b1.",
        "details": [
            {
                "code": "InvalidQuery",
                "message": "Query is invalid. Please refer to the documentation for the Azure "
                "Resource Graph service and fix the error before retrying.",
            },
            {
                "code": "ParserFailure",
                "message": "ParserFailure",
                "line": 1,
                "characterPositionInLine": 11,
                "token": "<EOF>",
            },
        ],
    }
}


@pytest.mark.parametrize(
    ("status", "body", "code", "words"),
    [
        (400, INVALID_QUERY_ANSWER, "BadRequest", "InvalidQuery: Query is invalid"),
        (
            403,
            {"error": {"code": "AuthorizationFailed", "message": "no read on scope"}},
            "AuthorizationFailed",
            "no read on scope",
        ),
        (404, {}, "HTTP 404", ""),
    ],
)
def test_a_4xx_other_than_429_is_a_configuration_error_with_azures_words(
    canned, status, body, code, words
):
    url, handler = canned
    handler.answers.append((status, {}, json.dumps(body).encode()))
    with pytest.raises(ResourceGraphRefused) as info:
        ResourceGraphResolver(requests.Session(), FixedCredential(), url).resolve(VM)
    assert (info.value.status, info.value.code) == (status, code)
    assert words in info.value.message
    assert info.value.retry_after == 900  # never retried as if it were a slow service
    assert isinstance(info.value, FactsUnavailable)  # a known VM keeps its stored facts
    assert len(handler.seen) == 1  # the second table is not asked after a refusal


def test_the_table_result_format_is_understood(canned):
    url, handler = canned
    names = list(ROW)
    table = {
        "columns": [{"name": n, "type": "string"} for n in names],
        "rows": [list(ROW.values())],
    }
    handler.answers.append((200, {}, json.dumps({"data": table}).encode()))
    assert ResourceGraphResolver(requests.Session(), FixedCredential(), url).resolve(VM).name == (
        "vm1"
    )


# ---------------------------------------------------------------------- rows -> facts


def test_the_primary_nic_and_ipconfig_win():
    rows = [
        {**ROW, "nicId": "b", "nicPrimary": "false", "ipConfigurations": [ipc("10.0.1.9", True)]},
        {
            **ROW,
            "nicId": "a",
            "nicPrimary": "true",
            "ipConfigurations": [
                ipc("10.0.0.9", False),
                ipc("10.0.0.16/28", True),  # a prefix (NetworkInterfaceGet.json): no address
                ipc("10.0.0.5", True),
                ipc("fd00::1", False),
            ],
        },
    ]
    assert facts_from_rows(VM, rows, NOW).address == "10.0.0.5"


def test_a_vm_without_a_nic_row_has_no_address():
    row = {**ROW, "nicId": None, "ipConfigurations": None, "nicPrimary": None}
    assert facts_from_rows(VM, [row], NOW).address is None
    junk = {**ROW, "ipConfigurations": [1, {"properties": "x"}, {"properties": {}}]}
    assert facts_from_rows(VM, [junk], NOW).address is None


def test_a_flexible_member_names_its_scale_set():
    row = {
        **ROW,
        "scaleSetId": "/subscriptions/a/resourceGroups/rg/providers/Microsoft.Compute/"
        "virtualMachineScaleSets/flex",
    }
    facts = facts_from_rows(VM, [row], NOW)
    assert (facts.name, facts.scale_set) == ("vm1", "flex")


def test_rows_for_another_vm_or_two_resources_are_not_trusted():
    with pytest.raises(UnknownVm):
        facts_from_rows(VM, [{**ROW, "vmId": "ffffffff-89ab-cdef-0123-456789abcdef"}], NOW)
    twin = {**ROW, "id": ROW["id"].replace("vm1", "vm2")}
    with pytest.raises(FactsUnavailable, match="2 resources"):
        facts_from_rows(VM, [ROW, twin], NOW)
    with pytest.raises(FactsUnavailable, match="unexpected resource id"):
        facts_from_rows(VM, [{**ROW, "id": "/something/else"}], NOW)


def test_static_resolver():
    facts = facts_from_rows(VM, [ROW], NOW)
    resolver = StaticResolver([facts])
    assert resolver.resolve(VM.upper()) == facts
    with pytest.raises(UnknownVm):
        resolver.resolve("ffffffff-89ab-cdef-0123-456789abcdef")
    with pytest.raises(UnknownVm):
        resolver.resolve("junk")


# ---------------------------------------------------------------------- tags and zones


def test_tags_and_the_zone_come_from_the_row_as_azure_shapes_them():
    """`tags` an object and `zones` an array of one, as the VM and scale-set VM resources
    have them (azure-rest-api-specs compute 2024-07-01 VirtualMachine_List_MaximumSet_Gen
    @ 19c6a456, VirtualMachineScaleSetVM_List_MaximumSet_Gen @ 49183a62)."""
    row = {**ROW, "tags": {"service": "checkout", "Tier": "web"}, "zones": ["2"]}
    facts = facts_from_rows(VM, [row], NOW)
    assert facts.tags == {"Tier": "web", "service": "checkout"} and facts.zone == "2"
    assert placement_of(facts).tags == facts.tags and placement_of(facts).zone == "2"
    bare = facts_from_rows(VM, [ROW], NOW)  # a row without the columns: no tags, no zone
    assert bare.tags == {} and bare.zone is None


@pytest.mark.parametrize("zones", [None, [], ["1", "2"], "1", [None], [""]])
def test_anything_but_one_zone_is_no_zone(zones):
    assert facts_from_rows(VM, [{**ROW, "zones": zones}], NOW).zone is None


def test_tags_are_bounded_and_what_is_left_out_is_counted():
    many = {f"{i:03d}" + "n" * 508: "v" * 256 for i in range(50)}
    many["odd"] = {"not": "a string"}
    facts = facts_from_rows(VM, [{**ROW, "tags": many}], NOW)
    assert facts.tags_dropped > 1 and len(facts.tags) + facts.tags_dropped == 51
    assert len(facts.model_dump_json()) < 30_000  # one Table property, as stored
    assert facts_from_rows(VM, [{**ROW, "tags": "service=x"}], NOW).tags == {}
