"""The relay phase of an approval (functions.pipeline.approve): which named VMs' relays
may be asked, and asking them in turn with backoff, each VM within its lane.

Each relay is asked to confirm its own VM's view of the event (`view_for`, `Expect`) and
approves only if its own IMDS lists it so. A VM whose own reporter row lists the event
lately is found from that row's attested vmId and its identity row alone (no VM row:
issue 47); the others through their VM row and liveness hint. A VM whose approved event
never started in its own view is not asked for a while (`suspect`: decided here, beside
the reads of the VM and identity rows it judges, so choosing the relays does not call
back into the slot rules; issue 46)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Protocol

import requests

from functions.approvers.arm import BACKOFF_MAX_SECONDS, BACKOFF_START_SECONDS
from functions.approvers.relay import DIFFERS, PASSING_4XX, RelayTarget, post_start
from functions.clock import Clock
from functions.model.view import VmView
from functions.pipeline.anchor import relay_of
from functions.pipeline.approve_arm import ARM, Phase
from functions.pipeline.context import Pipeline
from functions.pipeline.lanes import RelayLanes
from functions.store.records import Attempt, EventRecord
from functions.store.reporters import Reporter

# The relays one attempt asks at most (reporters first): an event naming 1,000 VMs costs
# an attempt a few relays' deadlines, not a thousand.
RELAYS_PER_ATTEMPT = 8


def relay_phase(
    pipeline: Pipeline,
    record: EventRecord,
    by: str,
    now: datetime,
    stop: datetime,
    deadline: datetime,
    arm_next: bool,
    rows: list[Reporter],
    stricter_own: set[str],
    only: tuple[str, ...] | None = None,
) -> Phase:
    """Relays of the named VMs. With ARM next, relays get ARM_FALLBACK_AFTER_SECONDS from
    their first attempt (kept in the row across invocations) and no waiting for relays
    not heard yet: ARM can approve now. `rows`: the event's reporter rows, as the
    approval's caller read them, each VM's own view loaded from them into
    `record.reporter_views` (functions.pipeline.approve); `stricter_own`: the VMs whose own
    view decided stricter than the event, not asked except by a person."""
    settings, clock = pipeline.settings, pipeline.clock
    handover = deadline
    if arm_next:
        tried = [a.at for a in record.approval_attempts if a.vm and a.vm != ARM]
        first = min(tried) if tried else now
        handover = min(deadline, first + timedelta(seconds=settings.arm_fallback_after_seconds))
    differs = [a for a in record.approval_attempts if a.outcome.startswith(DIFFERS)]
    if differs:
        return Phase(outcome="vetoed", detail=f"{differs[-1].vm}'s relay: {differs[-1].outcome}")
    # A relay that refused for good is not asked again for this event, in this call or later.
    refused: set[str] = {
        a.vm for a in record.approval_attempts if a.vm is not None and final_refusal(a.outcome)
    }
    not_approving: set[str] = set() if by.startswith("manual:") else set(stricter_own)
    if only is not None:
        allowed = {name.casefold() for name in only}
        not_approving |= {name for name in record.resources if name.casefold() not in allowed}
    skip = refused.union(not_approving)
    relays = _relays(pipeline, record, now, skip=skip, rows=rows)
    unheard = len({r.casefold() for r in record.resources}) > len(relays) + len(skip)
    if not relays:
        # The named VMs' relays may simply not have reported yet (a set-mate's document
        # came first): wait for them while there is time, then give up.
        waiting = unheard and not arm_next and clock.now() < deadline
        return Phase(
            outcome="later" if waiting else "exhausted",
            detail="no VM named in Resources has a relay that reported recently with an "
            "attested key and an address Azure knows"
            + (f" (refused before: {', '.join(sorted(refused))})" if refused else ""),
        )
    return _try_relays(
        record,
        relays,
        pipeline.session,
        clock,
        min(stop, handover),
        handover,
        by,
        unheard and not arm_next,
        pipeline.relay_lanes,
    )


def final_refusal(outcome: str) -> bool:
    """Whether a recorded attempt means "never ask this relay again for this event", from
    its outcome as functions.approvers.relay words it (read here, beside its one use).
    Attempts recorded before the 4xx were sorted (`refused 401: ...`) count only when
    their status is one that stays true."""
    if outcome.startswith(DIFFERS):
        return True
    if not outcome.startswith("refused "):
        return outcome.startswith("relay answered")
    code = outcome.removeprefix("refused ").split(":", 1)[0]
    return not (code.isdigit() and int(code) in PASSING_4XX)


def view_for(record: EventRecord, vm_name: str) -> VmView:
    """The view of the event the decision for `vm_name` rests on, as that VM's relay must
    see it in its own IMDS: its own view, as its reporter row keeps it (loaded into
    `record.reporter_views` by the relay phase). A named VM that has not reported the
    event (or ARM's "") gets the event as stored."""
    own = record.reporter_views.get(vm_name.casefold())
    if own is not None:
        return own
    return VmView.of(vm_name, record)


def expect_for(record: EventRecord, vm_name: str) -> dict[str, object]:
    """The callback's `Expect` entry: `view_for(...).expect()`, without Resources when the
    row could not keep every name (an event naming more than MAX_RESOURCES VMs)."""
    expect = view_for(record, vm_name).expect()
    if record.resources_dropped:
        expect.pop("Resources")
    return expect


# Named VMs that have not reported the event whose rows one attempt reads at most: the
# event's reporters come first (one query of its reporter rows), so a `Resources` list a
# VM made up (999 names no relay reported) costs this many point reads, not 999.
MAX_UNREPORTED_READS = 4


def candidates(record: EventRecord, skip: set[str]) -> list[str]:
    """The named VMs an attempt may ask, in `Resources` order (first is leader): those
    that reported the event (their own views are loaded in `record.reporter_views`), then
    at most MAX_UNREPORTED_READS of the rest."""
    reported = record.reporter_views
    named = [n for n in record.resources if n not in skip]
    first = [n for n in named if n.casefold() in reported]
    rest = [n for n in named if n.casefold() not in reported][:MAX_UNREPORTED_READS]
    return first + rest


# How long a VM whose approved event never started in its own view stays suspect (its
# relay not asked to approve): its own documents cannot end it sooner (issue 46). The
# flag is set by functions.pipeline.announce.flag_unstarted (its rule: flags_unstarted).
UNSTARTED_FOR = timedelta(hours=24)


class Flagged(Protocol):
    """Where a VM's `unstarted` flag is kept: its VM row, and its identity row (which the
    approver reads for the relay's address and keys anyway: functions.pipeline.approve)."""

    @property
    def unstarted(self) -> str | None: ...

    @property
    def unstarted_at(self) -> datetime | None: ...


def suspect(vm: Flagged, event_id: str, now: datetime) -> bool:
    """Whether this VM's relay is not asked to approve `event_id`: an event approved
    through it stayed Scheduled in its own view (`unstarted`), less than UNSTARTED_FOR
    ago. A flag of before `unstarted_at` was kept has lapsed."""
    if not vm.unstarted or vm.unstarted == event_id or vm.unstarted_at is None:
        return False
    return now < vm.unstarted_at + UNSTARTED_FOR


@dataclass(frozen=True)
class Asked:
    """A relay an attempt may ask: its VM's name, whether that VM's latest document lists
    the event, and where and how to call it (Azure's address, the attested keys)."""

    name: str
    reported: bool
    target: RelayTarget


def _relays(
    pipeline: Pipeline,
    record: EventRecord,
    now: datetime,
    skip: set[str],
    rows: list[Reporter] | None = None,
) -> list[Asked]:
    """Named VMs whose relays were heard recently (a message, or a verified liveness
    hint), reporters first (`candidates`): at most RELAYS_PER_ATTEMPT of them, so an event
    naming 1,000 VMs costs a few point reads, not 1,000 (the others stay "unheard": a
    later attempt reaches them). A VM whose approved event never started in its own view
    (`unstarted`) is not asked for a while (`suspect`).

    A VM whose own reporter row (`rows`, read with the event) says it lists the event,
    lately, with its attested vmId, was heard by that document: its identity row alone
    (address, keys, `unstarted`) is read, not its VM row too (issue 47: 6 Table requests
    per approval, 5 with this). Others are found as before, through the VM row.

    The reads are made here, in this order, beside the pure checks they feed (issue 46):
    the VM row when needed, the identity row, the anchor's liveness row only for an
    unflagged row holding an unproven key (anchor.relay_of), the VM's liveness hint only
    when its row is stale."""
    fresh = timedelta(seconds=pipeline.settings.relay_silent_after_seconds)
    own = {row.vm.casefold(): row for row in rows or ()}
    admission, liveness = pipeline.admission, pipeline.store.liveness
    verify = pipeline.liveness_verifier
    registry = admission.registry if admission is not None else None  # None: no relay known
    port = admission.callback_port if admission is not None else 0
    chosen: list[Asked] = []
    for name in candidates(record, skip):
        if len(chosen) >= RELAYS_PER_ATTEMPT:
            break
        row = own.get(name.casefold())
        vm = None  # its VM row: read only when its own reporter row does not vouch for it
        if row is not None and row.status and row.vm_id and _lately(row.seen, now, fresh):
            vm_id, shown = row.vm_id, row.vm
        else:
            vm = pipeline.store.get_vm(name)
            if vm is None or suspect(vm, record.event_id, now) or not vm.vm_id:
                continue
            vm_id, shown = vm.vm_id, vm.name
        # Its identity row: Azure's address and the keys to sign with (anchor.relay_of).
        try:
            identity = registry.get(vm_id) if registry is not None else None
        except ValueError:  # not a vmId: no row can hold it
            identity = None
        if identity is None or suspect(identity, record.event_id, now):
            continue  # flagged: its anchor's liveness row is not worth a read
        found = relay_of(identity, port, liveness, pipeline.clock, fresh)
        if found is None:
            continue
        reported = True  # its own reporter row lists the event
        if vm is not None:
            heard = vm.last_seen
            if heard is None or now - heard > fresh:  # only then the liveness read
                heard = liveness.last_heard(
                    vm.vm_id, heard, verify, silent_after=fresh, now=pipeline.clock.now()
                )
            if heard is None or now - heard > fresh:
                continue
            wanted = record.event_id.casefold()
            reported = any(e.casefold() == wanted for e in vm.event_ids)
        chosen.append(Asked(shown, reported, found[0]))
    return chosen


def _lately(seen: datetime | None, now: datetime, fresh: timedelta) -> bool:
    return seen is not None and now - seen <= fresh


def _try_relays(
    record: EventRecord,
    relays: list[Asked],
    session: requests.Session,
    clock: Clock,
    stop: datetime,
    deadline: datetime,
    by: str,
    unheard: bool,
    lanes: RelayLanes | None = None,
) -> Phase:
    """Round-robin over the relays with backoff between rounds; `unheard`: some named VMs
    have no usable relay yet, so "all refused" is not final while time remains.
    `deadline`: when relays are given up (NotBefore less the margin, or ARM's turn).
    `lanes`: each VM's share of this host's workers (functions.pipeline.lanes): a relay
    busy with another approval, or silent lately, is not asked; when no relay was asked in
    a round, this attempt ends at once (`later`) instead of holding its worker."""
    attempts: list[Attempt] = []
    refused: set[str] = set()
    delay = BACKOFF_START_SECONDS
    me = object()  # this attempt, in the lanes: its own retries are never refused
    while True:
        asked = held = False
        for relay in relays:
            name = relay.name
            if name in refused:
                continue
            remaining = (stop - clock.now()).total_seconds()
            if remaining <= 0:
                break
            expect = expect_for(record, name)  # what its relay must see in its own IMDS
            busy = lanes.enter(name, me, clock.now()) if lanes is not None else None
            if busy is not None:
                held = True
                attempts.append(
                    Attempt(at=clock.now(), vm=name, outcome=f"not asked: {busy}", by=by)
                )
                continue
            verdict, status, text = "retry", None, "error: the exchange raised"
            try:
                verdict, status, text = post_start(
                    relay.target,
                    record.event_id,
                    session,
                    remaining,
                    reported=relay.reported,
                    expect=expect,
                )
            finally:
                if lanes is not None:  # no HTTP answer in a fair time: silent lately
                    silent = text.startswith("error:") and remaining >= 2 * lanes.patience
                    lanes.leave(name, me, clock.now(), not silent, text)
            asked = True
            attempts.append(Attempt(at=clock.now(), vm=name, outcome=text, by=by))
            if verdict == "differs":
                return Phase(outcome="vetoed", detail=f"{name}'s relay: {text}", attempts=attempts)
            if verdict == "approved":
                return Phase(
                    outcome="approved",
                    via=name,
                    detail=text,
                    attempts=attempts,
                    status=status,
                )
            if verdict == "refused":
                refused.add(name)
        if held and not asked:
            # Every relay left is another approval's or silent lately: its turn comes
            # when the event is due again, and this worker goes back to the queue now.
            return Phase(
                outcome="later",
                detail="relays not asked now: " + _last_texts(attempts),
                attempts=attempts,
            )
        if all(r.name in refused for r in relays):
            # Named VMs whose relays are not known yet may still approve: keep it pending.
            waiting = unheard and clock.now() < deadline
            return Phase(
                outcome="later" if waiting else "exhausted",
                detail="every known named relay refused: " + _last_texts(attempts),
                attempts=attempts,
            )
        now = clock.now()
        if now + timedelta(seconds=delay) >= stop:
            if stop < deadline:
                return Phase(
                    outcome="later",
                    detail="relays unreachable so far: " + _last_texts(attempts),
                    attempts=attempts,
                )
            return Phase(
                outcome="exhausted",
                detail="no relay answered before the approval deadline: " + _last_texts(attempts),
                attempts=attempts,
            )
        clock.sleep(delay)
        delay = min(delay * 2, BACKOFF_MAX_SECONDS)


def _last_texts(attempts: list[Attempt]) -> str:
    seen: dict[str, str] = {}
    for attempt in attempts:
        seen[attempt.vm or "-"] = attempt.outcome
    return "; ".join(f"{vm}: {text}" for vm, text in seen.items())[:1000]
