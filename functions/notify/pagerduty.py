"""PagerDuty Events API v2: `trigger` for paging transitions, `resolve` when it is over.

`dedup_key` names the incident, namespaced by kind so that no string a VM chooses can
reach another kind's key: `event:<EventId>` (one event is one incident however many VMs
report it and however often a transition is redelivered), `relay-silent:<vm>` (resolved
by `relay_recovered`), `relay-silent-group:<scale set or subscription>` (the relays of a
group found silent together: one incident, not one per VM; functions.pipeline.
silence_groups), `policy_invalid:fleet` and `config_invalid:<what>` (resolved when
valid again). A VM reporting an event with EventId `relay-silent:victim` pages and
resolves `event:relay-silent:victim`, never the victim's relay incident.

A resolve goes only where a trigger went: each trigger posted marks its key (`Marks`: the
deliveries table in Azure, so fleet-wide), and a resolve for a key with no mark is not
sent (PagerDuty would accept it, and an on-call's log would show an event "resolved" that
never paged). The mark stays after the resolve, like the key's delivery rows: a resolve
redelivered after a crash is sent again (PagerDuty ignores it), never left half-recorded.

Every text a VM wrote that PagerDuty shows (summary, source, component, group, class) is
on one line and defanged (`describe.defanged`: `evil[.]example`), as it may reach an SMS.
"""

from __future__ import annotations

import logging
from typing import Any, Literal

from functions.model.event import Notification, Transition
from functions.notify import describe
from functions.notify.delivery import Marks, Transport, dumps, post_json

log = logging.getLogger(__name__)

SUMMARY_LIMIT = 1024
DEDUP_KEY_LIMIT = 255
SEVERITIES = ("info", "warning", "error", "critical")
CLIENT = "Azure Scheduled Events bridge"

# Transitions that page whatever the decision said, and their least severity.
ALWAYS_PAGE = {
    Transition.APPROVAL_FAILED: "error",
    Transition.DRAIN_FAILED: "error",
    Transition.RELAY_SILENT: "warning",
    Transition.POLICY_INVALID: "error",
    Transition.UNDRAIN_FAILED: "error",
    Transition.CONFIG_INVALID: "error",
}
RESOLVING = frozenset(
    {
        Transition.COMPLETED,
        Transition.CANCELLED,
        Transition.RELAY_RECOVERED,
        Transition.UNDRAINED,
        Transition.POLICY_VALID,
        Transition.CONFIG_VALID,
    }
)


# Progress, not alarms: never a trigger, even for an event whose decision pages.
PROGRESS = frozenset(
    {Transition.SCHEDULED, Transition.APPROVED, Transition.STARTED, Transition.DRAIN_STARTED}
)


def action_for(note: Notification) -> Literal["trigger", "resolve"] | None:
    if note.transition in RESOLVING:
        return "resolve"
    # The announcer (functions.pipeline.announce) sets `page` from the policy's POLICY__PAGE__*
    # settings; when present it is the authority. Without it, the defaults below apply.
    explicit = getattr(note, "page", None)
    if note.transition is Transition.DECIDED and (note.occurrence or "").startswith("redecided-"):
        # Decided again on a valid policy: the fail-closed page (same dedup_key) is over
        # unless the new decision pages on its own.
        pages = (
            explicit if isinstance(explicit, bool) else bool(note.decision and note.decision.page)
        )
        return "trigger" if pages else "resolve"
    if isinstance(explicit, bool):
        return "trigger" if explicit and note.transition not in PROGRESS else None
    if note.transition in ALWAYS_PAGE:
        return "trigger"
    if note.transition is Transition.DECIDED and note.decision is not None and note.decision.page:
        return "trigger"
    return None


def dedup_key(note: Notification) -> str:
    """The incident's key, its kind first (see the module's docstring)."""
    if note.event is not None:
        key = f"event:{note.event.event_id}"
    elif note.transition is Transition.RELAY_SILENT and note.silent_group:
        # One incident per common-cause group (functions.pipeline.silence_groups): later
        # sweeps' stragglers of the same group join it.
        key = f"relay-silent-group:{note.silent_group}"
    elif note.transition in (Transition.RELAY_SILENT, Transition.RELAY_RECOVERED):
        key = f"relay-silent:{note.vm or 'unknown'}"
    elif note.transition is Transition.POLICY_VALID:
        key = f"{Transition.POLICY_INVALID.value}:{note.vm or 'fleet'}"  # what it resolves
    elif note.transition is Transition.CONFIG_VALID:
        key = f"{Transition.CONFIG_INVALID.value}:{note.vm or 'fleet'}"
    else:
        key = f"{note.transition.value}:{note.vm or 'fleet'}"
    return key[:DEDUP_KEY_LIMIT]


