"""Posts that outlive a channel outage (issue 40): a post its channel could not deliver within
its Service Bus deliveries is kept, and sent once the channel is back, while it still
matters, saying how late it is.

Service Bus gives a channel's message `maxDeliveryCount` deliveries (10: about five minutes
of one receiver's retries, functions.notify.delivery.RetryPolicy), then dead-letters it, and
nothing ever posts a dead letter. So on its last delivery, a post that failed only because
the receiver could not be reached (RetryableDeliveryError) is written to the deliveries
table instead (functions.store.deliveries: `kept`) and the message completed; a timer
(functions.triggers.notify `notify_kept`) sends each channel's kept posts, oldest first,
once the channel answers again.

Still worth sending (`FRESH_FOR`, from when it happened): what is about to happen or needed
a hand before NotBefore (scheduled, decided, drain started, approved, a failed approval or
drain, overdue) is stale within the hour: an `approved` a day later tells nobody anything.
What happened (started, completed, cancelled, undrained) and what a person must still act on
or know (undrain_failed, a silent relay, an invalid policy or configuration, and their
ends) is worth a line for a day: a `started` after the end is still worth a line. A post
past it is dropped and its delivery row says why; every card sent late says how late.

PagerDuty: a trigger and its resolve are one incident, so their order is kept. A resolve
for an incident whose trigger is kept waits behind it (functions.notify.dispatch), and a
kept trigger that a later kept resolve closes is dropped with it: nobody is paged for what
is already over.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from pydantic import ValidationError

from functions.model.event import Notification, Transition
from functions.notify import pagerduty
from functions.notify.delivery import PermanentDeliveryError, RetryableDeliveryError
from functions.store.deliveries import KEPT_BODY_LIMIT, DeliveryLedger, DeliveryRecord, KeptPost
from functions.store.records import clip

log = logging.getLogger(__name__)

# The channel subscriptions' maxDeliveryCount (infra/main.bicep and
# infra/modules/servicebus.bicep; local.subscription plays the same; a test ties the three):
# a post still failing on this delivery is kept instead of dead-lettered.
MAX_DELIVERY_COUNT = 10

HOUR, DAY = timedelta(hours=1), timedelta(days=1)
FRESH_FOR: dict[Transition, timedelta] = {
    Transition.SCHEDULED: HOUR,
    Transition.DECIDED: HOUR,
    Transition.DRAIN_STARTED: HOUR,
    Transition.APPROVED: HOUR,
    Transition.APPROVAL_FAILED: HOUR,
    Transition.DRAIN_FAILED: HOUR,
    Transition.OVERDUE: HOUR,
    Transition.STARTED: DAY,
    Transition.COMPLETED: DAY,
    Transition.CANCELLED: DAY,
    Transition.UNDRAINED: DAY,
    Transition.UNDRAIN_FAILED: DAY,
    Transition.RELAY_SILENT: DAY,
    Transition.RELAY_RECOVERED: DAY,
    Transition.POLICY_INVALID: DAY,
    Transition.POLICY_VALID: DAY,
    Transition.CONFIG_INVALID: DAY,
    Transition.CONFIG_VALID: DAY,
}
# A PagerDuty incident whose trigger or resolve is kept: its mark (a resolve waits behind).
KEPT_MARK = "pagerduty-kept:"


def fresh_for(transition: Transition) -> timedelta:
    return FRESH_FOR.get(transition, HOUR)


def still_matters(note: Notification, now: datetime) -> bool:
    """Whether a kept post is still worth sending at `now` (FRESH_FOR)."""
    return now - note.occurred_at <= fresh_for(note.transition)


def duration_words(span: timedelta) -> str:
    """`45 s`, `12 min`, `2 h 5 min`, `1 d 3 h`."""
    seconds = max(int(span.total_seconds()), 0)
    days, rest = divmod(seconds, 86_400)
    hours, rest = divmod(rest, 3_600)
    minutes, seconds = divmod(rest, 60)
    if days:
        return f"{days} d {hours} h" if hours else f"{days} d"
    if hours:
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    if minutes:
        return f"{minutes} min"
    return f"{seconds} s"


def late_words(note: Notification, now: datetime, reason: str) -> str:
    """What a late card says: how long after it happened, and why."""
    why = f": the channel could not be reached ({reason})" if reason else ""
    return f"sent {duration_words(now - note.occurred_at)} after it happened{why}"


# What a post cut to be kept lists of each list of names (Resources, ReportedBy, the sets,
# a silent group's VMs): the rest are counted, never named ("and 898 more not listed").
KEPT_NAMES = 100
KEPT_NAMES_FEWER = (KEPT_NAMES, 20, 0)
KEPT_TEXT = 200  # each text's length in the last resort, when no names are left to cut


def body_units(body: str) -> int:
    """The body's length as Table storage measures a string property: UTF-16 code units."""
    return len(body.encode("utf-16-le", "surrogatepass")) // 2


