"""The ARM approver: `acknowledge` a Scheduled Event through Azure Resource Manager.

`POST {ARM}/subscriptions/{sub}/resourcegroups/{rg}/providers/Microsoft.Compute/{type}/
{name}/providers/Microsoft.Maintenance/scheduledevents/{EventId}/acknowledge` with the
function app's managed identity approves the event for every VM in its Resources, like the
IMDS POST a relay makes, but with no inbound path to any VM. The owner is the VM, scale set
or availability set that opted in (Event Grid's subject, or the relay's compute metadata).

`acknowledge_list` is the list form, one call for several events of one owner (`POST
{owner}/providers/Microsoft.Maintenance/scheduledevents` with `{"value": [EventId, ...]}`:
ScheduledEvents_AcknowledgeList in azure-rest-api-specs Microsoft.Maintenance stable
2025-11-01 Maintenance.json @ bb074ee7, example ScheduledEvents_AcknowledgeList.json; the
CLI's `az maintenance scheduledevents list acknowledge` is GA). Its error names each failing
event in `details[].target`.

Like the relay approver this module only speaks the protocol and classifies the answer:
approved (2xx), refused (4xx: ARM's `error.code` and `message` are kept for the audit) or
retry (429, 5xx, network, token trouble), with the `Retry-After` ARM sent. The retry loop,
its deadline and the choice of approver are functions.pipeline.approve's.
"""

from __future__ import annotations

import email.utils
import logging
from datetime import UTC, datetime
from typing import Literal, Protocol

import requests
from pydantic import BaseModel, Field

from functions.model.arm import ArmResource

log = logging.getLogger(__name__)

ACKNOWLEDGE_ACTION = "Microsoft.Maintenance/scheduledevents/acknowledge/action"
REQUEST_TIMEOUT_SECONDS = 15.0
TOKEN_REFRESH_SECONDS = 300  # a token this close to expiry is not sent

Verdict = Literal["approved", "refused", "retry"]


class TokenCredential(Protocol):
    """What azure-identity's credentials offer (ManagedIdentityCredential and friends)."""

    def get_token(self, *scopes: str, **kwargs: object) -> object: ...


class ArmAnswer(BaseModel):
    verdict: Verdict
    status: int | None = None
    code: str = ""  # ARM's error.code
    text: str  # for the audit: what happened, with ARM's message
    retry_after: float | None = None  # seconds, from ARM's Retry-After
    # The list form's error: EventId -> "code: message" for each event ARM named.
    refused: dict[str, str] = Field(default_factory=dict)


def acknowledge_url(endpoint: str, owner: ArmResource, event_id: str) -> str:
    return (
        f"{endpoint.rstrip('/')}/subscriptions/{owner.subscription_id}/resourcegroups/"
        f"{owner.resource_group}/providers/Microsoft.Compute/{owner.resource_type}/"
        f"{owner.name}/providers/Microsoft.Maintenance/scheduledevents/{event_id}/acknowledge"
    )


def list_acknowledge_url(endpoint: str, owner: ArmResource) -> str:
    return (
        f"{endpoint.rstrip('/')}/subscriptions/{owner.subscription_id}/resourcegroups/"
        f"{owner.resource_group}/providers/Microsoft.Compute/{owner.resource_type}/"
        f"{owner.name}/providers/Microsoft.Maintenance/scheduledevents"
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
    return _post(owner, url, None, credential, session, endpoint, api_version, remaining)


def acknowledge_list(
    owner: ArmResource,
    event_ids: list[str],
    *,
    credential: TokenCredential,
    session: requests.Session,
    endpoint: str,
    api_version: str,
    remaining: float,
) -> ArmAnswer:
    """One list-acknowledge call for several events of `owner` (the spec's
    ScheduledEvents_AcknowledgeList). Approved means all of them; on an error, `refused`
    holds the events ARM named in `details` (the others' fate is ARM's word for the whole
    request). Never raises."""
    if not event_ids:
        raise ValueError("acknowledge_list needs at least one EventId")
    url = list_acknowledge_url(endpoint, owner)
    body = {"value": list(event_ids)}
    return _post(owner, url, body, credential, session, endpoint, api_version, remaining)


def _post(
    owner: ArmResource,
    url: str,
    body: dict[str, list[str]] | None,
    credential: TokenCredential,
    session: requests.Session,
    endpoint: str,
    api_version: str,
    remaining: float,
) -> ArmAnswer:
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
                "Authorization": f"Bearer {token.token}",  # type: ignore[attr-defined]
                "Accept": "application/json",
            },
            json=body,
            timeout=max(0.1, min(REQUEST_TIMEOUT_SECONDS, remaining)),
        )
    except requests.RequestException as exc:
        return ArmAnswer(verdict="retry", text=f"ARM unreachable: {type(exc).__name__}")
    status = response.status_code
    code, message = _error(response)
    if 200 <= status < 300:
        return ArmAnswer(verdict="approved", status=status, text=_value(response) or "approved")
    where = f"{owner.resource_type}/{owner.name}"
    if status == 429 or status >= 500 or status == 408:
        return ArmAnswer(
            verdict="retry",
            status=status,
            code=code,
            text=f"ARM {status} {code}: {message}".strip(),
            retry_after=retry_after(response),
        )
    return ArmAnswer(
        verdict="refused",
        status=status,
        code=code,
        text=f"ARM refused {status} {code} on {where}: {message}"[:1000],
        refused=_details(response),
    )


def _details(response: requests.Response) -> dict[str, str]:
    """The list form's error details: {"error": {"details": [{"target", "code", "message"}]}}."""
    try:
        data = response.json()
    except ValueError:
        return {}
    error = data.get("error") if isinstance(data, dict) else None
    details = error.get("details") if isinstance(error, dict) else None
    found: dict[str, str] = {}
    for item in details if isinstance(details, list) else []:
        if isinstance(item, dict) and isinstance(item.get("target"), str):
            found[item["target"]] = f"{item.get('code') or ''}: {item.get('message') or ''}"[:300]
    return found


def _error(response: requests.Response) -> tuple[str, str]:
    """ARM's error body: {"error": {"code": ..., "message": ...}}."""
    try:
        data = response.json()
    except ValueError:
        return "", response.text[:300]
    error = data.get("error") if isinstance(data, dict) else None
    if isinstance(error, dict):
        return str(error.get("code") or ""), str(error.get("message") or "")[:600]
    return "", ""


def _value(response: requests.Response) -> str:
    try:
        data = response.json()
    except ValueError:
        return ""
    return str(data.get("value") or "") if isinstance(data, dict) else ""


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
