"""The plain function each channel's Service Bus handler calls: parse, route, send once.

Failures are sorted into what Service Bus should do with the message:
- returns normally: delivered, nothing to send, already delivered by an earlier delivery
  of the same announcement, or failed permanently and recorded (the message is completed);
- RetryableDeliveryError (or a Table storage error): redeliver, after this invocation's
  own short retries; after maxDeliveryCount Service Bus dead-letters it.

With a `DeliveryLedger` (the Azure handlers always pass one) each announcement is posted
at most once per channel, barring a crash between the post and its record (see
functions.store.deliveries), and a permanent failure (the receiver's 4xx other than
408/425/429, a message that is not a notification, a half-configured channel) is recorded
in the deliveries table with the reason and completed at once: the pinned
azure-functions ServiceBusMessage binding cannot dead-letter (settling needs the preview
SDK-type binding package), and redelivering cannot help. Without a ledger a permanent
failure raises PermanentDeliveryError (the old behaviour: dead-lettered after
maxDeliveryCount).

A post that still cannot be delivered on the message's last delivery (`delivery_count` at
the subscription's maxDeliveryCount) is kept in the ledger instead of dead-lettered, and
`resend_kept` sends it once the channel is back, while it still matters
(functions.notify.kept).

A claim belongs to one delivery of the message (`owner`, from `claimant()`), not to one
call: a Table write whose answer was lost to a reset connection may have landed, and the
SDK's retry of the insert, or the delivery's next try through an outage
(functions.triggers.later.hold_through_outage), then finds the delivery's own claim. It is
taken back at once, not waited out as another poster's for the claim's whole lease.
"""

from __future__ import annotations

import logging
import math
import uuid
from datetime import datetime, timedelta

from pydantic import ValidationError

from functions.model.event import Notification
from functions.notify import kept, pagerduty, slack, teams, webhook
from functions.notify.delivery import (
    DeliveryError,
    Marks,
    PermanentDeliveryError,
    RetryableDeliveryError,
    Transport,
)
from functions.notify.settings import ChannelSettings
from functions.store.deliveries import DeliveryLedger, DeliveryRecord, KeptPost

log = logging.getLogger(__name__)

CHANNELS = ("teams", "pagerduty", "webhook", "slack")
CLAIM_SLACK_SECONDS = 30.0  # on top of RetryPolicy.longest_seconds: one Table write's worth
CLAIM_POLL_SECONDS = 2.0  # how often a redelivery re-reads a claim another invocation holds
FINISH_ATTEMPTS = 3  # writes of `posted` before giving up (the post itself went through)


class InvalidNotification(PermanentDeliveryError):
    """The message on the topic is not a Notification: no channel can ever send it."""


_off_logged: set[str] = set()


def parse(channel: str, body: bytes | str) -> Notification:
    try:
        return Notification.from_json(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first.get("loc", ())) or "body"
        raise InvalidNotification(
            channel, f"not a notification ({exc.error_count()} errors; {where}: {first['msg']})"
        ) from None


def wants(channel: str, note: Notification, marks: Marks | None = None) -> bool:
    """Whether this channel posts anything for this transition (no claim otherwise); with
    `marks`, PagerDuty resolves only a key it paged."""
    if note.decision is not None and channel not in note.decision.channels:
        return False
    if channel == "teams":
        return teams.wants(note)
    if channel == "slack":
        return slack.wants(note)
    if channel == "pagerduty":
        if marks is not None and pagerduty.never_paged(note, marks):
            return False
        return pagerduty.action_for(note) is not None
    return True


