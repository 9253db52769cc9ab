"""Managed Run Command through Azure Resource Manager: one PUT per VM, GET until the
script ends, DELETE when the relay is removed.

Shapes and api-version: Azure/azure-rest-api-specs, specification/compute/resource-manager/
Microsoft.Compute/ComputeRP/stable/2024-11-01/runCommand.json @ 05b997f6 (operations
VirtualMachineRunCommands_CreateOrUpdate / _GetByVirtualMachine / _Delete and
VirtualMachineScaleSetVMRunCommands_CreateOrUpdate / _Get / _Delete; body
VirtualMachineRunCommand: `location` (required, Resource) and `properties` =
VirtualMachineRunCommandProperties; `instanceView.executionState` one of Unknown, Pending,
Running, Failed, Succeeded, TimedOut, Canceled). Paths:

- a standalone VM or a Flexible scale set's member (a Microsoft.Compute/virtualMachines
  resource): `.../virtualMachines/{vmName}/runCommands/{runCommandName}`;
- a Uniform scale set's instance: `.../virtualMachineScaleSets/{vmScaleSetName}/
  virtualMachines/{instanceId}/runCommands/{runCommandName}`.

Every request has a deadline (REQUEST_TIMEOUT_SECONDS); 429 and 5xx are retried after
ARM's Retry-After, a bounded number of times; any other 4xx is ARM's refusal, with its
code and message.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import requests

from functions.approvers.arm import TokenCredential, retry_after, scope_for
from functions.identity.resource_graph import azure_error

API_VERSION = "2024-11-01"
REQUEST_TIMEOUT_SECONDS = 30.0
RETRIES = 5  # 429 / 5xx / no answer, each after Retry-After (or RETRY_WAIT)
RETRY_WAIT = 5.0
MAX_RETRY_WAIT = 60.0
TERMINAL = frozenset({"Succeeded", "Failed", "TimedOut", "Canceled"})


class ArmError(Exception):
    """ARM refused, or did not answer within the retries: `status` and `code` are ARM's."""

    def __init__(self, text: str, status: int | None = None, code: str = "") -> None:
        super().__init__(text)
        self.status, self.code = status, code


@dataclass(frozen=True)
class Execution:
    """A run command's instance view: where its script is and what it said."""

    state: str  # executionState, or "Unknown"
    exit_code: int | None
    output: str
    error: str
    message: str

    @property
    def done(self) -> bool:
        return self.state in TERMINAL

    @property
    def succeeded(self) -> bool:
        return self.state == "Succeeded" and self.exit_code in (0, None)


class RunCommands:
    """The ARM client for managed Run Command (requests + an azure-identity credential)."""

    def __init__(
        self,
        session: requests.Session,
        credential: TokenCredential,
        endpoint: str = "https://management.azure.com",
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.session = session
        self.credential = credential
        self.endpoint = endpoint.rstrip("/")
        self.sleep = sleep

    def url(self, vm_path: str, name: str) -> str:
        """`vm_path` is the VM's ARM id (a VM, or a Uniform set's instance)."""
        return f"{self.endpoint}{vm_path}/runCommands/{name}"

    def put(self, vm_path: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
        return self._call("PUT", self.url(vm_path, name), body) or {}

    def get(self, vm_path: str, name: str) -> Execution:
        data = self._call("GET", self.url(vm_path, name), None, {"$expand": "instanceView"})
        view = ((data or {}).get("properties") or {}).get("instanceView") or {}
        code = view.get("exitCode")
        return Execution(
            state=str(view.get("executionState") or "Unknown"),
            exit_code=code if isinstance(code, int) and not isinstance(code, bool) else None,
            output=str(view.get("output") or "")[-4096:],
            error=str(view.get("error") or "")[-4096:],
            message=str(view.get("executionMessage") or "")[:1000],
        )

    def delete(self, vm_path: str, name: str) -> None:
        self._call("DELETE", self.url(vm_path, name), None)

    def _call(
        self,
        method: str,
        url: str,
        body: dict[str, Any] | None,
        params: dict[str, str] | None = None,
    ) -> dict[str, Any] | None:
        last = "no answer"
        for attempt in range(RETRIES + 1):
            try:
                token = self.credential.get_token(scope_for(self.endpoint))
            except Exception as exc:  # azure-identity raises several types
                raise ArmError(f"no token for Resource Manager: {type(exc).__name__}") from None
            wait: float | None = None
            try:
                answer = self.session.request(
                    method,
                    url,
                    params={"api-version": API_VERSION, **(params or {})},
                    json=body,
                    headers={
                        "Authorization": f"Bearer {token.token}",
                        "Accept": "application/json",
                    },
                    timeout=REQUEST_TIMEOUT_SECONDS,
                    allow_redirects=False,
                )
            except requests.RequestException as exc:
                last = f"Resource Manager unreachable: {type(exc).__name__}"
            else:
                if answer.status_code == 404 and method == "DELETE":
                    return None  # already gone
                if answer.status_code < 300:
                    try:
                        return answer.json() if answer.content else None
                    except ValueError:
                        return None
                code, message = azure_error(answer)
                last = f"{method} {answer.status_code} {code}: {message}"
                if answer.status_code != 429 and answer.status_code < 500:
                    raise ArmError(last, answer.status_code, code)
                wait = retry_after(answer)
            if attempt < RETRIES:
                self.sleep(min(MAX_RETRY_WAIT, RETRY_WAIT if wait is None else wait))
        raise ArmError(f"{last} (after {RETRIES + 1} tries)")
