"""A recorder of Azure Resource Manager for the rollout command: a real HTTP server on
loopback that checks what ARM would check, records every request, and runs each run
command's script through a test-given `execute` (a fake relay, or a real install into a
temporary root).

Checked against Azure/azure-rest-api-specs, specification/compute/resource-manager/
Microsoft.Compute/ComputeRP/stable/2024-11-01/runCommand.json @ 05b997f6 (see
tests/conformance/SOURCES.md): the two PUT/GET/DELETE paths (VirtualMachineRunCommands_*,
VirtualMachineScaleSetVMRunCommands_*), `api-version` 2024-11-01, the body
(`VirtualMachineRunCommand`: `location` required; `properties` only
VirtualMachineRunCommandProperties' writable names with their types; `source` one of
`script`, `scriptUri`, `commandId`; each parameter a RunCommandInputParameter with string
`name` and `value`), answers 201 then `instanceView.executionState` as the spec lists.
Resource Graph: `POST /providers/Microsoft.ResourceGraph/resources?api-version=2024-04-01`
(resourcegraph.json @ 423203f7, as functions/identity/resource_graph.py cites it), rows of
the one table the query names, filtered by the query's scope the way its KQL says.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

API_VERSION = "2024-11-01"
GRAPH_API_VERSION = "2024-04-01"
# VirtualMachineRunCommandProperties (runCommand.json @ 05b997f6): writable names, types.
PROPERTIES: dict[str, type | tuple[type, ...]] = {
    "source": dict,
    "parameters": list,
    "protectedParameters": list,
    "asyncExecution": bool,
    "runAsUser": str,
    "runAsPassword": str,
    "timeoutInSeconds": int,
    "outputBlobUri": str,
    "errorBlobUri": str,
    "outputBlobManagedIdentity": dict,
    "errorBlobManagedIdentity": dict,
    "treatFailureAsDeploymentFailure": bool,
}
READ_ONLY = ("provisioningState", "instanceView")
SOURCES = ("script", "scriptUri", "commandId")
SOURCE_NAMES = (*SOURCES, "scriptUriManagedIdentity")
STATES = ("Unknown", "Pending", "Running", "Failed", "Succeeded", "TimedOut", "Canceled")
_VM = re.compile(
    r"^(?P<vm>/subscriptions/[^/]+/resourceGroups/[^/]+/providers/Microsoft\.Compute/"
    r"(?:virtualMachines/[^/]+|virtualMachineScaleSets/[^/]+/virtualMachines/[^/]+))"
    r"/runCommands/(?P<name>[^/]+)$"
)


def check_body(body: Any) -> str | None:
    """Why ARM would refuse this VirtualMachineRunCommand, or None."""
    if not isinstance(body, dict) or not isinstance(body.get("location"), str):
        return "location is required (Resource)"
    extra = set(body) - {"location", "properties", "tags"}
    if extra:
        return f"unknown top-level properties {sorted(extra)}"
    props = body.get("properties")
    if not isinstance(props, dict):
        return "properties must be an object"
    for name, value in props.items():
        if name in READ_ONLY:
            return f"{name} is read-only"
        if name not in PROPERTIES:
            return f"unknown property {name}"
        kind = PROPERTIES[name]
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            return f"{name} has the wrong type"
    source = props.get("source") or {}
    if set(source) - set(SOURCE_NAMES):
        return f"unknown source properties {sorted(set(source) - set(SOURCE_NAMES))}"
    if sum(1 for k in SOURCES if source.get(k)) != 1:
        return "source: use only one of script, scriptUri, commandId"
    for key in ("parameters", "protectedParameters"):
        for item in props.get(key) or []:
            if not (
                isinstance(item, dict)
                and set(item) == {"name", "value"}
                and all(isinstance(item[k], str) for k in ("name", "value"))
            ):
                return f"{key}: each item is RunCommandInputParameter {{name, value}} (strings)"
    return None


@dataclass
class Vm:
    """One VM of the recorded fleet, as Resource Graph lists it."""

    id: str
    vm_id: str
    location: str = "westeurope"
    scale_set_id: str = ""  # a Flexible member's set
    os_type: str = "Linux"
    tags: dict[str, str] = field(default_factory=dict)
    zones: list[str] = field(default_factory=list)

    @property
    def table(self) -> str:
        return "computeresources" if "/virtualMachineScaleSets/" in self.id else "resources"

    def row(self) -> dict[str, Any]:
        parts = self.id.split("/")
        # A Uniform instance's name is {set}_{instanceId} (VirtualMachineScaleSetVM).
        name = f"{parts[-3]}_{parts[-1]}" if self.table == "computeresources" else parts[-1]
        return {
            "id": self.id,
            "name": name,
            "location": self.location,
            "subscriptionId": self.id.split("/")[2],
            "resourceGroup": self.id.split("/")[4],
            "tags": self.tags,
            "zones": self.zones,
            "vmId": self.vm_id,
            "scaleSetId": self.scale_set_id.lower(),
        }


Execute = Callable[[Vm, str, dict[str, str], list[str]], tuple[int, str, str]]


class Recorder:
    """The server's state: the fleet, what was asked (in order) and each run command."""

    def __init__(self, fleet: list[Vm], execute: Execute) -> None:
        self.fleet = {vm.id.lower(): vm for vm in fleet}
        self.execute = execute
        self.requests: list[tuple[str, str, Any]] = []  # (method, path, body)
        self.refusals: list[str] = []
        self.commands: dict[str, dict[str, Any]] = {}  # run command path -> resource
        self.lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> Recorder:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def puts(self) -> list[tuple[str, dict[str, Any]]]:
        return [(p, b) for m, p, b in self.requests if m == "PUT"]

    def graph(self, body: Any) -> tuple[int, Any]:
        query = body.get("query") if isinstance(body, dict) else None
        if not isinstance(query, str) or set(body) - {"query", "subscriptions", "options"}:
            return 400, {"error": {"code": "BadRequest", "message": "QueryRequest"}}
        table = query.split("\n", 1)[0].strip()
        scope = re.search(r"key == '([^']*)'", query)
        if table not in ("resources", "computeresources") or scope is None:
            return 400, {"error": {"code": "InvalidQuery", "message": query[:80]}}
        prefix = scope[1]
        rows = [
            vm.row()
            for key, vm in sorted(self.fleet.items())
            if vm.table == table
            and vm.os_type != "Windows"
            and (key == prefix or key.startswith(prefix + "/") or vm.scale_set_id.lower() == prefix)
        ]
        return 200, {"totalRecords": len(rows), "count": len(rows), "data": rows}

    def run_command(self, method: str, path: str, query: dict, body: Any) -> tuple[int, Any]:
        match = _VM.match(path)
        if match is None:
            return 404, {"error": {"code": "InvalidResourceType", "message": path}}
        if query.get("api-version") != [API_VERSION]:
            return 400, {"error": {"code": "InvalidApiVersionParameter", "message": str(query)}}
        vm = self.fleet.get(match["vm"].lower())
        if vm is None:
            return 404, {"error": {"code": "ResourceNotFound", "message": match["vm"]}}
        key = path.lower()
        if method == "DELETE":
            with self.lock:
                gone = self.commands.pop(key, None)
            return (200 if gone else 204), None
        if method == "GET":
            resource = self.commands.get(key)
            if resource is None:
                return 404, {"error": {"code": "NotFound", "message": path}}
            return 200, resource
        why = check_body(body)
        if why:
            self.refusals.append(why)
            return 400, {"error": {"code": "InvalidParameter", "message": why}}
        props = body["properties"]
        env = {p["name"]: p["value"] for p in props.get("parameters", []) if p["name"]}
        args = [p["value"] for p in props.get("parameters", []) if not p["name"]]
        code, out, err = self.execute(vm, props["source"]["script"], env, args)
        state = "Succeeded" if code == 0 else "Failed"
        resource = {
            "id": path,
            "name": match["name"],
            "type": "Microsoft.Compute/virtualMachines/runCommands",
            "location": body["location"],
            "properties": {
                **{k: v for k, v in props.items() if k != "source"},
                "source": {"script": "(script)"},
                "provisioningState": state,
                "instanceView": {
                    "executionState": state,
                    "exitCode": code,
                    "output": out[-4096:],
                    "error": err[-4096:],
                },
            },
        }
        with self.lock:
            self.commands[key] = resource
        return 201, {
            **resource,
            "properties": {**resource["properties"], "provisioningState": "Creating"},
        }


def _handler(recorder: Recorder) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def _serve(self) -> None:
            parts = urlsplit(self.path)
            query = parse_qs(parts.query)
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            body = json.loads(raw) if raw else None
            with recorder.lock:
                recorder.requests.append((self.command, parts.path, body))
            if not (self.headers.get("Authorization") or "").startswith("Bearer "):
                status, answer = 401, {"error": {"code": "AuthenticationFailed", "message": ""}}
            elif parts.path == "/providers/Microsoft.ResourceGraph/resources":
                if self.command != "POST" or query.get("api-version") != [GRAPH_API_VERSION]:
                    status, answer = 400, {"error": {"code": "BadRequest", "message": ""}}
                else:
                    status, answer = recorder.graph(body)
            else:
                status, answer = recorder.run_command(self.command, parts.path, query, body)
            data = json.dumps(answer).encode() if answer is not None else b""
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_PUT = do_POST = do_DELETE = _serve

    return Handler
