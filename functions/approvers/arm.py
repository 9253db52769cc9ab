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

`acknowledge` speaks the protocol and classifies the answer: approved (2xx but 207),
refused (4xx, or a 207: ARM's code and message are kept for the audit), or retry (429,
5xx, network, token trouble), with the `Retry-After` ARM sent. `acknowledge_each` is the
whole exchange with ARM for one event: the owners in turn, retries honouring Retry-After
until a stop, and a 404 or 409 to a call that may repeat one that landed settled by
asking Resource Graph (`ask_azure`, the same endpoint and identity) what Azure reports.
Both exchanges are here, beside their back-off, so the approval's ARM phase
(functions.pipeline.approve_arm) reads, decides, then acts, each step leaving to the
next (issue 46); whether to ask ARM at all, and what its outcome means for the event,
are the ARM phase's.
"""

from __future__ import annotations

import email.utils
import re
from datetime import UTC, datetime, timedelta
from typing import Any, Literal, NamedTuple, Protocol

import requests
from pydantic import BaseModel

from functions.approvers.azure_events import EVENT_TYPE, NOT_WAITING, AzureEvent
from functions.clock import Clock
from functions.model.arm import ArmResource

REQUEST_TIMEOUT_SECONDS = 15.0
# Retries back off alike: ARM, Resource Graph and the relays (functions.pipeline.relay_phase).
BACKOFF_START_SECONDS = 1.0
BACKOFF_MAX_SECONDS = 20.0
RESOURCE_GRAPH_PATH = "/providers/Microsoft.ResourceGraph/resources"
RESOURCE_GRAPH_API_VERSION = "2024-04-01"
# Azure's EventIds are GUIDs; anything else never goes into a query (it came from a relay).
_EVENT_ID = re.compile(r"^[A-Za-z0-9-]{1,128}$")
# How an attempt starts when ARM refused a repeat of an acknowledge that had landed (the
# crash explorer's rule 11 reads it): the outcome the dead or disconnected call never saw.
LANDED = "acknowledged by an earlier call whose answer was lost"
# What a repeat of an acknowledge that landed may get: the stand-in answers 409 Conflict
# (not Scheduled any more); Azure's answer to a repeat is not recorded anywhere public,
# and its recorded answer for an EventId it does not hold is 404 InvalidScheduledEventId
# "Scheduled event not found" (docs/conformance.md).
REPEAT = frozenset({404, 409})

Verdict = Literal["approved", "refused", "retry"]
MULTI_STATUS = 207  # the list form's answer when some event failed: never an approval


class TokenCredential(Protocol):
    """What azure-identity's credentials offer (ManagedIdentityCredential and friends)."""

    def get_token(self, *scopes: str, **kwargs: Any) -> Any: ...


class AzureUnavailable(Exception):
    """Resource Graph could not answer now (throttled, down, unreachable): try later."""

    def __init__(self, reason: str, retry_after: float | None = None) -> None:
        super().__init__(reason)
        self.retry_after = retry_after


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


class Try(NamedTuple):
    """One acknowledge's answer, when it came, as the audit words it."""

    at: datetime
    outcome: str


class Acknowledged(NamedTuple):
    """How `acknowledge_each` ended: `approved` on `owner` (ARM's `status`); `landed`
    there (ARM refused a repeat of a call Azure reports acted on: module doc; `detail`
    is then what the refused call's try stands for in the audit); `refused`
    (a final 4xx, `detail` ARM's words); `unavailable` (Resource Graph could not say
    whether a repeat had landed; `detail` why); `stopped` (`stop` came first)."""

    outcome: Literal["approved", "landed", "refused", "unavailable", "stopped"]
    tries: list[Try]
    owner: ArmResource | None = None
    status: int | None = None
    detail: str = ""


def event_query(event_id: str) -> str:
    if not _EVENT_ID.match(event_id):
        raise ValueError(f"EventId {event_id[:64]!r} is not one Azure writes")
    return (
        f"maintenanceresources | where type =~ '{EVENT_TYPE}' and name =~ '{event_id}' "
        "| project id, name, type, subscriptionId, properties"
    )


def lookup(
    event_id: str,
    *,
    credential: TokenCredential,
    session: requests.Session,
    endpoint: str,
    remaining: float,
) -> AzureEvent | None:
    """The event as Resource Graph holds it (functions.approvers.azure_events says what
    it means); None when Azure does not report it (or the EventId is not one Azure
    writes). Raises AzureUnavailable when it cannot tell now."""
    try:
        query = event_query(event_id)
    except ValueError:
        return None
    try:
        token = credential.get_token(scope_for(endpoint))
    except Exception as exc:  # azure-identity raises several types; none may escape
        raise AzureUnavailable(f"no token for Resource Graph: {type(exc).__name__}") from None
    try:
        answer = session.post(
            f"{endpoint.rstrip('/')}{RESOURCE_GRAPH_PATH}",
            params={"api-version": RESOURCE_GRAPH_API_VERSION},
            json={"query": query, "options": {"$top": 10}},
            headers={"Authorization": f"Bearer {token.token}"},
            timeout=max(0.1, min(REQUEST_TIMEOUT_SECONDS, remaining)),
            allow_redirects=False,
        )
    except requests.RequestException as exc:
        raise AzureUnavailable(f"Resource Graph unreachable: {type(exc).__name__}") from None
    if answer.status_code == 429 or answer.status_code >= 500:
        raise AzureUnavailable(f"Resource Graph answered {answer.status_code}", retry_after(answer))
    if answer.status_code != 200:
        raise AzureUnavailable(f"Resource Graph refused the query ({answer.status_code})")
    try:
        rows = answer.json().get("data")
    except (ValueError, AttributeError):
        raise AzureUnavailable("Resource Graph's answer is not JSON") from None
    for row in rows if isinstance(rows, list) else []:
        if (
            isinstance(row, dict)
            and str(row.get("type", "")).casefold() == EVENT_TYPE
            and str(row.get("name", "")).casefold() == event_id.casefold()
            and isinstance(row.get("properties"), dict)
            and isinstance(row.get("id"), str)
        ):
            return AzureEvent(id=row["id"], event_id=row["name"], properties=row["properties"])
    return None


