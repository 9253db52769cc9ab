"""Silent relays announced per common cause (issue 44 item 4): one announcement, and so one
PagerDuty incident, per scale set (or, for VMs in none, per subscription) listing the relays
the sweep found silent together, not one per VM.

A cause shared by thousands of VMs (an NSG change, a bad relay build, an expired SAS) makes
their relays silent within one heartbeat interval, so the sweeps of those minutes find them
together. Each VM's silence is still claimed once in its own row (functions.store.claims, as
before: the claim names the silence it is for); the sweep then publishes one `relay_silent`
per group with the VMs it claimed, settles each claim once that publish is done, and
releases them if it fails (the next sweep claims and publishes them again). A group of one
is announced exactly as before (its `vm`, dedup_key `relay-silent:<vm>`, resolved by its
`relay_recovered`); a group of two or more carries `silent_group` and `silent_vms`, and its
PagerDuty dedup_key is `relay-silent-group:<group>`, the same for every sweep, so the
stragglers of the next sweeps join the open incident instead of opening their own.
Recoveries stay per VM (cards; they resolve only a per-VM incident).
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from functions.model.event import Notification, Transition
from functions.pipeline.relay_recovery import silence_occurrence
from functions.store.records import VmRecord

log = logging.getLogger("functions.pipeline.watchdog")

MAX_NAMED = 50  # VMs named in the announcement's text (all are in `silent_vms`, up to the cap)
MAX_LISTED = 1000  # VMs listed in `silent_vms` (PagerDuty's payload stays far below 512 KB)
_SUBSCRIPTION = re.compile(r"^/subscriptions/([0-9A-Fa-f-]{36})/", re.IGNORECASE)


@dataclass(frozen=True)
class Claimed:
    """A VM whose silence this sweep claimed: to announce, then settle (or release)."""

    name: str
    vm_id: str
    mark: str
    last_seen: datetime
    group: str
    label: str
    event_ids: tuple[str, ...]  # its open events, reconciled once its silence is announced


def group_of(vm: VmRecord) -> tuple[str, str]:
    """(key, words) of the VM's common-cause group: its scale set, else its subscription,
    else the fleet. Azure's facts (the VM row), never the relay's word."""
    match = _SUBSCRIPTION.match(vm.resource_id or "")
    subscription = match.group(1).lower() if match else ""
    if vm.scale_set:
        key = f"vmss:{subscription}/{vm.scale_set.casefold()}"
        return key, f"scale set {vm.scale_set}"
    if subscription:
        return f"subscription:{subscription}", f"subscription {subscription}"
    return "fleet", "the fleet"


def group_claims(claims: list[Claimed]) -> dict[str, list[Claimed]]:
    out: dict[str, list[Claimed]] = {}
    for claim in claims:
        out.setdefault(claim.group, []).append(claim)
    return out


def announcement(group: list[Claimed], now: datetime, page: bool) -> Notification:
    """The one `relay_silent` for the VMs of a group found silent in this sweep."""
    if len(group) == 1:
        (one,) = group
        minutes = int((now - one.last_seen).total_seconds() // 60)
        return Notification(
            transition=Transition.RELAY_SILENT,
            occurred_at=now,
            vm=one.name,
            detail=f"relay on {one.name} silent for {minutes} min (last seen {one.mark})",
            occurrence=silence_occurrence(one.last_seen),
            page=page,
        )
    members = sorted(group, key=lambda c: c.name.casefold())
    names = [c.name for c in members]
    first = min(c.last_seen for c in members)
    shown = ", ".join(names[:MAX_NAMED])
    more = f" and {len(names) - MAX_NAMED} more" if len(names) > MAX_NAMED else ""
    label = members[0].label
    detail = (
        f"relays of {len(names)} VMs in {label} went silent together (the earliest last seen "
        f"{first.isoformat()}): {shown}{more}. A cause they share (a network rule, a relay "
        f"build, their credentials) is likelier than {len(names)} separate failures."
    )
    # The occurrence names exactly these silences, so a republish of this announcement is
    # the same message (Service Bus drops it) and another sweep's is a new one.
    digest = hashlib.sha256(
        "\n".join(f"{c.name.casefold()} {c.mark}" for c in members).encode()
    ).hexdigest()[:24]
    return Notification(
        transition=Transition.RELAY_SILENT,
        occurred_at=now,
        detail=detail,
        occurrence=f"group:{digest}",
        page=page,
        silent_group=members[0].group,
        silent_label=label,
        silent_vms=names[:MAX_LISTED],
        silent_count=len(names),
    )


def publish_groups(
    claims: list[Claimed],
    now: datetime,
    page: bool,
    publish: Callable[[Notification], None],
    settle: Callable[[Claimed, bool], None],
) -> tuple[list[str], list[str]]:
    """One announcement per group; each VM's claim settled done after its group's publish,
    released when it failed. Returns (VMs announced, VMs whose announcement failed)."""
    done: list[str] = []
    failed: list[str] = []
    for members in group_claims(claims).values():
        try:
            publish(announcement(members, now, page))
        except Exception:
            log.exception("watchdog: announcing %d silent relay(s)", len(members))
            for claim in members:
                try:
                    settle(claim, False)
                except Exception:  # its claim goes stale and is redone (SILENCE_LEASE)
                    log.exception("watchdog: releasing the silence of %.200r", claim.name)
            failed += [c.name for c in members]
            continue
        for claim in members:
            try:
                settle(claim, True)
            except Exception:  # published: the next sweep finds the claim and settles it
                log.exception("watchdog: settling the silence of %.200r", claim.name)
        done += [c.name for c in members]
    return done, failed
