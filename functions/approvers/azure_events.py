"""What Azure itself says about a scheduled event: Resource Graph's `maintenanceresources`.

The ARM approver acknowledges an event for every VM it names, with no relay asked, so it
must never act on a relay's report alone: a set-mate can report the victim's event with a
shorter duration or itself added to `Resources`, and a decision made on that view must not
reach Azure through the app's own identity. Before acknowledging, the approver therefore
reads the event as Azure publishes it (SPEC.md: with `eventGridAndResourceGraph` opted in,
Resource Graph's `maintenanceresources` holds `microsoft.maintenance/scheduledevents` rows
with the IMDS fields as `properties`) and compares it with the view the decision rests on,
field by field, as the relay compares its IMDS (relay/expect.py).

One query per ARM approval attempt (rare: only when no relay approved), with the function
app's identity (Reader on the VMs' scopes, as for the VM facts): the query is asked by
functions.approvers.arm (`lookup`), beside the acknowledge it may settle; this module
says what the answer means, and asks nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, NamedTuple

from pydantic import BaseModel

from functions.model.arm import ArmError, ArmResource, parse_event_id
from functions.model.envelope import parse_not_before

log = logging.getLogger(__name__)

EVENT_TYPE = "microsoft.maintenance/scheduledevents"
# Azure's EventStatus once an event waits for no approval (Resource Graph and Event Grid
# also report Completed and Canceled; a Canceled event was never started by anyone).
NOT_WAITING = frozenset({"started", "completed"})


class AzureEvent(BaseModel):
    """One scheduled event as Resource Graph holds it."""

    id: str  # .../providers/Microsoft.Compute/{type}/{name}/providers/microsoft.maintenance/...
    event_id: str
    properties: dict[str, Any]


def differences(expected: Mapping[str, Any], properties: Mapping[str, Any]) -> list[str]:
    """What differs between the decided view (`VmView.expect()`) and Azure's event, in the
    relay's terms: types and sources case-insensitively, the duration exactly, NotBefore
    as an instant, Resources as a set of names."""
    found: list[str] = []
    for name in ("EventType", "EventSource"):
        if name in expected:
            wanted = expected[name] or ""
            value = properties.get(name)
            text = value if isinstance(value, str) else ""
            if wanted.casefold() != text.casefold():
                found.append(f"{name} '{wanted}' decided, Azure says '{text[:64]}'")
    if "DurationInSeconds" in expected:
        actual = properties.get("DurationInSeconds")
        if actual != expected["DurationInSeconds"] or isinstance(actual, bool):
            found.append(
                f"DurationInSeconds {expected['DurationInSeconds']} decided, Azure says {actual}"
            )
    if "NotBefore" in expected and not _same_instant(
        expected["NotBefore"], properties.get("NotBefore")
    ):
        found.append(
            f"NotBefore '{expected['NotBefore']}' decided, "
            f"Azure says '{str(properties.get('NotBefore') or '')[:64]}'"
        )
    if "Resources" in expected:
        listed = properties.get("Resources")
        actual_names = {str(n).casefold() for n in listed} if isinstance(listed, list) else set()
        if actual_names != {n.casefold() for n in expected["Resources"]}:
            found.append("Resources differ from Azure's")
    return found


class Reading(NamedTuple):
    """What Azure's row for an event lets the ARM approver do (`read`): acknowledge it on
    `owner`; or record it approved, an earlier acknowledge having landed on `landed`;
    or neither, and `why_not` says why. `status`: Azure's EventStatus for the event."""

    status: str
    owner: ArmResource | None = None
    landed: str = ""
    why_not: str = ""


def read(
    azure: AzureEvent, expected: Mapping[str, Any], *, sent: bool, before_not_before: bool
) -> Reading:
    """Decide from Azure's row alone (pure; functions.pipeline.approve_arm does the asking
    and the acknowledging): `expected` is the decided view (`VmView.expect()`), `sent`
    whether an acknowledge of ours may have landed before (`arm_sent_at`), and
    `before_not_before` whether Azure cannot have started the event on its own yet. An
    event Azure reports Started or Completed after our acknowledge was sent is that
    acknowledge's work, unless NotBefore has passed; else Azure's view must agree with the
    decided one field by field, and its id names the owner to acknowledge on."""
    status = str(azure.properties.get("EventStatus") or "")
    differing = differences(expected, azure.properties)
    try:
        owner, unusable = parse_event_id(azure.id)[0], ""
    except ArmError as exc:
        owner, unusable = None, str(exc)
    if sent and status.casefold() in NOT_WAITING:
        if not before_not_before:
            return Reading(
                status,
                why_not=f"Azure reports the event {status}, and its NotBefore has passed: "
                "Azure started it then, or an earlier acknowledge did (its answer was lost)",
            )
        return Reading(status, landed=owner.id if owner is not None else "its owner")
    if differing:
        return Reading(
            status,
            why_not="Azure reports the event otherwise than decided: " + "; ".join(differing),
        )
    if owner is None:
        return Reading(status, why_not=f"Azure's event id is unusable: {unusable}")
    return Reading(status, owner=owner)


def _same_instant(wanted: object, actual: object) -> bool:
    try:
        mine = parse_not_before(actual or None)
        theirs = parse_not_before(wanted or None)
    except ValueError:
        return False
    if mine is None or theirs is None:
        return mine is None and theirs is None
    return int(mine.timestamp()) == int(theirs.timestamp())