def deliver(
    channel: str,
    body: bytes | str,
    *,
    settings: ChannelSettings,
    transport: Transport,
    ledger: DeliveryLedger | None = None,
    message_id: str = "",
    delivery_count: int | None = None,
    owner: str | None = None,
) -> bool:
    """Send one topic message on one channel. True when this call posted something.

    `message_id`: the Service Bus MessageId, naming the record of a body that is not a
    notification (a notification is recorded under its own id). `delivery_count`: Service
    Bus's DeliveryCount of this delivery; on the last one (kept.MAX_DELIVERY_COUNT) a post
    the receiver could not take is kept for later instead of dead-lettered. `owner`: this
    delivery's `claimant()`, the same for every try of it (a fresh one if not given)."""
    off = settings.off_reason(channel)
    if off is not None:
        if settings.misconfigured(channel) and ledger is not None:
            # Half-configured is a mistake, not "off": say so for every message it drops.
            record_rejection(ledger, channel, _id_of(body, message_id), off, transport.clock())
        if channel not in _off_logged:
            _off_logged.add(channel)
            log.log(
                logging.ERROR if settings.misconfigured(channel) else logging.INFO,
                "%s: channel off (%s)",
                channel,
                off,
            )
        return False
    try:
        note = parse(channel, body)
    except InvalidNotification as exc:
        log.error("%s: message %s %s", channel, message_id or "?", exc.reason)
        if ledger is None:
            raise
        record_rejection(ledger, channel, message_id or "unnamed", exc.reason, transport.clock())
        return False
    marks = ledger if ledger is not None else transport.marks
    if not wants(channel, note, marks):
        log.info("%s: nothing to send for %s", channel, note.message_id())
        return False
    if ledger is None:
        return _send_logged(channel, note, settings, transport, marks)
    claim = _claim(ledger, channel, note.message_id(), transport, owner or claimant())
    if claim is None:
        return False
    if kept.waits_behind(channel, note, ledger):
        why = "behind an earlier post of this incident, kept while the channel was down"
        if kept.keep(ledger, kept.kept_post(channel, note, why, transport.clock())):
            _finish(ledger, claim, "kept", why, transport)
            return False
    try:
        sent = _send_logged(channel, note, settings, transport, marks)
    except PermanentDeliveryError as exc:
        _finish(ledger, claim, "rejected", exc.reason, transport)
        return False
    except RetryableDeliveryError as exc:
        last = delivery_count is not None and delivery_count >= kept.MAX_DELIVERY_COUNT
        post = kept.kept_post(channel, note, exc.reason, transport.clock())
        if last and _keep_or_release(ledger, claim, post, transport):
            return False
        if not last:
            _release(ledger, claim)
        raise
    except BaseException:
        _release(ledger, claim)
        raise
    _finish(ledger, claim, "posted", "", transport)
    return sent


def _keep_or_release(
    ledger: DeliveryLedger, claim: DeliveryRecord, post: KeptPost, transport: Transport
) -> bool:
    """Keep the post (then the message is completed); False, with the claim released, when
    it cannot be kept (the message then dead-letters as before, and its alert fires)."""
    try:
        if kept.keep(ledger, post):
            _finish(ledger, claim, "kept", post.reason, transport)
            return True
        log.error("%s: %s cannot be kept (too large); dead-lettered", post.channel, post.message_id)
    except Exception:
        log.exception("%s: %s could not be kept", post.channel, post.message_id)
    _release(ledger, claim)
    return False


def _release(ledger: DeliveryLedger, claim: DeliveryRecord) -> None:
    try:
        ledger.release(claim)
    except Exception:  # the claim goes stale after its lease instead
        log.exception("%s: could not release the claim on %s", claim.channel, claim.message_id)


def resend_kept(
    channel: str,
    *,
    settings: ChannelSettings,
    transport: Transport,
    ledger: DeliveryLedger,
) -> kept.ResendReport:
    """Send `channel`'s kept posts now that it may be back (the `notify_kept` timer)."""
    if settings.off_reason(channel) is not None:
        return kept.ResendReport()
    marks = ledger

    def send(note: Notification) -> bool:
        return _send_logged(channel, note, settings, transport, marks)

    return kept.resend(channel, ledger, send, transport.clock)


def _send_logged(
    channel: str,
    note: Notification,
    settings: ChannelSettings,
    transport: Transport,
    marks: Marks,
) -> bool:
    try:
        return _send(channel, note, settings, transport, marks)
    except DeliveryError as exc:
        if not exc.logged:  # each attempt's failure is logged once, where it happened
            level = logging.ERROR if isinstance(exc, PermanentDeliveryError) else logging.WARNING
            log.log(level, "%s: %s not delivered: %s", channel, note.message_id(), exc.reason)
        raise


def _id_of(body: bytes | str, message_id: str) -> str:
    try:
        return Notification.from_json(body).message_id()
    except ValidationError:
        return message_id or "unnamed"


def record_rejection(
    ledger: DeliveryLedger, channel: str, message_id: str, reason: str, now: datetime
) -> None:
    """Record a message `channel` can never handle, with the reason (then complete it)."""
    record = DeliveryRecord(
        message_id=message_id,
        channel=channel,
        status="rejected",
        owner="-",
        claimed_at=now,
        lease_until=now,
        finished_at=now,
        detail=reason,
    )
    if not ledger.insert(record):
        log.info("%s: %s already recorded", channel, message_id)


