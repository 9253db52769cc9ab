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

What Azure really answers (azure-powershell's recorded sessions against live Azure, copied
in tests/conformance/samples/, SOURCES.md there): 200 `{"value": "Successfully approved
scheduled event"}` (one) and `{"value": "Successfully approved all Scheduled Events in the
list"}` (list); a list with events it cannot approve answers **207** MultiStatus, one
result per event, in either of two shapes: `{"error": {"code": "MultiStatusResponse",
"message", "details": [{"target", "code", "message"}]}}` or `{"Response": {"Code",
"Message"}, "Details": [{"Code", "Message"}]}` (no target: the details follow the
request's ids, as azure-powershell's ScheduledEventListApproveMethod.cs reads them); an
unknown event on the one-event call is 404 `{"Error": {"Code": "InvalidScheduledEventId",
"Message"}}`. Keys are therefore read case-insensitively.

Like the relay approver this module only speaks the protocol and classifies the answer:
approved (2xx but 207), refused (4xx: ARM's code and message are kept for the audit), a 207
read per event (`approved` and `refused`; events it does not account for are neither), or
retry (429, 5xx, network, token trouble), with the `Retry-After` ARM sent. The retry loop,
its deadline and the choice of approver are functions.pipeline.approve's.
"""

from __future__ import annotations

import email.utils
import logging
from datetime import UTC, datetime
from typing import Any, Literal, Protocol

import requests
from pydantic import BaseModel, Field

from functions.model.arm import ArmResource

log = logging.getLogger(__name__)

ACKNOWLEDGE_ACTION = "Microsoft.Maintenance/scheduledevents/acknowledge/action"
REQUEST_TIMEOUT_SECONDS = 15.0
TOKEN_REFRESH_SECONDS = 300  # a token this close to expiry is not sent

Verdict = Literal["approved", "refused", "retry"]
MULTI_STATUS = 207  # the list form's per-event answer
APPROVED_CODE = "ok"  # a 207 detail with this code (any case) was approved


class TokenCredential(Protocol):
    """What azure-identity's credentials offer (ManagedIdentityCredential and friends)."""

    def get_token(self, *scopes: str, **kwargs: object) -> object: ...


class ArmAnswer(BaseModel):
    """One ARM answer, classified. For the list form `approved` and `refused` say what
    became of each event: a 2xx (not 207) approves them all; a 207 is "approved" only if
    every listed event's result is OK, else "refused" with `approved` naming those it did
    approve (they are approved: do not acknowledge them again) and `refused` those it did
    not; an event in neither was not accounted for (its fate is unknown: ask again)."""

    verdict: Verdict
    status: int | None = None
    code: str = ""  # ARM's error code (Error.Code / error.code / Response.Code)
    text: str  # for the audit: what happened, with ARM's message
    retry_after: float | None = None  # seconds, from ARM's Retry-After
    # EventId -> "code: message" for each event ARM named as not approved.
    refused: dict[str, str] = Field(default_factory=dict)
    # The EventIds ARM approved: all of them on a 2xx, those with an OK result on a 207.
    approved: list[str] = Field(default_factory=list)


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
    return _post(
        owner, url, None, [event_id], credential, session, endpoint, api_version, remaining
    )


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
    ScheduledEvents_AcknowledgeList). Approved means all of them; a 207 is read per event
    (ArmAnswer: `approved`, `refused`); on an error, `refused` holds the events ARM named in
    `details` (the others' fate is ARM's word for the whole request). Never raises."""
    if not event_ids:
        raise ValueError("acknowledge_list needs at least one EventId")
    url = list_acknowledge_url(endpoint, owner)
    ids = list(event_ids)
    body = {"value": ids}
    return _post(owner, url, body, ids, credential, session, endpoint, api_version, remaining)


def _post(
    owner: ArmResource,
    url: str,
    body: dict[str, list[str]] | None,
    ids: list[str],
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
    where = f"{owner.resource_type}/{owner.name}"
    if status == MULTI_STATUS:
        return _multi_status(response, ids, where, code, message)
    if 200 <= status < 300:
        return ArmAnswer(
            verdict="approved",
            status=status,
            text=_value(response) or "approved",
            approved=list(ids),
        )
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


def _multi_status(
    response: requests.Response, ids: list[str], where: str, code: str, message: str
) -> ArmAnswer:
    """A 207: one result per event. A result whose code is OK approved its event, any other
    refused it; a result without a target is the event at its index in the request (how
    azure-powershell reads Azure's `{"Response", "Details"}` shape). Approved as a whole
    only if every listed event was; else "refused", so no caller takes the others for
    approved."""
    approved: list[str] = []
    refused: dict[str, str] = {}
    spelled = {i.casefold(): i for i in ids}
    for index, item in enumerate(_detail_items(response)):
        target = _get(item, "target")
        if isinstance(target, str) and target.strip():
            event_id = spelled.get(target.strip().casefold(), target.strip())
        elif index < len(ids):
            event_id = ids[index]
        else:
            continue  # neither named nor at a requested index: no event to give it to
        item_code = str(_get(item, "code") or "")
        if item_code.strip().casefold() != APPROVED_CODE:
            refused[event_id] = f"{item_code}: {_get(item, 'message') or ''}"[:300]
        elif event_id in spelled.values() and event_id not in approved:
            approved.append(event_id)
    # An event both approved and refused in one answer is taken as refused: never claim an
    # approval ARM also denied.
    approved = [i for i in approved if i not in refused]
    untold = [i for i in ids if i not in approved and i not in refused]
    code = code or "MultiStatus"
    if not refused and not untold:
        text = f"ARM 207 {code} on {where}: all {len(ids)} approved"
        return ArmAnswer(verdict="approved", status=207, code=code, text=text, approved=approved)
    text = (
        f"ARM 207 {code} on {where}: {len(approved)} of {len(ids)} approved, "
        f"{len(refused)} refused, {len(untold)} not accounted for: {message}"
    )
    return ArmAnswer(
        verdict="refused",
        status=207,
        code=code,
        text=text[:1000],
        refused=refused,
        approved=approved,
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


def _error_object(data: object) -> object:
    """The object holding ARM's code and message: `error` (any case), else the 207's
    `Response`, else the body itself if it carries a code."""
    for key in ("error", "response"):
        found = _get(data, key)
        if isinstance(found, dict):
            return found
    return data if _get(data, "code") is not None else None


def _detail_items(response: requests.Response) -> list[dict[str, Any]]:
    """The per-event results: `error.details` or the body's own `Details` (any case)."""
    data = _json(response)
    details = _get(_error_object(data), "details")
    if not isinstance(details, list):
        details = _get(data, "details")
    return [d for d in details if isinstance(d, dict)] if isinstance(details, list) else []


def _details(response: requests.Response) -> dict[str, str]:
    """An error's details naming events (`target`), keys in any case: EventId ->
    "code: message". Details without a target are left out: outside a 207 they need not be
    one per event, so their index says nothing."""
    found: dict[str, str] = {}
    for item in _detail_items(response):
        target = _get(item, "target")
        if isinstance(target, str) and target.strip():
            code, message = _get(item, "code") or "", _get(item, "message") or ""
            found[target.strip()] = f"{code}: {message}"[:300]
    return found


def _error(response: requests.Response) -> tuple[str, str]:
    """ARM's code and message, keys in any case: `{"error": {"code", "message"}}`,
    `{"Error": {"Code", "Message"}}` (the Maintenance provider's 404) or the 207's
    `{"Response": {"Code", "Message"}}`."""
    data = _json(response)
    if data is None:
        return "", response.text[:300]
    error = _error_object(data)
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
