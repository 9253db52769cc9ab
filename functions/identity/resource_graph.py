"""Azure Resource Graph's query API, as documented: one POST, pages, quota, errors.

`POST {arm}/providers/Microsoft.ResourceGraph/resources?api-version=2024-04-01` with
`{"query", "subscriptions"?, "options": {"resultFormat", "$top", "$skipToken"?}}`
(Azure/azure-rest-api-specs, specification/resourcegraph/resource-manager/
Microsoft.ResourceGraph/stable/2024-04-01/resourcegraph.json @ 423203f7: `$top` is at most
1,000, a response carries `$skipToken` while rows remain). Every answer carries the
caller's quota, `x-ms-user-quota-remaining` and `x-ms-user-quota-resets-after` (hh:mm:ss):
15 queries per 5-second window per user by default (MicrosoftDocs/azure-docs,
articles/governance/resource-graph/concepts/guidance-for-throttled-requests.md).

What an answer means for the caller:

- 200: a `Page` (rows, the next `$skipToken`, the quota left and when it resets);
- 429, 5xx, 408, no answer, an answer not understood: `FactsUnavailable` (transient: wait
  `retry_after` and ask again);
- any other 4xx: `ResourceGraphRefused`, a configuration error (a query Resource Graph
  rejects, an identity without a role, an api-version it does not serve). Asking again
  changes nothing until an operator fixes it, so it carries Azure's own words (error code,
  message and each detail, e.g. `InvalidQuery: Query is invalid...`) and a long
  `retry_after`; see functions.identity.graph_state for how it is announced.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import requests

from functions.approvers.arm import TokenCredential, retry_after, scope_for

log = logging.getLogger(__name__)

API_VERSION = "2024-04-01"
REQUEST_TIMEOUT_SECONDS = 15.0
PAGE_ROWS = 1000  # QueryRequestOptions.$top maximum
QUOTA_PER_WINDOW = 15
QUOTA_WINDOW_SECONDS = 5.0
REFUSED_RETRY_SECONDS = 900.0  # a configuration error: ask again no sooner than this
MESSAGE_LIMIT = 1000
TRANSIENT_4XX = frozenset({408, 429})


class FactsUnavailable(Exception):
    """Transient: Resource Graph unreachable, throttled, erroring, or its answer unusable.
    The message is abandoned and retried; `retry_after` is how long Azure asked us to wait."""

    def __init__(self, reason: str, retry_after: float | None = None) -> None:
        super().__init__(reason)
        self.retry_after = retry_after


class ResourceGraphRefused(FactsUnavailable):
    """Resource Graph answered 4xx (not 429): a configuration error, not a slow service.
    `status`, `code` and `message` are Azure's; retried no sooner than `retry_after`."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(
            f"Resource Graph refused the query ({status} {code}): {message}",
            retry_after=REFUSED_RETRY_SECONDS,
        )
        self.status, self.code, self.message = status, code, message


@dataclass(frozen=True)
class Page:
    """One page of rows and what Resource Graph said about paging and quota."""

    rows: list[dict[str, Any]]
    skip_token: str | None
    quota_remaining: int | None
    quota_resets_after: float | None  # seconds


