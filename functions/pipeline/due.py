"""The one decider: everything an event still needs, from its stored row and the time.

The host can die between any two requests and a write can land while its answer is lost;
Service Bus then delivers the message again, to a host with no memory. So no effect may be
reachable only from "the write that made it due" (docs/lifecycle.md). Every entry point
records what it saw (a relay's document, an Event Grid notification, a person's approval,
a drain step's result, a sweep that found relays silent) and then reconciles the event by
its key; `due` is the only place that knows what an event can still need:

    due(row, facts, policy, now, me) -> Due       # pure: no I/O, no clock
    reconcile(key): read -> due -> do each part -> record when it is next due

What is due, from the row (and the few facts reconcile read beside it, `Facts`):
- the start: Azure said Started (Event Grid), or a reporter's own view says Started, no
  reporter's own view still says Scheduled, and every VM the event names reported it (or
  START_GRACE passed since: a named VM whose relay has not reported it by then has none,
  or is silent); at NotBefore any reporter's Started (Azure starts it then anyway). A
  VM's Started decides its own approval and drain, never another's: a set-mate that
  reports a shared event Started first does not stop the victim's approval, drain or a
  person's approval, and no `started` is announced on its word alone;
- the end: every VM that reported it stopped listing it (or went silent) once it had
  started or reached NotBefore, or, for an event only Event Grid reported, its end never
  came within EVENTGRID_END_AFTER_SECONDS of NotBefore;
- a fail-closed decision decided again, once the policy is valid;
- an approval whose answer was lost: its claim is in progress, the attempt was recorded as
  sent (`relay_sent_at`, `arm_sent_at`), and the VM reports the event Started before
  NotBefore (or Azure reports it completed): it is approved, recorded, announced, audited;
- every announcement whose condition holds and that is not done (claimed ones whose claim
  expired, or that `me` holds), in the order a person reads them, `overdue` included: still
  Scheduled after NotBefore, or approved and still Scheduled APPROVED_START_GRACE later;
- the approval, when the decision says approve, the window (if any) opened, NotBefore is
  ahead, and nobody else holds a live claim on it; the capacity slots it needs first;
  never while an announcement a person reads before it (`decided`) is another caller's to
  publish (`unannounced_before`), so no channel gets `approved` before its `decided`;
- the drain of a `drain` decision (run from the row, whatever became of the `decided`
  notification), and for an ended drained event the undrain, before it closes;
- closing: ended, every announcement done, out of the open index;
- `next_at`: when the event must be looked at again if nothing happens to it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from functions.model.envelope import SCHEDULED
from functions.model.event import Transition
from functions.model.policy import Policy, PolicyLoad
from functions.pipeline.redecide import should_redecide
from functions.pipeline.slot_rules import (
    APPROVED_START_GRACE,
    approved_at,
    holds_capacity,
    holds_slot,
    last_unknown,
    needs_capacity,
)
from functions.store import claims
from functions.store.records import EventRecord

# The order announcements are published in when several are due at once.
ORDER = (
    Transition.SCHEDULED,
    Transition.STARTED,
    Transition.POLICY_INVALID,
    Transition.DECIDED,
    Transition.APPROVED,
    Transition.APPROVAL_FAILED,
    Transition.OVERDUE,
    Transition.COMPLETED,
    Transition.CANCELLED,
)
ENDS = (Transition.COMPLETED, Transition.CANCELLED)

# The watchdog's period: a deferred retry is looked at again no sooner than this.
RETRY_AFTER = timedelta(seconds=60)
# An open event is looked at again at least this often, whatever it waits for.
LOOK_AGAIN = timedelta(hours=1)
# How long a VM's Started waits for the other VMs the event names to report it before it
# starts the event for everyone: relays poll IMDS about once a second, so a named VM that
# has not reported a shared event by then has no relay, or a silent one.
START_GRACE = timedelta(seconds=60)
# How long after NotBefore an event still Scheduled is not yet `overdue` (a PagerDuty
# trigger). Microsoft: NotBefore is the "time after which this event can start"; the event
# "is guaranteed to not start before this time", and it "moves to Started after it is
# approved or NotBefore passes" (Learn, "Scheduled Events for Linux VMs": Event properties,
# Event scheduling); no bound is given on how soon after. So an event started on time is
# seen Started only at NotBefore plus Azure's own start, the relay's next poll (once a
# second, as Microsoft recommends) and its document's way here: a chaos run announced one
# `overdue` 0.5 s before Azure started it on time. A minute past NotBefore (the watchdog's
# own period, as START_GRACE) is what an operator reads as late.
NOT_BEFORE_GRACE = timedelta(seconds=60)


@dataclass(frozen=True)
class Facts:
    """What reconcile read beside the event row. None: not read, and no rule that needs it
    is due on this pass (the sweep's reconcile reads them; ingest passes what it knows)."""

    reporting: bool | None = None  # some VM still lists the event
    reported: bool | None = None  # some VM ever listed it (Event Grid is no reporter)
    silent: bool | None = None  # every VM that lists it went silent (and some do)
    # When the last reporter's relay saw the event go (its own clock, bounded by ours).
    left_at: datetime | None = None
    # When the first reporter whose own view says Started saw it (None: none says so).
    started_seen: datetime | None = None
    # Some reporter's own view still says Scheduled (None: not read).
    scheduled: bool | None = None
    # Some VM the event names has never reported it (no reporter row).
    unreported: bool = False


NOTHING_READ = Facts()


@dataclass(frozen=True)
class Due:
    """What one event row still needs (`due`); falsy when nothing."""

    end: str = ""  # "reporters" | "silent" | "unheard": the event ends now, and why
    start: datetime | None = None  # the event started (derived), seen then
    start_at: datetime | None = None  # when a reporter's Started starts it, if nothing changes
    redecide: bool = False
    settle: str = ""  # the path of an approval that reached Azure unrecorded ("relay:vm", "arm")
    publish: tuple[Transition, ...] = ()  # claimed, not done, free for `me`: publish
    announce: tuple[Transition, ...] = ()  # due and never claimed (or released): claim first
    overdue: str = ""  # the `overdue` announcement's detail when it is due
    release: bool = False  # slots held that the row no longer entitles it to
    # Its slots given back now (released, or closing), when it may hold any: a row that
    # never took one needs no slot row read (functions.pipeline.capacity.release_slots).
    give_back: bool = False
    approve: bool = False
    by: str = ""  # who the approval is for when a person asked for it ("manual:<who>")
    capacity: bool = False  # the approval takes its slots first
    drain: bool = False  # the drain workflow (functions.terminate) has work left
    count: bool = False  # Started: counted in its disruption budgets (over if need be)
    undrain: bool = False  # ended, drained: put back what the drain reached
    close: bool = False  # ended, every announcement done: leave the open index
    next_at: datetime | None = None  # when to look again if nothing else happens
    notes: tuple[str, ...] = field(default=())

    def __bool__(self) -> bool:
        return bool(
            self.end
            or self.start
            or self.redecide
            or self.settle
            or self.publish
            or self.announce
            or self.release
            or self.approve
            or self.drain
            or self.count
            or self.undrain
            or self.close
        )


def approvable(record: EventRecord, policy: Policy | None) -> bool:
    """The decision asks for an approval, and the row does not have one yet."""
    decision = record.decision
    if decision is None or decision.action != "approve" or decision.policy_error:
        return False
    if decision.dry_run or (policy is not None and policy.dry_run):
        return False
    if record.ended or record.started:
        return False
    return record.approval in ("", "pending", "in_progress")


def asked(record: EventRecord) -> bool:
    """A person asked to approve it (functions.web.approval) and no attempt of theirs
    since is recorded: approved now, whatever the decision, its window or the slots say
    (an operator's override, audited with their name)."""
    if not record.asked_by or record.asked_at is None:
        return False
    if record.ended or record.started or record.approval == "approved":
        return False
    return not any(
        a.by == record.asked_by and a.at >= record.asked_at for a in record.approval_attempts
    )


def window_of(record: EventRecord) -> datetime | None:
    """When the approval may happen: the row's own time once the approval was set up (a
    retry later sets it), else the decision's maintenance window."""
    if record.approval:
        return record.approve_after
    return record.decision.approve_after if record.decision else None


def conditions(record: EventRecord, now: datetime) -> list[Transition]:
    """The announcements the row's facts call for (claimed or not), in ORDER."""
    if record.ended:
        # Only the end: a decision never announced for an event that is over is not news.
        return [Transition.COMPLETED if record.ended == "completed" else Transition.CANCELLED]
    out = _before_approved(record)
    if record.approval == "approved":
        out.append(Transition.APPROVED)
    elif record.approval == "failed":
        out.append(Transition.APPROVAL_FAILED)
    if overdue_detail(record, now):
        out.append(Transition.OVERDUE)
    return out


def _before_approved(record: EventRecord) -> list[Transition]:
    """The announcements a person reads before `approved` that an open event's row calls
    for (`conditions`' first ones): Scheduled or Started, then its decision."""
    out: list[Transition] = [Transition.STARTED if record.started else Transition.SCHEDULED]
    decision = record.decision
    if decision is not None:
        out.append(Transition.POLICY_INVALID if decision.policy_error else Transition.DECIDED)
    return out


def overdue_detail(record: EventRecord, now: datetime) -> str:
    """Why the event is overdue ("" when it is not): still Scheduled NOT_BEFORE_GRACE after
    NotBefore (from then on), or approved and still Scheduled APPROVED_START_GRACE later."""
    if record.ended or record.started or record.event_status != SCHEDULED:
        return ""
    at = approved_at(record)
    if at is not None and now > at + APPROVED_START_GRACE:
        minutes = int(APPROVED_START_GRACE.total_seconds() // 60)
        return (
            f"approved at {at.isoformat()} via {record.approved_by}, yet still listed as "
            f"Scheduled {minutes} min later: Azure starts an approved event at once, so its "
            "VM's reports are suspect; its capacity slot is given back"
        )
    if record.not_before is not None and now >= record.not_before + NOT_BEFORE_GRACE:
        waited = f": it waited for {record.waiting_for.removeprefix('waiting for ')}"
        return f"still Scheduled after NotBefore {record.not_before.isoformat()}" + (
            waited if record.waiting_for and record.approval == "pending" else ""
        )
    return ""


def settled_path(record: EventRecord) -> str:
    """An approval claim in progress whose call reached Azure (or an approval given up on
    whose last answer never came: `slot_rules.last_unknown`), and Azure went on: the VM
    reports Started before NotBefore, or Azure reports the event completed. The path the
    recorded attempt took ("" when this does not hold): the app's approval did it."""
    unknown = None
    if record.approval in ("pending", "failed"):
        # An attempt given up on whose answer never came (issue 45): the VM then reports
        # Started before NotBefore, so that attempt reached Azure.
        unknown = last_unknown(record)
        if unknown is None:
            return ""
    elif record.approval != "in_progress":
        return ""
    if not (record.started or (record.ended == "completed" and record.ended_by == "azure")):
        return ""
    began = record.started_at or record.ended_at
    if record.not_before is not None and (began is None or began >= record.not_before):
        return ""  # at or after NotBefore Azure starts it on its own
    if unknown is not None:
        return "arm" if unknown.vm == "arm" else f"relay:{unknown.vm}"
    if record.arm_sent_at is not None:
        return "arm"
    if record.relay_sent_at is not None:
        named = record.relay_sent_to or next(iter(record.resources), "")
        return f"relay:{named}" if named else ""
    return ""


def start_at(record: EventRecord, facts: Facts) -> datetime | None:
    """When a reporter's Started starts the event for everyone, if nothing else changes
    (None: not on what the reporters say now). Event Grid's Started is written by its
    notification; a VM's is its own word, so it starts the event for everyone only once no
    reporter's own view still says Scheduled and every VM the event names reported it (or
    START_GRACE after it was seen), or at NotBefore (Azure starts it then). Where Azure
    described the event (Event Grid), only NotBefore lets a VM's word start it."""
    seen = facts.started_seen
    if record.ended or record.started or seen is None:
        return None
    at_not_before = max(record.not_before, seen) if record.not_before is not None else None
    if facts.scheduled or record.arm_resource:
        return at_not_before
    agreed = seen if not facts.unreported else seen + START_GRACE
    return min(agreed, at_not_before) if at_not_before is not None else agreed


def start_due(record: EventRecord, facts: Facts, now: datetime) -> datetime | None:
    """When the event started, derived from the reporters' own views (None: it has not
    for everyone, or the row says so already): `start_at`, once it is here."""
    at = start_at(record, facts)
    return facts.started_seen if at is not None and at <= now else None


def end_due(record: EventRecord, facts: Facts, now: datetime, grid_end_after: timedelta) -> str:
    """Why the event ends now ("" when it does not)."""
    if record.ended:
        return ""
    past = record.started or (record.not_before is not None and now >= record.not_before)
    if facts.reporting is False and facts.reported:
        # Every VM that reported it stopped listing it (past or not: a withdrawn event).
        return "reporters"
    if past and facts.silent and not record.arm_resource:
        return "silent"
    if record.arm_resource and facts.reported is False:
        # Only Event Grid reported it, and its end never came (dead-lettered, a deleted
        # subscription): no relay's silence can end it, so time does.
        since = record.not_before or record.first_seen
        if now - since >= grid_end_after:
            return "unheard"
    return ""


def due(
    record: EventRecord,
    policy: PolicyLoad,
    now: datetime,
    *,
    facts: Facts = NOTHING_READ,
    me: str = "",
    grid_end_after: timedelta = timedelta(hours=1),
    drain_settled: bool | None = None,
) -> Due:
    """Everything `record` still needs (pure). `me`: the holder name of this caller's
    claims (the message or work item it is processing): a claim it holds is its own to act
    on at once. `drain_settled`: the drain workflow has nothing left to do for it (None:
    not read; then a drain is due only by time)."""
    ended = end_due(record, facts, now, grid_end_after)
    if ended:
        return Due(end=ended, next_at=now)
    started = start_due(record, facts, now)
    if started is not None:
        return Due(start=started, next_at=now)
    starting = start_at(record, facts)
    if should_redecide(record, policy, now):
        return Due(redecide=True, next_at=now)
    settle = settled_path(record)
    if settle:
        return Due(settle=settle, next_at=now)
    valid = policy.policy
    wanted = conditions(record, now)
    publish = [
        t
        for t in _ordered(record.announced)
        if claims.is_pending(record.announced.get(t.value))
        and claims.is_free(record.announced.get(t.value), now, me)
    ]
    announce = [t for t in wanted if t.value not in record.announced]
    overdue = overdue_detail(record, now)
    # Slots the row no longer entitles it to, given back now (takers also check each
    # holder's row, so this only keeps the slot rows honest for the pages): an approval
    # that failed, or an approved event that never started.
    release = (
        holds_capacity(record)
        and not holds_slot(record, now)
        and (record.approval == "failed" or Transition.OVERDUE in announce)
    )
    person = asked(record) and not (valid is not None and valid.dry_run)
    # Every reporter's own view says Started (the event may not have started for everyone
    # yet: `start_at`): no VM that reported it needs its approval or its drain.
    moot = facts.started_seen is not None and facts.scheduled is False
    approve = (person or (approvable(record, valid) and not overdue)) and not moot
    if approve and record.not_before is not None and now >= record.not_before:
        approve = False  # NotBefore is here: Azure starts it, an approval adds nothing
    if approve and record.approval == "in_progress":
        approve = claims.is_free(record.approval_claim, now, me)
    if approve and unannounced_before(record, now, me):
        # Another caller is publishing its `decided`: due once that is marked done (its
        # publisher wakes the event then; its claim's expiry is in next_at if it dies).
        approve = False
    window = window_of(record) if approve and not person else None
    if window is not None and window > now:
        approve = False
    decision = record.decision
    drain = (
        not person
        and decision is not None
        and decision.action == "drain"
        and not decision.dry_run
        and not decision.policy_error
        and not record.ended
        and not record.started
        and record.not_before is not None
        and now < record.not_before
        and drain_settled is not True
        and not moot
    )
    count = (
        bool(valid and valid.budgets)
        and record.started
        and not record.ended
        and not record.budget_counted
        and needs_capacity(record)
    )
    unsent = [m for m in record.announced.values() if claims.is_pending(m)]
    close = bool(record.ended) and not unsent and not announce
    undrain = close and decision is not None and decision.action == "drain"
    holds = holds_capacity(record) or record.budget_counted
    return Due(
        publish=tuple(publish),
        announce=tuple(announce),
        overdue=overdue if Transition.OVERDUE in announce else "",
        release=release,
        give_back=(release or close) and holds,
        approve=approve,
        by=record.asked_by if person and approve else "",
        capacity=approve and not person and needs_capacity(record),
        drain=drain,
        count=count,
        undrain=undrain,
        close=close,
        start_at=starting,
        next_at=next_at(record, now, window, approve),
    )


def unannounced_before(
    record: EventRecord,
    now: datetime,
    me: str = "",
    *,
    claimed: bool = False,
    publishing: bool = True,
) -> tuple[Transition, ...]:
    """The announcements a person reads before `approved` (in ORDER: `decided`, ...) that
    the row calls for and that are neither done nor `me`'s to publish first: claimed by
    another caller, live. The approval and its `approved` wait for them: that caller may
    still be publishing, and a channel would read `approved` before `decided` (issue 46).
    One left unclaimed is `me`'s to claim with the approval, in one write; `claimed`: in
    that write, after claiming, where nobody is left to publish it first. `publishing`
    False: `me` publishes none of them (approve_event's own claim: the drain workflow), so
    every one not done waits, a dead holder's too, until a reconcile publishes it. Only
    those are looked at (`_before_approved`), not the row's later conditions: whether it
    is overdue is no question here (paths from reconcile_key, issue 46)."""
    if record.ended:
        return ()  # an event that is over calls for its end alone, announced after
    waiting = []
    for transition in _before_approved(record):
        mark = record.announced.get(transition.value)
        if mark == claims.DONE:
            continue
        if publishing and mark and claims.is_free(mark, now, me):
            continue  # `me`'s own claim, or one whose holder died: published by `me` first
        if mark or claimed or not publishing:
            waiting.append(transition)
    return tuple(waiting)


def _ordered(announced: dict[str, str]) -> list[Transition]:
    known = [t for t in ORDER if t.value in announced]
    order = {t.value for t in ORDER}
    return known + [
        Transition(key)
        for key in announced
        if key not in order and key in Transition._value2member_map_
    ]


def retry_after(record: EventRecord, now: datetime) -> timedelta:
    """How soon an approval still pending is tried again."""
    if record.not_before is None or record.not_before <= now:
        return RETRY_AFTER
    return max(min(RETRY_AFTER, (record.not_before - now) / 4), timedelta(seconds=1))


def next_at(
    record: EventRecord, now: datetime, window: datetime | None, approving: bool
) -> datetime | None:
    """When the event must be looked at again if nothing happens to it: the soonest of
    its approval window, a claim's expiry, NotBefore and NOT_BEFORE_GRACE after it
    (overdue), the approved event's start grace, Event Grid's end, and a retry of a pending
    approval. None: only an observation (a document, a notification, a silence) can change
    what is due."""
    times: list[datetime] = []
    for mark in [*record.announced.values(), record.approval_claim]:
        until = claims.expires(mark) if claims.is_pending(mark) else None
        if until is not None:
            times.append(until)
    if record.ended:
        return now if times else None
    if window is not None and window > now:
        times.append(window)
    if approving or (record.approval == "pending" and record.approve_after is None):
        # Due now (its reconcile is trying it, or a try left it for later), or waiting for
        # capacity or a relay: looked at again at the next sweep, sooner as NotBefore
        # nears (a quarter of the time left, so it is tried several times before it).
        times.append(now + retry_after(record, now))
    if not record.started and record.not_before is not None:
        times += [t for t in (record.not_before, record.not_before + NOT_BEFORE_GRACE) if t > now]
    at = approved_at(record)
    if at is not None and not record.started:
        times.append(at + APPROVED_START_GRACE)
    if record.arm_resource and not record.past_reporters:
        times.append((record.not_before or record.first_seen) + timedelta(minutes=1))
    decision = record.decision
    if decision is not None and decision.action == "drain" and not record.started:
        times.append(now + RETRY_AFTER)
    if decision is not None and decision.policy_error and not record.started:
        # Failed closed: decided again as soon as a valid policy is here, which no row
        # can tell; looked at every sweep until then (only during a policy outage).
        times.append(now + RETRY_AFTER)
    later = [t for t in times if t > now]
    if any(t <= now for t in times):
        return now + timedelta(seconds=1)
    return min([*later, now + LOOK_AGAIN])
