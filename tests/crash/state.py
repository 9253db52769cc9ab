"""The end state of a run, normalised so that a crash's only legitimate trace (time) is
gone and everything that matters stays; and the first difference between two of them.

Kept, exactly: every row of every table of the run (its key, its state, decision,
approval state, who approved, which transitions were claimed and are done, how it ended,
capacity holders, drain step statuses and details), and every outside effect.

Normalisation rules, each with its reason:
1. Table bookkeeping goes (`etag`, `Timestamp`, the odata metadata): they change with every
   write, and a retried write is a different write.
2. Every time value becomes "<t>" (a datetime property, and an ISO 8601 date-time inside a
   string or a JSON document, including "pending:<time>" claims and time-based RowKeys):
   a crash delays what follows by a lock duration or a watchdog period, so every time
   after it legitimately moves. Whether a time is set at all (null or not) is kept.
3. `owner` (drain steps, channel deliveries) goes: a random id per invocation.
4. A deliveries row's `claims` count goes: it counts invocations that took the claim
   (a crash makes one more); what was posted is checked at the receivers (effects).
5. An event row's `approval_attempts` becomes the set of distinct (vm, outcome, by): the
   list logs each try, and a retry after a crash may log the same try again. An extra
   StartRequests such a retry sent is caught at the relay (effect `relay`), so nothing
   that reached Azure hides behind this rule.
6. Audit rows and rejected rows are compared as multisets without RowKey: their RowKeys are
   a time and a random suffix (rule 2 and 3); their content is kept, whole (until issue 47
   rows alike in their first 80 characters shared one entry, and the last one hid the
   others: a crash's extra audit row could read "same"). Audit rows live in each event's
   partition of the events table (RowKey `a|...`), and in the audit table before.
7. An identities row's wrapped keys become their key ids: wrapping takes a random nonce.
8. Who asked for an approval (`by`, in the attempts and the audit rows) is "auto" for the
   two automatic callers, `policy` (ingest) and `watchdog`: which of them gets there first
   after a crash is timing (a redelivery or the next sweep); a person (`manual:`) or the
   drain (`drain`) stays as it is.
9. A drain's succeeded `approve` step says "approved" whether it approved the event itself
   or found it approved already ("nothing to approve: already approved", the reconcile
   that took over after a crash did it): either way the event was approved, and how many
   times is checked at the relay.
10. Effects after the receivers' own dedupe (what a real receiver does with a repeat):
   - topic: the set of MessageIds sent (Service Bus duplicate detection drops a repeat;
     a MessageId's time, the start of a silence, is "<t>" by rule 2);
   - relay: every verified callback as (VM, path, EventIds), counted, but repeats of one
     `AttemptId` count once: a relay answers a repeat of an attempt IMDS accepted from
     memory, without a second StartRequests (functions.approvers.relay); a request
     without one (the code before issue 31) counts each time, as the relay then sent a
     StartRequests each time;
   - drain hook: each call as (path, EventId, action), counted, but calls carrying the same
     `webhook-id` count once (Standard Webhooks receivers dedupe on it);
   - teams, slack: the set of announcements posted. Neither service takes a dedupe
     key, so a post whose answer was lost is posted again: at least once per
     announcement by nature, as docs/operations.md states. A missing post still differs;
     a repeat after a lost answer does not;
   - pagerduty: the set of (announcement, event_action, dedup_key) (PagerDuty dedupes on
     dedup_key);
   - webhook: the set of (announcement, webhook-id) (receivers dedupe on webhook-id);
   - arm: each acknowledge call as (EventId, status), counted; a 409 for an EventId
     that was acknowledged (200) before is left out: it is Azure refusing a repeat of an
     acknowledge whose answer was lost (the event has started), a no-op.
12. An event row's `drain_outcome` goes: it only tells the one decider that the drain
   workflow ran to its end from the row (so it is not run again); whether a sweep got to
   run it before the event started is timing. What the drain did is in the drains rows and
   at the drain hook, both kept.
11. An event approved through ARM logs its acknowledge as `acknowledged` in the attempts
   (rule 5), whether the attempt saw ARM's 200 (its text, e.g. "Successfully Approved")
   or a takeover found that an earlier call had landed: ARM refused the repeat and Azure
   reports the event Started (the outcome starts with approvers.arm.LANDED). The host that
   saw the 200 died before it could write it; which host logged the acknowledge is a
   crash's trace, and the ARM effect (rule 10) still counts every call that reached ARM.
13. Audit rows of an approval to be retried (`retry_later`) count as a set, like the
   attempts (rule 5): each try is audited with its own RowKey, and how many tries a wait
   takes after a crash is timing (the takeover or the sweep tries again). Once-keyed rows
   (decisions, outcomes) stay counted: a second `approved` row still differs.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter
from datetime import date, datetime
from typing import Any

from functions.pipeline.approve_arm import ARM
from functions.store.audit import AUDIT
from tests.crash.world import World, harness_service, run_tables

ISO = re.compile(
    r"\d{4}-\d\d-\d\d[T ]\d\d:\d\d(:\d\d(\.\d+)?)?(Z|[+-]\d\d:?\d\d)?|\d{8}T\d{6}(\.\d+)?Z?"
)
DROP = {"etag", "Timestamp", "owner", "odata.etag", "odata.metadata"}
MULTISET_TABLES = ("audit", "rejected")
RETRY_LATER = "retry_later"  # functions.pipeline.approve: an approval to be tried again


def _norm(value: Any) -> Any:
    if isinstance(value, datetime | date):
        return "<t>"
    if isinstance(value, str):
        text = value.strip()
        if text[:1] in "{[" and text[-1:] in "}]":
            try:
                return _norm(json.loads(text))
            except ValueError:
                pass
        return ISO.sub("<t>", value)
    if isinstance(value, dict):
        return {k: _norm(v) for k, v in sorted(value.items()) if k not in DROP}
    if isinstance(value, list | tuple):
        return [_norm(v) for v in value]
    return value


AUTOMATIC = ("policy", "watchdog")


def _by(value: Any) -> Any:
    return "auto" if value in AUTOMATIC else value


def _acknowledged(attempt: dict[str, Any]) -> Any:
    """Rule 11: an ARM attempt that acknowledged (ARM's 200 text, or LANDED) is one thing."""
    outcome = str(attempt.get("outcome", ""))
    failed = outcome.startswith(("ARM ", "no token"))  # functions.approvers.arm's texts
    if attempt.get("vm") == ARM and outcome and not failed:
        return "acknowledged"  # ARM's 200 text, or one that starts with LANDED
    return attempt.get("outcome")


def _entity(table: str, entity: dict[str, Any]) -> dict[str, Any]:
    row = dict(entity)
    if table == "audit" and "by" in row:
        row["by"] = _by(row["by"])
    chunks = sorted(k for k in row if re.fullmatch(r"data\d*", k))
    if chunks:  # functions.store.rows splits a record's JSON over data, data1, ...
        row["data"] = "".join(
            str(row.pop(k)) for k in sorted(chunks, key=lambda k: int(k[4:] or 0))
        )
    out = _norm(row)
    data = out.get("data")
    if isinstance(data, dict):
        data.pop("drain_outcome", None)  # rule 12
    if isinstance(data, dict) and "approval_attempts" in data:
        arm = data.get("approved_by") == ARM
        attempts = {
            (a.get("vm"), _acknowledged(a) if arm else a.get("outcome"), _by(a.get("by")))
            for a in data["approval_attempts"]
        }
        data["approval_attempts"] = sorted(attempts, key=repr)
    if table == "deliveries":
        out.pop("claims", None)
    if table == "drains" and out.get("RowKey") == "approve" and out.get("status") == "succeeded":
        detail = str(out.get("detail", ""))
        if detail.startswith(("approved", "nothing to approve: already approved")):
            out["detail"] = "approved"
    if table == "identities" and isinstance(out.get("keys"), list):
        out["keys"] = sorted(k.get("id") for k in out["keys"] if isinstance(k, dict))
    return out


def table_rows(world: World) -> dict[str, list[dict[str, Any]]]:
    """Every row of the run's tables as stored, by table name (without the run's prefix):
    read once after a run, for both the snapshot and the invariants."""
    rows: dict[str, list[dict[str, Any]]] = {}
    with world.faults.paused():
        service = harness_service(world.connection)
        world.tables = run_tables(world.connection, world.prefix)
        for table in world.tables:
            client = service.get_table_client(table)
            rows[table[len(world.prefix) :]] = [dict(e) for e in client.list_entities()]
    return rows


def snapshot(world: World, tables: dict[str, list[dict[str, Any]]] | None = None) -> dict[str, Any]:
    """Every row of the run's tables (`tables`: as `table_rows` read them, else read here)
    and every outside effect, normalised."""
    state: dict[str, Any] = {}
    tables = table_rows(world) if tables is None else tables
    with world.faults.paused():
        for name, stored in tables.items():
            entities = list(stored)
            if name == "events":  # audit rows live in each event's partition, "a|..."
                audit = [e for e in entities if str(e.get("RowKey", "")).startswith(AUDIT)]
                entities = [e for e in entities if e not in audit]
                _bag(state, "audit", [_entity("audit", e) for e in audit])
            rows = [_entity(name, e) for e in entities]
            if name in MULTISET_TABLES:
                _bag(state, name, rows)
                continue
            for row in rows:
                state[f"{name} {row.get('PartitionKey')}/{row.get('RowKey')}"] = row
    state.update(effects(world))
    return state


def _bag(state: dict[str, Any], name: str, rows: list[dict[str, Any]]) -> None:
    """Rows compared as a multiset (their RowKeys hold when and in which process they
    were written); rows of one name from several tables add up."""
    bag = Counter(
        json.dumps({k: v for k, v in r.items() if k != "RowKey"}, sort_keys=True) for r in rows
    )
    for text, count in sorted(bag.items()):
        if name == "audit" and json.loads(text).get("outcome") == RETRY_LATER:
            count = 1  # rule 13: a try that will be retried, as a set
        # The row's opening to read, and a digest of the whole so that two rows alike in
        # their first 80 characters stay two.
        key = f"{name} {text[:80]} #{hashlib.sha256(text.encode()).hexdigest()[:8]}"
        if key in state:
            count += state[key]["count"]
        state[key] = {"row": json.loads(text), "count": count}


def effects(world: World) -> dict[str, Any]:
    servers = world.servers
    out: dict[str, Any] = {}
    out["effect topic"] = sorted(ISO.sub("<t>", mid) for mid in world.topic.seen)
    relay: Counter[str] = Counter()
    attempts: set[tuple[str, str]] = set()
    for vm, request in zip(servers.relay.targets, servers.relay.requests, strict=False):
        key = f"{vm} {request['path']} {','.join(request['EventIds'])}"
        attempt = request.get("AttemptId")
        if attempt and (key, attempt) in attempts:
            continue  # the relay answers a repeat of an AttemptId from memory
        if attempt:
            attempts.add((key, attempt))
        relay[key] += 1
    for key, count in relay.items():
        out[f"effect relay {key}"] = count
    hooks: Counter[str] = Counter()
    ids: set[str] = set()
    for request in servers.hook.requests:
        hook_id = {k.lower(): v for k, v in request.headers.items()}.get("webhook-id")
        if hook_id and hook_id in ids:
            continue
        if hook_id:
            ids.add(hook_id)
        body = request.json()
        hooks[f"{request.path} {body.get('EventId')} {body.get('action')}"] += 1
    for key, count in hooks.items():
        out[f"effect drain-hook {key}"] = count
    teams: set[str] = set()
    pagerduty: set[str] = set()
    webhook: set[str] = set()
    for channel, mid, request in servers.posts:
        mid = ISO.sub("<t>", mid)
        if channel in ("teams", "slack"):  # at least once: posted or not (rule 10)
            teams.add(f"{channel} {mid}")
        elif channel == "pagerduty":
            body = request.json()
            pagerduty.add(f"{mid} {body.get('event_action')} {body.get('dedup_key')}")
        else:
            hook_id = {k.lower(): v for k, v in request.headers.items()}.get("webhook-id")
            webhook.add(f"{mid} {ISO.sub('<t>', hook_id or '')}")
    for key in teams:
        out[f"effect {key}"] = 1
    out["effect pagerduty"] = sorted(pagerduty)
    out["effect webhook"] = sorted(webhook)
    if servers.arm is not None:
        calls = [c for c in servers.arm.arm.calls if c.path.endswith("/acknowledge")]
        acked = {c.path.rsplit("/", 2)[-2] for c in calls if c.status == 200}
        acks = Counter(
            f"{call.path.rsplit('/', 2)[-2]} {call.status}"
            for call in calls
            if not (call.status == 409 and call.path.rsplit("/", 2)[-2] in acked)
        )
        for key, count in acks.items():
            out[f"effect arm acknowledge {key}"] = count
    return out


def first_difference(expected: dict[str, Any], got: dict[str, Any]) -> str:
    """A short line naming the first row or effect that differs, and how ("" if none)."""
    for key in sorted(set(expected) | set(got), key=_order):
        want, have = expected.get(key), got.get(key)
        if want == have:
            continue
        if want is None:
            return f"{key}: extra {_short(have)}"
        if have is None:
            return f"{key}: missing ({_short(want)})"
        return f"{key}: {_field_diff(want, have)}"
    return ""


def _order(key: str) -> tuple[int, str]:
    # Effects first (what reached the outside), then the event rows, then the rest.
    rank = 0 if key.startswith("effect") else 1 if key.startswith("events") else 2
    return rank, key


def _field_diff(want: Any, have: Any, path: str = "") -> str:
    if isinstance(want, dict) and isinstance(have, dict):
        for key in sorted(set(want) | set(have)):
            if want.get(key) != have.get(key):
                return _field_diff(want.get(key), have.get(key), f"{path}.{key}" if path else key)
    if isinstance(want, list) and isinstance(have, list) and len(want) == len(have):
        for index, (a, b) in enumerate(zip(want, have, strict=True)):
            if a != b:
                return _field_diff(a, b, f"{path}[{index}]")
    return f"{path or 'value'} {_short(want)} -> {_short(have)}"


def _short(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= 90 else text[:87] + "..."