def severity(note: Notification) -> str:
    chosen = note.decision.severity if note.decision else "warning"
    floor = ALWAYS_PAGE.get(note.transition)
    if floor and SEVERITIES.index(floor) > SEVERITIES.index(chosen):
        return floor
    return chosen


def _source(note: Notification) -> str:
    event = note.event
    if note.vm:
        return note.vm
    if note.silent_label:
        return note.silent_label
    if event is not None:
        if len(event.scale_sets) == 1:
            return event.scale_sets[0]
        if len(event.availability_sets) == 1:
            return event.availability_sets[0]
        if event.resources:
            return event.resources[0]
    return "scheduled-events-bridge"


def _group(note: Notification) -> str | None:
    event = note.event
    if event is None:
        return note.silent_label or None
    sets = event.scale_sets + event.availability_sets
    return ",".join(sets)[:255] if sets else None


def _links(note: Notification) -> list[dict[str, str]]:
    links = []
    if note.links.status_url:
        links.append({"href": note.links.status_url, "text": "Fleet status"})
    if note.links.approve_url and note.transition is not Transition.RELAY_SILENT:
        links.append({"href": note.links.approve_url, "text": "Approve manually"})
    return links


def _summary(note: Notification) -> str:
    text = describe.headline(note)
    if note.decision is not None:
        text += f" — {describe.decision_text(note.decision)}"
    if note.detail:
        text += f" — {note.detail}"
    text = describe.defanged(text)
    return text if len(text) <= SUMMARY_LIMIT else text[: SUMMARY_LIMIT - 1] + "…"


def _plain_or_none(text: str | None) -> str | None:
    return (describe.defanged(text)[:255] or None) if text else None


def build_event(note: Notification, routing_key: str) -> dict[str, Any] | None:
    """The Events v2 body for this transition, or None when PagerDuty has no part in it."""
    action = action_for(note)
    if action is None:
        return None
    body: dict[str, Any] = {
        "routing_key": routing_key,
        "event_action": action,
        "dedup_key": dedup_key(note),
    }
    if action == "resolve":
        return body
    details: dict[str, Any] = {"transition": note.transition.value}
    if note.event is not None:
        details.update(note.event.imds_fields())
        details["ReportedBy"] = list(note.event.reported_by)
        if note.event.unlisted:
            details["ResourcesNotListed"] = note.event.unlisted
    if note.decision is not None:
        details["decision"] = note.decision.model_dump(mode="json")
    if note.detail:
        details["detail"] = note.detail
    if note.waiting:
        details["waiting"] = note.waiting
    if note.late:
        details["late"] = note.late
    if note.vm:
        details["vm"] = note.vm
    if note.silent_group:
        details["silent_count"] = note.silent_count
        details["silent_vms"] = list(note.silent_vms)
    payload: dict[str, Any] = {
        "summary": _summary(note),
        "source": describe.defanged(_source(note))[:255] or "scheduled-events-bridge",
        "severity": severity(note),
        "timestamp": note.occurred_at.isoformat(),
        "component": _plain_or_none(
            note.vm or (note.event.resources[0] if note.event and note.event.resources else None)
        ),
        "group": _plain_or_none(_group(note)),
        "class": describe.defanged(note.event.event_type if note.event else note.transition.value),
        "custom_details": details,
    }
    body["payload"] = {key: value for key, value in payload.items() if value is not None}
    body["client"] = CLIENT
    if note.links.status_url:
        body["client_url"] = note.links.status_url
    links = _links(note)
    if links:
        body["links"] = links
    return body


def never_paged(note: Notification, marks: Marks) -> bool:
    """A resolve for a key no trigger marked: nothing to send (see the module's docstring)."""
    return action_for(note) == "resolve" and not marks.marked(PAGED + dedup_key(note))


PAGED = "pagerduty-paged:"  # the mark a posted trigger leaves on its key


def send(
    note: Notification,
    *,
    routing_key: str,
    url: str,
    transport: Transport,
    marks: Marks | None = None,
) -> bool:
    """Send the trigger or resolve; False when this transition is not PagerDuty's business
    (or, with `marks`, a resolve for a key no trigger marked).

    PagerDuty answers 202 on success; 429 and 5xx are retried (PagerDuty asks for backoff),
    400 means the event itself is invalid and raises PermanentDeliveryError with its text.
    """
    marks = marks if marks is not None else transport.marks
    body = build_event(note, routing_key)
    if body is None:
        return False
    key = body["dedup_key"]
    if body["event_action"] == "resolve" and not marks.marked(PAGED + key):
        log.info("pagerduty: no resolve for %s: it was never paged", key)
        return False
    if body["event_action"] == "trigger":
        marks.mark(PAGED + key)  # before the post: a trigger whose answer is lost still counts
    response = post_json(transport, "pagerduty", url, dumps(body))
    if response.status_code != 202:
        log.warning("pagerduty: answered %d where 202 was expected", response.status_code)
    log.info("pagerduty: %s %s", body["event_action"], key)
    return True
