"""What must hold at the end of every explored run, fault-free or not (issue 37), checked
on the run's own rows and effects, as FoundationDB's workloads check theirs:

1. no claim left in progress once its event has ended (an approval `in_progress`, or an
   announcement still pending, on an ended event);
2. every StartRequests that reached Azure (a relay's 200 with IMDS's 200) and every ARM
   acknowledge that did (200) is announced `approved` exactly once (one MessageId on the
   topic) and audited (an "approved via" audit row);
3. no slot held by an event that is neither in flight nor started
   (functions.pipeline.slot_rules.holds_slot, on the holder's own row);
4. every VM a drain took out of service (a drain hook reached) is put back (its undrain
   reached) or its event was approved;
5. the bridge's own approvals never put more of a budget group out at once than it allows
   (issue 45: a StartRequests that reached Azure counts from then until its event ended,
   answered or not);
6. no event's `decided` is on the topic after its `approved` (each channel's subscription
   gets the topic's order): an operator reads the decision, then its approval (issue 46).

A comparison with the fault-free run catches a crash that changes the outcome; these catch
an outcome that is wrong in every run alike.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from typing import Any

from functions.model.event import Transition
from functions.pipeline.slot_rules import holds_slot
from functions.store import claims
from functions.store.audit import AUDIT
from functions.store.records import EventRecord
from tests.crash.world import World, harness_service

INVARIANTS = ("claims", "approved", "slots", "undrained", "budget", "order")


def _rows(world: World, table: str) -> list[dict[str, Any]]:
    client = harness_service(world.connection).get_table_client(world.prefix + table)
    return [dict(e) for e in client.list_entities()]


def _record(row: dict[str, Any]) -> EventRecord | None:
    chunks = sorted((k for k in row if re.fullmatch(r"data\d*", k)), key=lambda k: int(k[4:] or 0))
    if not chunks:
        return None
    try:
        return EventRecord.model_validate_json("".join(str(row[k]) for k in chunks))
    except ValueError:
        return None


def check(world: World, tables: dict[str, list[dict[str, Any]]] | None = None) -> list[str]:
    """Every invariant that does not hold, one line each ("" : all hold). `tables`: the
    run's rows as tests.crash.state.table_rows read them (else read here)."""
    if tables is None:
        with world.faults.paused():
            tables = {name: _rows(world, name) for name in ("events", "audit")}
    stored = tables.get("events", [])
    events = [r for r in stored if r.get("RowKey") == "event"]
    records = {rec.event_id: rec for rec in (_record(r) for r in events) if rec}
    slots = [r for r in stored if r.get("RowKey") == "slots"]
    audit = [r for r in stored if str(r.get("RowKey", "")).startswith(AUDIT)]
    audit += tables.get("audit", [])
    broken: list[str] = []
    now = world.clock.now()
    for event_id, rec in sorted(records.items()):
        if rec.ended and rec.approval == "in_progress":
            broken.append(f"claims: {event_id} ended with its approval in progress")
        pending = [k for k, m in rec.announced.items() if claims.is_pending(m)]
        if rec.ended and pending:
            broken.append(f"claims: {event_id} ended with {pending} pending")
    reached: Counter[str] = Counter()
    for request in world.servers.relay.requests:
        ok = request.get("status") == 200 and request.get("imds_status") == 200
        if request["path"] == "/v1/start" and ok:
            for event_id in request["EventIds"]:
                reached[event_id] += 1
    if world.servers.arm is not None:
        for call in world.servers.arm.arm.calls:
            if call.path.endswith("/acknowledge") and call.status == 200:
                reached[call.path.rsplit("/", 2)[-2]] += 1
    announced: Counter[str] = Counter(
        note.event.event_id
        for note in world.topic.messages
        if note.transition is Transition.APPROVED and note.event is not None
    )
    audited = {
        str(row.get("PartitionKey", "")).casefold()
        for row in audit
        if row.get("action") == "approve" and str(row.get("outcome", "")).startswith("approved")
    }
    for event_id in sorted(reached):
        if announced[event_id] != 1:
            broken.append(
                f"approved: {event_id} reached Azure, announced approved {announced[event_id]}x"
            )
        if event_id.casefold() not in audited:
            broken.append(f"approved: {event_id} reached Azure, no approval audit row")
    for row in slots:
        chunks = sorted(
            (k for k in row if re.fullmatch(r"data\d*", k)), key=lambda k: int(k[4:] or 0)
        )
        try:
            holders = json.loads("".join(str(row[k]) for k in chunks) or "{}").get("holders", [])
        except ValueError:
            continue
        for holder in holders:
            if not holds_slot(records.get(holder), now):
                broken.append(f"slots: {holder} holds {row.get('PartitionKey')} unentitled")
    drained: set[str] = set()
    undrained: set[str] = set()
    for request in world.servers.hook.requests:
        body = request.json()
        event_id = str(body.get("EventId"))
        if request.path.endswith("/drain") and body.get("action") == "drain":
            drained.add(event_id)
        if request.path.endswith("/undrain"):
            undrained.add(event_id)
    for event_id in sorted(drained - undrained):
        rec = records.get(event_id)
        if rec is None or rec.approval != "approved":
            broken.append(f"undrained: {event_id} was drained, neither undrained nor approved")
    broken += _budget(world, records)
    broken += _order(world)
    return broken


def _order(world: World) -> list[str]:
    """A `decided` published after its event's `approved` (the topic keeps one copy of
    each MessageId, in the order sent)."""
    approved: set[str] = set()
    broken = []
    for note in world.topic.messages:
        event_id = note.event.event_id if note.event is not None else ""
        if note.transition is Transition.APPROVED:
            approved.add(event_id)
        elif note.transition is Transition.DECIDED and event_id in approved:
            broken.append(f"order: {event_id} announced decided after approved")
    return broken


def _budget(world: World, records: dict[str, EventRecord]) -> list[str]:
    """Each event of the scenario's budget group is out from its first StartRequests that
    reached Azure until its row says it ended; at no such start may more than the limit be
    out."""
    group = set(world.config.budget_events)
    if not group:
        return []
    first: dict[str, Any] = {}
    for request in world.servers.relay.requests:
        ok = request.get("status") == 200 and request.get("imds_status") == 200
        if request["path"] == "/v1/start" and ok and request.get("when") is not None:
            for event_id in request["EventIds"]:
                if event_id in group:
                    first.setdefault(event_id, request["when"])
    limit = world.config.budget_limit
    broken = []
    for event_id, began in first.items():
        out = []
        for other, since in first.items():
            ended = records[other].ended_at if other in records else None
            if since <= began and (ended is None or began < ended):
                out.append(other)
        if len(out) > limit:
            broken.append(f"budget: {event_id} started with {sorted(out)} out (limit {limit})")
    return broken
