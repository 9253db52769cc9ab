"""The ARM approver: `acknowledge` a Scheduled Event through Azure Resource Manager.

`POST {ARM}/subscriptions/{sub}/resourcegroups/{rg}/providers/Microsoft.Compute/{type}/
{name}/providers/Microsoft.Maintenance/scheduledevents/{EventId}/acknowledge` with the
function app's managed identity approves the event for every VM in its Resources, like the
IMDS POST a relay makes, but with no inbound path to any VM. The owner is the VM, scale set
or availability set that opted in (Event Grid's subject, or the relay's compute metadata).

What Azure really answers (azure-powershell's recorded sessions against live Azure, copied
in tests/conformance/samples/, SOURCES.md there): 200 `{"value": "Successfully approved
scheduled event"}`; an unknown event is 404 `{"Error": {"Code": "InvalidScheduledEventId",
"Message"}}`, so keys are read case-insensitively. The app makes only this one-event call:
the list form (ScheduledEvents_AcknowledgeList, `POST {owner}/providers/
Microsoft.Maintenance/scheduledevents`) is not used, and its 207 MultiStatus, which the spec
does not give the one-event call, is never taken for an approval.

Like the relay approver this module only speaks the protocol and classifies the answer:
approved (2xx but 207), refused (4xx, or a 207: ARM's code and message are kept for the
audit), or retry (429, 5xx, network, token trouble), with the `Retry-After` ARM sent. The
retry loop, its deadline and the choice of approver are functions.pipeline.approve's.
"""

from __future__ import annotations

import email.utils
from datetime import UTC, datetime
from typing import Any, Literal, Protocol

import requests
from pydantic import BaseModel

from functions.model.arm import ArmResource

REQUEST_TIMEOUT_SECONDS = 15.0

Verdict = Literal["approved", "refused", "retry"]
MULTI_STATUS = 207  # the list form's answer when some event failed: never an approval


class TokenCredential(Protocol):
    """What azure-identity's credentials offer (ManagedIdentityCredential and friends)."""

    def get_token(self, *scopes: str, **kwargs: Any) -> Any: ...


class ArmAnswer(BaseModel):
    """One ARM answer, classified."""

    verdict: Verdict
    status: int | None = None
    code: str = ""  # ARM's error code (Error.Code / error.code)
    text: str  # for the audit: what happened, with ARM's message
    retry_after: float | None = None  # seconds, from ARM's Retry-After


def acknowledge_url(endpoint: str, owner: ArmResource, event_id: str) -> str:
    return (
        f"{endpoint.rstrip('/')}/subscriptions/{owner.subscription_id}/resourcegroups/"
        f"{owner.resource_group}/providers/Microsoft.Compute/{owner.resource_type}/"
        f"{owner.name}/providers/Microsoft.Maintenance/scheduledevents/{event_id}/acknowledge"
    )


def scope_for(endpoint: str) -> str:
    """The token scope of an ARM endpoint (public cloud: https://management.azure.com/.default;
    sovereign clouds have their own, e.g. https://management.usgovcloudapi.net/.default)."""
    return f"{endpoint.rstrip('/')}/.default"


def acknowledge(
    owner: ArmResource,
    event_id: str,
    *,
    credential: TokenCredential,
    session: requests.Session,
    endpoint: str,
    api_version: str,
    remaining: float,
) -> ArmAnswer:
    """One acknowledge call; `remaining` bounds the request timeout by the deadline.
    Never raises: every failure is an answer the caller can record."""
    url = acknowledge_url(endpoint, owner, event_id)
    try:
        token = credential.get_token(scope_for(endpoint))
    except Exception as exc:  # azure-identity raises several types; none may escape
        return ArmAnswer(
            verdict="retry", text=f"no token for {scope_for(endpoint)}: {type(exc).__name__}"
        )
    try:
        response = session.post(
            url,
            params={"api-version": api_version},
            headers={
                "Authorization": f"Bearer {token.token}",
                "Accept": "application/json",
            },
            timeout=max(0.1, min(REQUEST_TIMEOUT_SECONDS, remaining)),
        )
    except requests.RequestException as exc:
        return ArmAnswer(verdict="retry", text=f"ARM unreachable: {type(exc).__name__}")
    status = response.status_code
    code, message = _error(response)
    if 200 <= status < 300 and status != MULTI_STATUS:
        return ArmAnswer(verdict="approved", status=status, text=_value(response) or "approved")
    if status == 429 or status >= 500 or status == 408:
        return ArmAnswer(
            verdict="retry",
            status=status,
            code=code,
            text=f"ARM {status} {code}: {message}".strip(),
            retry_after=retry_after(response),
        )
    where = f"{owner.resource_type}/{owner.name}"
    return ArmAnswer(
        verdict="refused",
        status=status,
        code=code,
        text=f"ARM refused {status} {code} on {where}: {message}"[:1000],
    )


def _get(data: object, key: str) -> Any:
    """`data[key]` with the key in any case (Azure answers `error` and `Error`, `code` and
    `Code`); None if `data` is not an object or has no such key."""
    if not isinstance(data, dict):
        return None
    if key in data:
        return data[key]
    folded = key.casefold()
    return next((v for k, v in data.items() if isinstance(k, str) and k.casefold() == folded), None)


def _json(response: requests.Response) -> object:
    try:
        return response.json()
    except ValueError:
        return None


def _error(response: requests.Response) -> tuple[str, str]:
    """ARM's code and message, keys in any case: `{"error": {"code", "message"}}`,
    `{"Error": {"Code", "Message"}}` (the Maintenance provider's 404), or a body that
    carries the code itself."""
    data = _json(response)
    if data is None:
        return "", response.text[:300]
    error = _get(data, "error")
    if not isinstance(error, dict) and _get(data, "code") is not None:
        error = data
    if isinstance(error, dict):
        code, message = _get(error, "code"), _get(error, "message")
        return str(code or ""), str(message or "")[:600]
    return "", ""


def _value(response: requests.Response) -> str:
    return str(_get(_json(response), "value") or "")


def retry_after(response: requests.Response) -> float | None:
    """Seconds from `Retry-After` (delta seconds or an HTTP date); None if absent or bad."""
    value = response.headers.get("Retry-After")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        moment = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return max(0.0, (moment - datetime.now(UTC)).total_seconds())


def default_credential() -> TokenCredential:
    """The function app's managed identity (DefaultAzureCredential, as for the Table store:
    managed identity in Azure, a developer login or AZURE_* variables elsewhere)."""
    from azure.identity import DefaultAzureCredential

    return DefaultAzureCredential()
