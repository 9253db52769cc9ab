"""The simulator's Azure Resource Graph: the documented query limits, paging and quota.

What it holds the caller to, each from a public source (the commit is the one read):

- the KQL limits of MicrosoftDocs/azure-docs articles/governance/resource-graph/concepts/
  query-language.md @ 03982e63: `union` within one table or between Resources and
  ResourceContainers, at most 3 legs; at most 3 `join`, at most one of them across tables
  (three if every cross-table join is between Resources and ResourceContainers); at most
  3 `mv-expand`; and a table Resource Graph has (reference/supported-tables-resources.md
  @ 00ec1e2f). A query that breaks one is answered 400 in the shape Azure answers an
  invalid query (Azure/azure-powershell src/ResourceGraph/ResourceGraph.Test/ScenarioTests/
  ResourceGraphQueryTests.ps1 @ d89a87d2, a recorded answer; Apache-2.0):
  `{"error": {"code": "BadRequest", "message": "Please provide below info when asking for
  support: timestamp = ..., correlationId = ....", "details": [{"code": "InvalidQuery",
  "message": "Query is invalid. ..."}, {"code": <which rule>, "message": ...}]}}`. The second
  detail's code names the rule here; Azure's own code for each limit is not in a public
  source we found.
- paging as Azure/azure-rest-api-specs resourcegraph 2024-04-01 (resourcegraph.json @
  423203f7, ResourcesFirstPageQuery.json / ResourcesNextPageQuery.json): `options.$top` at
  most 1,000 (the page size), the answer's `$skipToken` while rows remain, sent back as
  `options.$skipToken` with the same query and scopes; `totalRecords`, `count`, `data`,
  `facets`, `resultTruncated`.
- the per-user quota of guidance-for-throttled-requests.md: 15 queries per 5-second
  window, `x-ms-user-quota-remaining` and `x-ms-user-quota-resets-after` (hh:mm:ss) on every
  answer, 429 beyond.

Rows: it understands the two queries functions.identity.facts sends (which table, and the
one vmId if the query names one) and answers their projection from `inventory`, sorted by
`id`. Any other valid query gets no rows.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import re
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

PAGE_MAX = 1000
QUOTA = 15
WINDOW_SECONDS = 5.0
# The tables of reference/supported-tables-resources.md (lower-case).
KNOWN_TABLES = frozenset(
    {
        "advisorresources",
        "alertsmanagementresources",
        "appserviceresources",
        "authorizationresources",
        "computeresources",
        "desktopvirtualizationresources",
        "dnsresources",
        "extendedlocationresources",
        "guestconfigurationresources",
        "healthresources",
        "insightresources",
        "kubernetesconfigurationresources",
        "maintenanceresources",
        "networkresources",
        "patchassessmentresources",
        "patchinstallationresources",
        "policyresources",
        "recoveryservicesresources",
        "resourcechanges",
        "resourcecontainerchanges",
        "resourcecontainers",
        "resources",
        "securityresources",
        "servicehealthresources",
    }
)
RESOURCES_AND_CONTAINERS = frozenset({"resources", "resourcecontainers"})
MAX_UNION_LEGS = 3
MAX_JOINS = 3
MAX_MV_EXPAND = 3
INVALID_QUERY = (
    "Query is invalid. Please refer to the documentation for the Azure Resource Graph "
    "service and fix the error before retrying."
)
_STRING = re.compile(r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"")
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_VM_ID = re.compile(r"properties\.vmId\)*\s*(?:==|=~)\s*'([^']*)'", re.IGNORECASE)


class QueryRefused(Exception):
    """A documented limit broken: `rule` names it (the second detail's code)."""

    def __init__(self, rule: str, message: str) -> None:
        super().__init__(message)
        self.rule, self.message = rule, message


def error_body(rule: str, message: str) -> dict[str, Any]:
    stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f") + "0Z"
    return {
        "error": {
            "code": "BadRequest",
            "message": "Please provide below info when asking for support: timestamp = "
            f"{stamp}, correlationId = {uuid.uuid4()}.",
            "details": [
                {"code": "InvalidQuery", "message": INVALID_QUERY},
                {"code": rule, "message": message},
            ],
        }
    }


# ---------------------------------------------------------------------- the limits


def _closing(text: str, start: int) -> int:
    """The index of the `)` matching the `(` at `start` (len(text) if unbalanced)."""
    depth = 0
    for i in range(start, len(text)):
        if text[i] == "(":
            depth += 1
        elif text[i] == ")":
            depth -= 1
            if depth == 0:
                return i
    return len(text)


def _leading_table(text: str) -> str:
    """The first word of a tabular expression, looking inside parentheses."""
    stripped = text.lstrip()
    while stripped.startswith("("):
        stripped = stripped[1:].lstrip()
    match = _WORD.match(stripped)
    return match.group(0).casefold() if match else ""


def _operands(text: str, start: int) -> list[str]:
    """The comma-separated operands after an operator keyword at `start`, up to the next
    top-level `|` or `)`; options (`kind=inner`, `withsource=T`) are skipped."""
    items, depth, current, i = [], 0, "", start
    while i < len(text):
        ch = text[i]
        if ch == "(":
            end = _closing(text, i)
            current += text[i : end + 1]
            i = end + 1
            continue
        if ch == ")" or (ch == "|" and depth == 0):
            break
        if ch == "," and depth == 0:
            items.append(current)
            current = ""
        else:
            current += ch
        i += 1
    items.append(current)
    cleaned = []
    for item in items:
        words = re.sub(r"\b\w+\s*=\s*\w+", " ", item).strip()
        if words:
            cleaned.append(words)
    return cleaned


def check_query(kql: str) -> None:
    """Raise QueryRefused if `kql` breaks one of Resource Graph's documented limits."""
    text = _STRING.sub("''", kql)
    main = _leading_table(text)
    tables_used: list[str] = []
    if main != "union":
        tables_used.append(main)
    left = {main}
    first = True
    for match in re.finditer(r"\bunion\b", text, re.IGNORECASE):
        piped = text[: match.start()].rstrip().endswith("|")
        legs = [_leading_table(op) for op in _operands(text, match.end())]
        tables_used.extend(legs)
        count = len(legs) + (1 if piped else 0)
        involved = set(legs) | ({main} if piped else set())
        if count > MAX_UNION_LEGS:
            raise QueryRefused(
                "UnionLegsLimitExceeded",
                f"union has {count} legs; at most {MAX_UNION_LEGS} are allowed in a query",
            )
        if len(involved) > 1 and not involved <= RESOURCES_AND_CONTAINERS:
            raise QueryRefused(
                "CrossTableUnionNotSupported",
                f"union across tables {sorted(involved)}: union is allowed within one table "
                "or between Resources and ResourceContainers only",
            )
        if main == "union" and first:
            left = involved
        first = False
    joins = list(re.finditer(r"\bjoin\b", text, re.IGNORECASE))
    if len(joins) > MAX_JOINS:
        raise QueryRefused(
            "JoinLimitExceeded", f"{len(joins)} joins; at most {MAX_JOINS} are allowed"
        )
    cross: list[set[str]] = []
    for match in joins:
        operands = _operands(text, match.end())
        right = _leading_table(operands[0]) if operands else ""
        tables_used.append(right)
        if {right} != left:
            cross.append(left | {right})
    if len(cross) > 1 and not all(pair <= RESOURCES_AND_CONTAINERS for pair in cross):
        raise QueryRefused(
            "CrossTableJoinLimitExceeded",
            f"{len(cross)} cross-table joins; at most one is allowed (three between Resources "
            "and ResourceContainers)",
        )
    expands = len(re.findall(r"\bmv-?expand\b", text, re.IGNORECASE))
    if expands > MAX_MV_EXPAND:
        raise QueryRefused(
            "MvExpandLimitExceeded", f"{expands} mv-expand; at most {MAX_MV_EXPAND} are allowed"
        )
    for table in tables_used:
        if table not in KNOWN_TABLES:
            raise QueryRefused(
                "UnknownTable", f"'{table}' is not a Resource Graph table (or is not allowed)"
            )


# ---------------------------------------------------------------------- quota and pages


@dataclass
class Quota:
    """One user's window: `used` queries since `start`."""

    start: float
    used: int = 0


@dataclass
class ResourceGraphService:
    """Answers `POST /providers/Microsoft.ResourceGraph/resources` once ARM's checks
    (api-version, token) passed. `inventory()` gives every VM row, each with `_table`
    ("resources" or "computeresources"); `clock` is monotonic seconds (the quota's)."""

    inventory: Callable[[], list[dict[str, Any]]]
    clock: Callable[[], float] = time.monotonic
    quota: int | None = QUOTA  # None: no quota (a test that needs none)
    window: float = WINDOW_SECONDS
    latency: float = 0.0  # seconds each answered query takes (the bench: Azure's, assumed)
    queries: int = 0
    refused: list[str] = field(default_factory=list)  # the rule of each query refused
    _users: dict[str, Quota] = field(default_factory=dict)
    _snapshots: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def answer(
        self, principal: str, request: dict[str, Any], subscriptions: set[str] | None
    ) -> tuple[int, dict[str, Any], dict[str, str]]:
        headers = self._spend(principal)
        if headers is None:
            status, body, headers = self._throttled(principal)
            return status, body, headers
        kql = request["query"]
        try:
            check_query(kql)
        except QueryRefused as refusal:
            with self._lock:
                self.refused.append(refusal.rule)
            return 400, error_body(refusal.rule, refusal.message), headers
        options = request.get("options") or {}
        top = options.get("$top", PAGE_MAX)
        if not isinstance(top, int) or not 1 <= top <= PAGE_MAX:
            body = error_body("InvalidTop", f"$top must be between 1 and {PAGE_MAX}")
            return 400, body, headers
        if self.latency:
            time.sleep(self.latency)
        rows, offset = self._rows(kql, subscriptions, options.get("$skipToken"))
        if rows is None:
            body = error_body("InvalidSkipToken", "The $skipToken is not valid for this query")
            return 400, body, headers
        page = rows[offset : offset + top]
        body: dict[str, Any] = {
            "totalRecords": len(rows),
            "count": len(page),
            "data": page,
            "facets": [],
            "resultTruncated": "false",
        }
        if offset + top < len(rows):
            body["$skipToken"] = _token(_key(kql, subscriptions), offset + top)
        return 200, body, headers

    def _spend(self, principal: str) -> dict[str, str] | None:
        """Count one query against `principal`'s window: its headers, or None (429)."""
        with self._lock:
            self.queries += 1
            if self.quota is None:
                return {"x-ms-user-quota-remaining": "14", "x-ms-user-quota-resets-after": ""}
            now = self.clock()
            user = self._users.get(principal)
            if user is None or now - user.start >= self.window:
                user = self._users[principal] = Quota(start=now)
            if user.used >= self.quota:
                return None
            user.used += 1
            return _quota_headers(self.quota - user.used, user.start + self.window - now)

    def _throttled(self, principal: str) -> tuple[int, dict[str, Any], dict[str, str]]:
        with self._lock:
            user = self._users[principal]
            resets = user.start + self.window - self.clock()
        headers = _quota_headers(0, resets)
        headers["Retry-After"] = str(max(1, math.ceil(resets)))
        body = {
            "error": {
                "code": "RateLimiting",
                "message": "Client application has been throttled and should not attempt to "
                "repeat the request until an amount of time has elapsed.",
            }
        }
        return 429, body, headers

    def _rows(
        self, kql: str, subscriptions: set[str] | None, skip_token: Any
    ) -> tuple[list[dict[str, Any]] | None, int]:
        key = _key(kql, subscriptions)
        if skip_token:
            try:
                data = json.loads(base64.b64decode(str(skip_token)))
                offset = int(data["o"])
                if data["k"] != key:
                    raise ValueError("another query")
            except (ValueError, KeyError, TypeError):
                return None, 0
            with self._lock:
                rows = self._snapshots.get(key)
            if rows is None:
                rows = self._evaluate(kql, subscriptions)
            return rows, offset
        rows = self._evaluate(kql, subscriptions)
        with self._lock:
            self._snapshots[key] = rows
            while len(self._snapshots) > 16:
                self._snapshots.pop(next(iter(self._snapshots)))
        return rows, 0

    def _evaluate(self, kql: str, subscriptions: set[str] | None) -> list[dict[str, Any]]:
        table = _leading_table(_STRING.sub("''", kql))
        wanted = {m.casefold() for m in _VM_ID.findall(kql)}
        rows = []
        for row in self.inventory():
            if row["_table"] != table:
                continue
            if wanted and row["vmId"] not in wanted:
                continue
            if subscriptions is not None and row["subscriptionId"] not in subscriptions:
                continue
            rows.append({k: v for k, v in row.items() if k != "_table"})
        rows.sort(key=lambda r: r["id"].casefold())
        return rows


def _quota_headers(remaining: int, resets: float) -> dict[str, str]:
    seconds = max(0, math.ceil(resets))
    return {
        "x-ms-user-quota-remaining": str(remaining),
        "x-ms-user-quota-resets-after": time.strftime("%H:%M:%S", time.gmtime(seconds)),
    }


def _key(kql: str, subscriptions: set[str] | None) -> str:
    scope = ",".join(sorted(subscriptions)) if subscriptions is not None else "*"
    return hashlib.sha256(f"{kql}\n{scope}".encode()).hexdigest()[:32]


def _token(key: str, offset: int) -> str:
    return base64.b64encode(json.dumps({"k": key, "o": offset}).encode()).decode()


def vm_row(
    *,
    table: str,
    resource_id: str,
    subscription_id: str,
    resource_group: str,
    vm_id: str,
    nic_id: str,
    address: str,
    availability_set_id: str = "",
    tags: dict[str, str] | None = None,
    zones: list[str] | None = None,
    location: str | None = None,
) -> dict[str, Any]:
    """One VM with one NIC and one ipconfig, as the facts queries project it (`tags` an
    object, `zones` an array, as Resource Graph's columns hold them; absent: null)."""
    return {
        "_table": table,
        "id": resource_id,
        "subscriptionId": subscription_id,
        "resourceGroup": resource_group,
        "vmId": vm_id,
        "scaleSetId": "",
        "availabilitySetId": availability_set_id,
        "tags": dict(tags) if tags is not None else None,
        "zones": list(zones) if zones is not None else None,
        "location": location,
        "nicId": nic_id,
        "nicPrimary": "true",
        "ipConfigurations": [
            {
                "name": "ipconfig1",
                "id": f"{nic_id}/ipConfigurations/ipconfig1",
                "properties": {
                    "privateIPAddress": address,
                    "privateIPAllocationMethod": "Dynamic",
                    "primary": True,
                    "privateIPAddressVersion": "IPv4",
                },
            }
        ],
    }