def claimant() -> str:
    """A delivery's name on its claims: one per delivery of a message, kept by its tries."""
    return uuid.uuid4().hex[:12]


def _claim(
    ledger: DeliveryLedger, channel: str, message_id: str, transport: Transport, owner: str
) -> DeliveryRecord | None:
    """Our claim on (announcement, channel), or None when it is already posted or rejected.

    A claim another invocation holds is waited for (a redelivery after a lost lock comes
    while the first may still be posting); once its lease passed, it is taken over. A claim
    of our own (`owner`: an earlier try of this delivery whose insert landed, its answer
    lost) is ours at once, its lease renewed: nobody else is posting it."""
    longest = (transport.policy.longest_seconds() + CLAIM_SLACK_SECONDS) * transport.lease_scale
    polls = math.ceil(longest / CLAIM_POLL_SECONDS) + 2
    for _ in range(polls):
        now = transport.clock()
        lease_until = now + timedelta(seconds=longest)
        record = DeliveryRecord(
            message_id=message_id,
            channel=channel,
            status="claimed",
            owner=owner,
            claimed_at=now,
            lease_until=lease_until,
        )
        if ledger.insert(record):
            return record
        current = ledger.get(message_id, channel)
        if current is None:
            continue  # released meanwhile: claim again
        if current.final:
            log.info("%s: %s already %s; not posting again", channel, message_id, current.status)
            return None
        if current.owner == owner:
            renewed = current.model_copy(update={"claimed_at": now, "lease_until": lease_until})
            if ledger.replace(renewed):
                log.info(
                    "%s: %s was claimed by this delivery already; posting", channel, message_id
                )
                return renewed
            continue  # changed meanwhile (taken over after its lease): read it again
        if current.lease_until > now:
            log.info("%s: %s is being posted elsewhere; waiting", channel, message_id)
            wait = min(CLAIM_POLL_SECONDS, (current.lease_until - now).total_seconds())
            transport.sleep(max(wait, 0.05))
            continue
        taken = ledger.take_over(current, owner, now, lease_until)
        if taken is not None:
            log.warning(
                "%s: %s was claimed at %s by a poster that did not finish; posting again "
                "(at least once: it may have been posted)",
                channel,
                message_id,
                current.claimed_at.isoformat(),
            )
            return taken
    raise RetryableDeliveryError(channel, f"{message_id} stayed claimed by another invocation")


def _finish(
    ledger: DeliveryLedger,
    claim: DeliveryRecord,
    status: str,
    detail: str,
    transport: Transport,
) -> None:
    """Record the outcome. The post already happened (or was refused for good), so a Table
    failure here must not redeliver the message: retried a few times, then logged."""
    done = claim.model_copy(
        update={"status": status, "finished_at": transport.clock(), "detail": detail}
    )
    for attempt in range(1, FINISH_ATTEMPTS + 1):
        try:
            if not ledger.replace(done):
                log.warning(
                    "%s: the claim on %s was taken over while posting",
                    claim.channel,
                    claim.message_id,
                )
            return
        except Exception:
            if attempt == FINISH_ATTEMPTS:
                log.exception(
                    "%s: %s %s, but recording it failed; a redelivery after the claim's "
                    "lease would post again",
                    claim.channel,
                    claim.message_id,
                    status,
                )
                return
            transport.sleep(0.5 * attempt)


def _send(
    channel: str,
    note: Notification,
    settings: ChannelSettings,
    transport: Transport,
    marks: Marks,
) -> bool:
    if channel == "teams":
        assert settings.teams_webhook_url is not None
        return teams.send(
            note, url=settings.teams_webhook_url.get_secret_value(), transport=transport
        )
    if channel == "slack":
        assert settings.slack_webhook_url is not None
        return slack.send(
            note, url=settings.slack_webhook_url.get_secret_value(), transport=transport
        )
    if channel == "pagerduty":
        assert settings.pagerduty_routing_key is not None
        return pagerduty.send(
            note,
            routing_key=settings.pagerduty_routing_key.get_secret_value(),
            url=settings.pagerduty_events_url,
            transport=transport,
            marks=marks,
        )
    assert settings.webhook_url is not None and settings.webhook_secret is not None
    return webhook.send(
        note,
        url=settings.webhook_url.get_secret_value(),
        secret=settings.webhook_secrets(),
        transport=transport,
    )