def keepable(note: Notification) -> Notification:
    """`note` as it can be kept (its JSON within KEPT_BODY_LIMIT): itself when it fits,
    else with at most KEPT_NAMES names a list, then 20, then none, the event saying how
    many VMs it no longer lists (`unlisted`), and last each text cut to KEPT_TEXT. A
    set-mate adding 998 names to a victim's Resources made each of the victim's posts too
    large to keep: dead-lettered during a channel outage instead of sent late."""
    for names in (None, *KEPT_NAMES_FEWER):
        cut = note if names is None else _cut(note, names, None)
        if body_units(cut.to_json()) <= KEPT_BODY_LIMIT:
            return cut
    return _cut(note, 0, KEPT_TEXT)  # a few texts of KEPT_TEXT: well within the limit


def _cut(note: Notification, names: int, text: int | None) -> Notification:
    def short(value: str | None) -> str | None:
        return value if value is None or text is None else clip(value, text)

    update: dict[str, object] = {"silent_vms": note.silent_vms[:names]}
    if text is not None:
        update.update(
            detail=short(note.detail),
            waiting=short(note.waiting),
            silent_label=short(note.silent_label),
            occurrence=short(note.occurrence),
            vm=short(note.vm),
        )
        if note.decision is not None:
            reason, error = short(note.decision.reason), short(note.decision.policy_error)
            update["decision"] = note.decision.model_copy(
                update={"reason": reason, "rule": short(note.decision.rule), "policy_error": error}
            )
    event = note.event
    if event is not None:
        named = event.resources or event.reported_by
        update["event"] = event.model_copy(
            update={
                "resources": event.resources[:names],
                "reported_by": event.reported_by[:names],
                "scale_sets": event.scale_sets[:names],
                "availability_sets": event.availability_sets[:names],
                "unlisted": event.unlisted + len(named) - len(named[:names]),
                "event_id": short(event.event_id),
                "event_type": short(event.event_type),
                "event_source": short(event.event_source),
                "description": short(event.description),
            }
        )
    return note.model_copy(update=update)


def kept_post(channel: str, note: Notification, reason: str, now: datetime) -> KeptPost:
    key = pagerduty.dedup_key(note) if channel == "pagerduty" else ""
    return KeptPost(
        channel=channel,
        message_id=note.message_id(),
        occurred_at=note.occurred_at,
        kept_at=now,
        body=keepable(note).to_json(),
        reason=reason,
        key=key,
        ends=note.transition in pagerduty.RESOLVING,
    )


def waits_behind(channel: str, note: Notification, ledger: DeliveryLedger) -> bool:
    """A PagerDuty resolve for an incident whose trigger is kept: kept behind it, so the
    two keep their order (sent now, it would go before the trigger it resolves)."""
    if channel != "pagerduty" or pagerduty.action_for(note) != "resolve":
        return False
    return ledger.marked(KEPT_MARK + pagerduty.dedup_key(note))


def keep(ledger: DeliveryLedger, post: KeptPost) -> bool:
    """Write the kept post (False: too large to keep; the message then dead-letters)."""
    if not ledger.keep(post):
        return False
    if post.key:
        ledger.mark(KEPT_MARK + post.key)
    log.warning(
        "%s: %s kept after its last delivery (%s); sent when the channel is back",
        post.channel,
        post.message_id,
        post.reason,
    )
    return True