class ResourceGraph:
    """The HTTP client: one `query` call is one request (and one unit of quota)."""

    def __init__(
        self,
        session: requests.Session,
        credential: TokenCredential,
        arm_endpoint: str = "https://management.azure.com",
        subscriptions: tuple[str, ...] | list[str] = (),
    ) -> None:
        self.session = session
        self.credential = credential
        self.endpoint = arm_endpoint.rstrip("/")
        self.subscriptions = list(subscriptions)
        self.requests = 0  # queries sent (counted for the bench and the sync's report)

    @property
    def url(self) -> str:
        return f"{self.endpoint}/providers/Microsoft.ResourceGraph/resources"

    def query(self, kql: str, skip_token: str | None = None, top: int = PAGE_ROWS) -> Page:
        options: dict[str, Any] = {"resultFormat": "objectArray", "$top": top}
        if skip_token:
            options["$skipToken"] = skip_token
        body: dict[str, Any] = {"query": kql, "options": options}
        if self.subscriptions:
            body["subscriptions"] = self.subscriptions
        try:
            token = self.credential.get_token(scope_for(self.endpoint))
        except Exception as exc:  # azure-identity raises several types
            raise FactsUnavailable(f"no token for Resource Graph: {type(exc).__name__}") from None
        self.requests += 1
        try:
            answer = self.session.post(
                self.url,
                params={"api-version": API_VERSION},
                json=body,
                headers={
                    "Authorization": f"Bearer {token.token}",
                    "Accept": "application/json",
                },
                timeout=REQUEST_TIMEOUT_SECONDS,
                allow_redirects=False,
            )
        except requests.RequestException as exc:
            raise FactsUnavailable(f"Resource Graph unreachable: {type(exc).__name__}") from None
        if 400 <= answer.status_code < 500 and answer.status_code not in TRANSIENT_4XX:
            code, message = azure_error(answer)
            raise ResourceGraphRefused(answer.status_code, code, message)
        if answer.status_code != 200:
            code, _ = azure_error(answer)
            raise FactsUnavailable(
                f"Resource Graph {answer.status_code} {code}".rstrip(), retry_after=_wait(answer)
            )
        remaining = _int(answer.headers.get("x-ms-user-quota-remaining"))
        if remaining is not None and remaining <= 1:
            log.info(
                "Resource Graph quota nearly spent (remaining %s, resets after %s)",
                remaining,
                answer.headers.get("x-ms-user-quota-resets-after"),
            )
        try:
            data = answer.json()
            rows = data["data"]
            if isinstance(rows, dict):  # the table format: {"columns": [...], "rows": [...]}
                names = [c["name"] for c in rows["columns"]]
                rows = [dict(zip(names, row, strict=False)) for row in rows["rows"]]
            if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
                raise TypeError("data is not a list of objects")
            token_out = data.get("$skipToken") or None
            if token_out is not None and not isinstance(token_out, str):
                raise TypeError("$skipToken is not a string")
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise FactsUnavailable(f"Resource Graph answer not understood: {exc!r}"[:300]) from None
        return Page(
            rows=rows,
            skip_token=token_out,
            quota_remaining=remaining,
            quota_resets_after=hms_seconds(answer.headers.get("x-ms-user-quota-resets-after")),
        )


def azure_error(answer: requests.Response) -> tuple[str, str]:
    """ARM's error body `{"error": {"code", "message", "details": [{"code", "message"}]}}`
    as (code, one line): Resource Graph puts the reason in the details (the top message is
    the support line with its correlationId), so the details come first."""
    try:
        error = answer.json().get("error") or {}
        code = str(error.get("code") or f"HTTP {answer.status_code}")[:80]
        parts = [
            f"{d.get('code', '')}: {d.get('message', '')}".strip(": ")
            for d in error.get("details") or []
            if isinstance(d, dict)
        ]
        if error.get("message"):
            parts.append(str(error["message"]))
        text = " | ".join(p for p in parts if p) or answer.reason or ""
    except (ValueError, AttributeError, TypeError):
        code, text = f"HTTP {answer.status_code}", (answer.text or "")[:200]
    return code, " ".join(text.split())[:MESSAGE_LIMIT]


def hms_seconds(value: str | None) -> float | None:
    """`x-ms-user-quota-resets-after` (hh:mm:ss) in seconds; None if absent or malformed."""
    if not value:
        return None
    try:
        h, m, s = value.strip().split(":")
        return int(h) * 3600 + int(m) * 60 + float(s)
    except ValueError:
        return None


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def _wait(answer: requests.Response) -> float | None:
    """How long Azure asked us to wait: Retry-After, or Resource Graph's own
    x-ms-user-quota-resets-after (hh:mm:ss) when the quota is spent."""
    wait = retry_after(answer)
    if wait is not None:
        return wait
    return hms_seconds(answer.headers.get("x-ms-user-quota-resets-after"))