def ask_azure(
    event_id: str,
    *,
    credential: TokenCredential,
    session: requests.Session,
    endpoint: str,
    clock: Clock,
    stop: datetime,
) -> AzureEvent | None:
    """`lookup`, asked again honouring Retry-After while Resource Graph is throttled or
    down; raises its last AzureUnavailable when the next try would pass `stop`."""
    delay = BACKOFF_START_SECONDS
    while True:
        try:
            return lookup(
                event_id,
                credential=credential,
                session=session,
                endpoint=endpoint,
                remaining=max(0.1, (stop - clock.now()).total_seconds()),
            )
        except AzureUnavailable as exc:
            next_delay = back_off(clock, exc.retry_after, delay, stop)
            if next_delay is None:
                raise
            delay = next_delay


def acknowledge_each(
    owners: list[ArmResource],
    event_id: str,
    *,
    credential: TokenCredential,
    session: requests.Session,
    endpoint: str,
    api_version: str,
    clock: Clock,
    stop: datetime,
    may_have_landed: bool,
    not_before: datetime | None,
) -> Acknowledged:
    """The one-event call on each owner in turn until `stop`: 429/5xx/network retried
    honouring Retry-After, a 404 tries the next owner, any other 4xx is final, but one:
    a 404 or 409 to a call that may repeat one that landed (`may_have_landed`: an earlier
    run's, or an unanswered one here) is settled by Azure's view. Started or Completed
    there before `not_before` is that earlier call's work (`landed`); still Scheduled
    (Resource Graph lags ARM), a 409 is asked again. What ARM means by the 409 is never
    relied on."""
    tries: list[Try] = []
    delay = BACKOFF_START_SECONDS
    queue = list(owners)
    while queue:
        owner = queue[0]
        remaining = (stop - clock.now()).total_seconds()
        if remaining <= 0:
            break
        answer = acknowledge(
            owner,
            event_id,
            credential=credential,
            session=session,
            endpoint=endpoint,
            api_version=api_version,
            remaining=remaining,
        )
        tries.append(Try(clock.now(), answer.text[:500]))
        if answer.verdict == "approved":
            return Acknowledged("approved", tries, owner, answer.status)
        waiting = False  # Azure reports the event still Scheduled
        if answer.verdict == "refused" and answer.status in REPEAT and may_have_landed:
            try:
                azure = ask_azure(
                    event_id,
                    credential=credential,
                    session=session,
                    endpoint=endpoint,
                    clock=clock,
                    stop=stop,
                )
            except AzureUnavailable as exc:
                return Acknowledged("unavailable", tries, detail=str(exc))
            status = str(azure.properties.get("EventStatus") or "") if azure else ""
            if status.casefold() in NOT_WAITING and (
                not_before is None or clock.now() < not_before
            ):
                landed = f"{LANDED} (Azure reports it {status}): {answer.text}"
                return Acknowledged("landed", tries, owner, detail=landed)
            waiting = azure is not None and status.casefold() == "scheduled"
        if answer.verdict == "refused" and answer.status == 409 and waiting:
            pass  # Resource Graph may lag ARM: acknowledge and ask again until `stop`
        elif answer.verdict == "refused":
            queue.pop(0)
            if answer.status == 404 and queue:
                continue  # another owner may hold it (e.g. the set, not the VM)
            return Acknowledged("refused", tries, detail=answer.text)
        elif answer.status != 429:
            may_have_landed = True  # unanswered, or a 5xx: ARM may have acted on it
        next_delay = back_off(clock, answer.retry_after, delay, stop)
        if next_delay is None:
            break
        delay = next_delay
    return Acknowledged("stopped", tries)


def back_off(clock: Clock, retry_after: float | None, delay: float, stop: datetime) -> float | None:
    """Wait as ARM or Resource Graph asked (Retry-After), else `delay`; the next delay
    (doubled, at most BACKOFF_MAX_SECONDS), or None when that wait would pass `stop`."""
    wait = retry_after if retry_after is not None else delay
    if clock.now() + timedelta(seconds=wait) >= stop:
        return None
    clock.sleep(wait)
    return min(delay * 2, BACKOFF_MAX_SECONDS)