@dataclass
class ResendReport:
    """One pass over a channel's kept posts."""

    sent: list[str] = field(default_factory=list)
    dropped: list[tuple[str, str]] = field(default_factory=list)  # (MessageId, why)
    waiting: int = 0  # still kept: the channel is still down
    # What each post sent or dropped said, as read in this pass (the demo's kept worker
    # records them: a post kept after its own read of the store would be unknown to it).
    notes: dict[str, Notification] = field(default_factory=dict)


# send(note) -> True when posted; raises RetryableDeliveryError (still down) or
# PermanentDeliveryError (refused for good).
Send = Callable[[Notification], bool]


def resend(
    channel: str, ledger: DeliveryLedger, send: Send, clock: Callable[[], datetime]
) -> ResendReport:
    """Send the channel's kept posts, oldest first, each saying how late it is; drop those
    no longer worth sending; stop at the first that still cannot be delivered."""
    report = ResendReport()
    posts = ledger.kept(channel)
    superseded: set[str] = set()  # PagerDuty keys whose kept trigger a kept resolve closed
    for index, post in enumerate(posts):
        now = clock()
        try:
            note = Notification.from_json(post.body)
        except ValidationError:
            _settle(ledger, post, "rejected", "kept, but its body no longer reads", report, now)
            continue
        report.notes[post.message_id] = note
        why = _not_worth_sending(channel, note, post, posts[index + 1 :], superseded, now)
        if why is not None:
            _settle(ledger, post, "rejected", why, report, now)
            continue
        late = note.model_copy(update={"late": late_words(note, now, post.reason)})
        try:
            send(late)
        except RetryableDeliveryError as exc:
            report.waiting = len(posts) - index
            log.info("%s: still down (%s); %d post(s) kept", channel, exc.reason, report.waiting)
            break
        except PermanentDeliveryError as exc:
            _settle(ledger, post, "rejected", f"sent late, refused: {exc.reason}", report, now)
            continue
        _settle(ledger, post, "posted", late.late, report, now)
    return report


def _not_worth_sending(
    channel: str,
    note: Notification,
    post: KeptPost,
    later: list[KeptPost],
    superseded: set[str],
    now: datetime,
) -> str | None:
    if not still_matters(note, now):
        return (
            f"not sent: {duration_words(now - note.occurred_at)} after it happened, past what "
            f"a '{note.transition.value}' is worth ({duration_words(fresh_for(note.transition))})"
        )
    if channel != "pagerduty" or not post.key:
        return None
    action = pagerduty.action_for(note)
    if action == "trigger" and any(p.key == post.key and _action_of(p) == "resolve" for p in later):
        superseded.add(post.key)
        return "not sent: resolved before PagerDuty was back (no page for what is over)"
    if action == "resolve" and post.key in superseded:
        return "not sent: its trigger was never sent, so nothing to resolve"
    return None


def _action_of(post: KeptPost) -> str | None:
    try:
        return pagerduty.action_for(Notification.from_json(post.body))
    except ValidationError:
        return None


def _settle(
    ledger: DeliveryLedger,
    post: KeptPost,
    status: str,
    detail: str,
    report: ResendReport,
    now: datetime,
) -> None:
    """The delivery row says what became of the kept post; then it is no longer kept."""
    record = ledger.get(post.message_id, post.channel)
    if record is None:
        record = DeliveryRecord(
            message_id=post.message_id,
            channel=post.channel,
            status="kept",
            owner="kept",
            claimed_at=post.kept_at,
            lease_until=post.kept_at,
        )
        ledger.insert(record)
    done = record.model_copy(update={"status": status, "finished_at": now, "detail": detail[:1000]})
    if not ledger.replace(done):
        log.warning("%s: the row of %s changed meanwhile", post.channel, post.message_id)
    ledger.drop_kept(post)
    if post.key and not any(p.key == post.key for p in ledger.kept(post.channel)):
        ledger.unmark(KEPT_MARK + post.key)
    if status == "posted":
        report.sent.append(post.message_id)
        log.info("%s: %s %s", post.channel, post.message_id, detail)
    else:
        report.dropped.append((post.message_id, detail))
        log.warning("%s: kept %s dropped: %s", post.channel, post.message_id, detail)
